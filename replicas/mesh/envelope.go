package mesh

import (
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/index"
)

// Topics of the replica mesh, Dynamo's names: the first frame of every
// two-frame message.
const (
	TopicSlotTracker     = "dynamo.slot-tracker.v1"
	TopicSessionAffinity = "dynamo.session-affinity.v1"
)

// ErrMalformed wraps every decoding failure: the message is dropped and counted.
var ErrMalformed = errors.New("malformed replica payload")

// The wire shape is Dynamo's, as rmp_serde::to_vec_named writes it (read in
// 3Hren/msgpack-rust rmp-serde/src/encode.rs and ai-dynamo/dynamo
// lib/kv-router/src/services/common/replica_sync.rs, protocols.rs):
//
//   - structs are maps keyed by field name, fields in declaration order;
//   - an externally tagged enum's unit variant is its name as a string
//     ("Free", "MarkPrefillCompleted"), a struct variant a one-entry map
//     {"AddRequest": {…}};
//   - Option::None is nil; integers take the smallest encoding (rmp's
//     write_uint, which msgp.AppendUint64 matches byte for byte);
//   - the session binding flattens its partition into the top-level map
//     (#[serde(flatten)]), so its model_name and routing_group come first.
//
// Decoding follows serde's derive rules rather than this exact layout: fields in
// any order, unknown fields ignored, missing Option fields None,
// track_prefill_tokens defaulting to true, a missing required field an error
// (which is how a legacy tenant_id envelope is rejected: it has no
// routing_group). Unit variants are also accepted as {"Free": nil}.

// Variant names of ActiveSequenceEventData.
const (
	variantAdd     = "AddRequest"
	variantFree    = "Free"
	variantPrefill = "MarkPrefillCompleted"
)

// AppendBooking appends the dynamo.slot-tracker.v1 payload of ev.
func AppendBooking(b []byte, ev *selection.BookingEvent) []byte {
	b = msgp.AppendMapHeader(b, 4)
	b = msgp.AppendString(b, "model_name")
	b = msgp.AppendString(b, ev.Partition.Model)
	b = msgp.AppendString(b, "routing_group")
	b = msgp.AppendString(b, ev.Partition.RoutingGroup)
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendUint64(b, uint64(ev.BlockSize))
	b = msgp.AppendString(b, "event")

	b = msgp.AppendMapHeader(b, 5)
	b = msgp.AppendString(b, "request_id")
	b = msgp.AppendString(b, ev.RequestID)
	b = msgp.AppendString(b, "worker")
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "worker_id")
	b = msgp.AppendUint64(b, ev.Worker.WorkerID)
	b = msgp.AppendString(b, "dp_rank")
	b = msgp.AppendUint64(b, uint64(ev.Worker.DPRank))
	b = msgp.AppendString(b, "data")
	switch ev.Kind {
	case selection.BookingAdded:
		b = msgp.AppendMapHeader(b, 1)
		b = msgp.AppendString(b, variantAdd)
		b = msgp.AppendMapHeader(b, 4)
		b = msgp.AppendString(b, "token_sequence")
		if ev.TrackingHashes == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendArrayHeader(b, uint32(len(ev.TrackingHashes)))
			for _, h := range ev.TrackingHashes {
				b = msgp.AppendUint64(b, h)
			}
		}
		b = msgp.AppendString(b, "track_prefill_tokens")
		b = msgp.AppendBool(b, ev.TrackPrefill)
		b = msgp.AppendString(b, "expected_output_tokens")
		if ev.ExpectedOutputTokens == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendUint64(b, uint64(*ev.ExpectedOutputTokens))
		}
		b = msgp.AppendString(b, "prefill_load_hint")
		if ev.PrefillTokens == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendMapHeader(b, 2)
			b = msgp.AppendString(b, "initial_effective_prefill_tokens")
			b = msgp.AppendUint64(b, *ev.PrefillTokens)
			b = msgp.AppendString(b, "expected_prefill_duration")
			b = msgp.AppendNil(b)
		}
	case selection.BookingPrefillCompleted:
		b = msgp.AppendString(b, variantPrefill)
	default:
		b = msgp.AppendString(b, variantFree)
	}
	b = msgp.AppendString(b, "router_id")
	b = msgp.AppendUint64(b, ev.Origin)
	b = msgp.AppendString(b, "lora_name")
	if ev.LoraName == "" {
		b = msgp.AppendNil(b)
	} else {
		b = msgp.AppendString(b, ev.LoraName)
	}
	return b
}

// AppendBinding appends the dynamo.session-affinity.v1 payload of sb.
func AppendBinding(b []byte, sb *selection.SessionBinding) []byte {
	b = msgp.AppendMapHeader(b, 7)
	b = msgp.AppendString(b, "model_name")
	b = msgp.AppendString(b, sb.Partition.Model)
	b = msgp.AppendString(b, "routing_group")
	b = msgp.AppendString(b, sb.Partition.RoutingGroup)
	b = msgp.AppendString(b, "session_id")
	b = msgp.AppendString(b, sb.SessionID)
	b = msgp.AppendString(b, "worker_id")
	b = msgp.AppendUint64(b, sb.WorkerID)
	b = msgp.AppendString(b, "dp_rank")
	if sb.DPRank == nil {
		b = msgp.AppendNil(b)
	} else {
		b = msgp.AppendUint64(b, uint64(*sb.DPRank))
	}
	b = msgp.AppendString(b, "sequence")
	b = msgp.AppendUint64(b, sb.Sequence)
	b = msgp.AppendString(b, "writer_id")
	b = msgp.AppendUint64(b, sb.WriterID)
	return b
}

// DecodeBooking parses a dynamo.slot-tracker.v1 payload. The whole payload
// must be one envelope: trailing bytes are an error.
func DecodeBooking(p []byte) (selection.BookingEvent, error) {
	var ev selection.BookingEvent
	var hasModel, hasGroup, hasBlock, hasEvent bool
	rest, err := eachField(p, func(key string, b []byte) ([]byte, error) {
		var err error
		switch key {
		case "model_name":
			ev.Partition.Model, b, err = readString(b, key, &hasModel)
		case "routing_group":
			ev.Partition.RoutingGroup, b, err = readString(b, key, &hasGroup)
		case "block_size":
			ev.BlockSize, b, err = readU32(b, key, &hasBlock)
		case "event":
			if err = once(key, &hasEvent); err == nil {
				b, err = decodeSequenceEvent(b, &ev)
			}
		default:
			b, err = msgp.Skip(b)
		}
		return b, err
	})
	if err == nil {
		err = required(hasModel, "model_name", hasGroup, "routing_group", hasBlock, "block_size", hasEvent, "event")
	}
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	if err != nil {
		return selection.BookingEvent{}, fmt.Errorf("%s: %w: %w", TopicSlotTracker, ErrMalformed, err)
	}
	return ev, nil
}

// decodeSequenceEvent reads ActiveSequenceEvent into ev.
func decodeSequenceEvent(p []byte, ev *selection.BookingEvent) ([]byte, error) {
	var hasID, hasWorker, hasData, hasRouter, hasLora bool
	rest, err := eachField(p, func(key string, b []byte) ([]byte, error) {
		var err error
		switch key {
		case "request_id":
			ev.RequestID, b, err = readString(b, key, &hasID)
		case "worker":
			if err = once(key, &hasWorker); err == nil {
				b, err = decodeWorker(b, &ev.Worker)
			}
		case "data":
			if err = once(key, &hasData); err == nil {
				b, err = decodeData(b, ev)
			}
		case "router_id":
			ev.Origin, b, err = readU64(b, key, &hasRouter)
		case "lora_name":
			if err = once(key, &hasLora); err == nil {
				var s *string
				if s, b, err = readOptString(b, key); s != nil {
					ev.LoraName = *s
				}
			}
		default:
			b, err = msgp.Skip(b)
		}
		return b, err
	})
	if err == nil {
		err = required(hasID, "request_id", hasWorker, "worker", hasData, "data", hasRouter, "router_id")
	}
	if err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	return rest, nil
}

func decodeWorker(p []byte, w *index.WorkerKey) ([]byte, error) {
	var hasID, hasRank bool
	rest, err := eachField(p, func(key string, b []byte) ([]byte, error) {
		var err error
		switch key {
		case "worker_id":
			w.WorkerID, b, err = readU64(b, key, &hasID)
		case "dp_rank":
			w.DPRank, b, err = readU32(b, key, &hasRank)
		default:
			b, err = msgp.Skip(b)
		}
		return b, err
	})
	if err == nil {
		err = required(hasID, "worker_id", hasRank, "dp_rank")
	}
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return rest, nil
}

// decodeData reads ActiveSequenceEventData: a unit variant's name, or a
// one-entry map from the variant name to its body.
func decodeData(p []byte, ev *selection.BookingEvent) ([]byte, error) {
	if msgp.NextType(p) == msgp.StrType {
		name, rest, err := msgp.ReadStringZC(p)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		return rest, unitVariant(string(name), ev)
	}
	n, b, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if n != 1 {
		return nil, fmt.Errorf("data: enum map with %d entries, want 1", n)
	}
	name, b, err := msgp.ReadMapKeyZC(b)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if string(name) != variantAdd {
		if b, err = msgp.ReadNilBytes(b); err != nil {
			return nil, fmt.Errorf("data: variant %q: %w", name, err)
		}
		return b, unitVariant(string(name), ev)
	}
	ev.Kind = selection.BookingAdded
	ev.TrackPrefill = true // #[serde(default = "default_track_prefill_tokens")]
	var hasSeq, hasTrack, hasExpected, hasHint bool
	b, err = eachField(b, func(key string, b []byte) ([]byte, error) {
		var err error
		switch key {
		case "token_sequence":
			if err = once(key, &hasSeq); err == nil {
				ev.TrackingHashes, b, err = readOptU64s(b, key)
			}
		case "track_prefill_tokens":
			if err = once(key, &hasTrack); err == nil {
				if ev.TrackPrefill, b, err = msgp.ReadBoolBytes(b); err != nil {
					err = fmt.Errorf("%s: %w", key, err)
				}
			}
		case "expected_output_tokens":
			if err = once(key, &hasExpected); err == nil && !msgp.IsNil(b) {
				var v uint32
				var seen bool
				if v, b, err = readU32(b, key, &seen); err == nil {
					ev.ExpectedOutputTokens = &v
				}
			} else if err == nil {
				b, err = msgp.ReadNilBytes(b)
			}
		case "prefill_load_hint":
			if err = once(key, &hasHint); err == nil {
				b, err = decodeHint(b, ev)
			}
		default:
			b, err = msgp.Skip(b)
		}
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", variantAdd, err)
	}
	return b, nil
}

func unitVariant(name string, ev *selection.BookingEvent) error {
	switch name {
	case variantFree:
		ev.Kind = selection.BookingFreed
	case variantPrefill:
		ev.Kind = selection.BookingPrefillCompleted
	default:
		return fmt.Errorf("data: unknown variant %q", name)
	}
	return nil
}

// decodeHint reads Option<PrefillLoadHint>; kvselect keeps the initial
// effective prefill and ignores the expected duration (it has no prefill load
// model).
func decodeHint(p []byte, ev *selection.BookingEvent) ([]byte, error) {
	if msgp.IsNil(p) {
		return msgp.ReadNilBytes(p)
	}
	var hasInitial bool
	var initial uint64
	rest, err := eachField(p, func(key string, b []byte) ([]byte, error) {
		var err error
		switch key {
		case "initial_effective_prefill_tokens":
			initial, b, err = readU64(b, key, &hasInitial)
		default:
			b, err = msgp.Skip(b)
		}
		return b, err
	})
	if err == nil {
		err = required(hasInitial, "initial_effective_prefill_tokens")
	}
	if err != nil {
		return nil, fmt.Errorf("prefill_load_hint: %w", err)
	}
	ev.PrefillTokens = &initial
	return rest, nil
}

// DecodeBinding parses a dynamo.session-affinity.v1 payload.
func DecodeBinding(p []byte) (selection.SessionBinding, error) {
	var sb selection.SessionBinding
	var hasModel, hasGroup, hasSession, hasWorker, hasRank, hasSeq, hasWriter bool
	rest, err := eachField(p, func(key string, b []byte) ([]byte, error) {
		var err error
		switch key {
		case "model_name":
			sb.Partition.Model, b, err = readString(b, key, &hasModel)
		case "routing_group":
			sb.Partition.RoutingGroup, b, err = readString(b, key, &hasGroup)
		case "session_id":
			sb.SessionID, b, err = readString(b, key, &hasSession)
		case "worker_id":
			sb.WorkerID, b, err = readU64(b, key, &hasWorker)
		case "dp_rank":
			if err = once(key, &hasRank); err == nil {
				if msgp.IsNil(b) {
					b, err = msgp.ReadNilBytes(b)
				} else {
					var r uint32
					var seen bool
					if r, b, err = readU32(b, key, &seen); err == nil {
						sb.DPRank = &r
					}
				}
			}
		case "sequence":
			sb.Sequence, b, err = readU64(b, key, &hasSeq)
		case "writer_id":
			sb.WriterID, b, err = readU64(b, key, &hasWriter)
		default:
			b, err = msgp.Skip(b)
		}
		return b, err
	})
	if err == nil {
		err = required(hasModel, "model_name", hasGroup, "routing_group", hasSession, "session_id",
			hasWorker, "worker_id", hasSeq, "sequence", hasWriter, "writer_id")
	}
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	if err != nil {
		return selection.SessionBinding{}, fmt.Errorf("%s: %w: %w", TopicSessionAffinity, ErrMalformed, err)
	}
	return sb, nil
}

// eachField walks a map whose keys are strings, calling fn with each key and
// the bytes at its value; fn returns the bytes after the value.
func eachField(p []byte, fn func(key string, b []byte) ([]byte, error)) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return nil, err
	}
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return nil, err
		}
		if b, err = fn(string(key), b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// once rejects a repeated field, as serde's derive does ("duplicate field").
func once(key string, seen *bool) error {
	if *seen {
		return fmt.Errorf("duplicate field `%s`", key)
	}
	*seen = true
	return nil
}

// required reports the first missing field of (present, name) pairs.
func required(pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !pairs[i].(bool) {
			return fmt.Errorf("missing field `%s`", pairs[i+1].(string))
		}
	}
	return nil
}

func readString(b []byte, key string, seen *bool) (string, []byte, error) {
	if err := once(key, seen); err != nil {
		return "", nil, err
	}
	s, rest, err := msgp.ReadStringBytes(b)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", key, err)
	}
	return s, rest, nil
}

func readOptString(b []byte, key string) (*string, []byte, error) {
	if msgp.IsNil(b) {
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	s, rest, err := msgp.ReadStringBytes(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", key, err)
	}
	return &s, rest, nil
}

func readU64(b []byte, key string, seen *bool) (uint64, []byte, error) {
	if err := once(key, seen); err != nil {
		return 0, nil, err
	}
	v, rest, err := msgp.ReadUint64Bytes(b)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", key, err)
	}
	return v, rest, nil
}

func readU32(b []byte, key string, seen *bool) (uint32, []byte, error) {
	if err := once(key, seen); err != nil {
		return 0, nil, err
	}
	v, rest, err := msgp.ReadUint32Bytes(b)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", key, err)
	}
	return v, rest, nil
}

// readOptU64s reads Option<Vec<u64>>. The length is checked against the bytes
// left before anything is allocated: every element takes at least one byte.
func readOptU64s(b []byte, key string) ([]uint64, []byte, error) {
	if msgp.IsNil(b) {
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", key, err)
	}
	if int(n) > len(b) {
		return nil, nil, fmt.Errorf("%s: %d elements in %d bytes: %w", key, n, len(b), msgp.ErrShortBytes)
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], b, err = msgp.ReadUint64Bytes(b); err != nil {
			return nil, nil, fmt.Errorf("%s[%d]: %w", key, i, err)
		}
	}
	return out, b, nil
}
