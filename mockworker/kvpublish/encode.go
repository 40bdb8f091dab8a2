// Package kvpublish is the engine side of KV cache events: it encodes vLLM
// KVEventBatch payloads byte for byte as vLLM's msgspec encoder does and
// publishes them the way vLLM's ZmqEventPublisher does — a ZMQ PUB socket
// sending [topic, seq (8 bytes BE), payload] and an optional ROUTER replay
// endpoint serving a ring of the last batches (vllm/distributed/kv_events.py).
//
// It exists so that tests, benchmarks and the mock worker can stand in for a real
// engine over real sockets: whatever kvselect's listeners accept from this
// package they accept from vLLM, because the bytes are the same.
package kvpublish

import (
	"math"

	"github.com/tinylib/msgp/msgp"
)

// Event is one KV cache event of a batch: BlockStored, BlockRemoved or
// AllBlocksCleared, by value or by pointer (a pointer avoids copying the
// struct into the interface on hot paths). The set is closed.
type Event interface{ isEvent() }

// BlockStored reports full blocks that entered the engine's prefix cache, in
// chain order. Fields are in vLLM's declaration order; the optional trailing
// vLLM fields (extra_keys, group_idx, kv_cache_spec_*) are left at their
// default None, as vLLM does for a plain single-group model without
// multimodal inputs.
type BlockStored struct {
	// BlockHashes are the engine's hashes of the blocks, one per full block.
	// vLLM's ExternalBlockHash is an int in [0, 2^64), so uint64 covers it.
	BlockHashes []uint64
	// ParentBlockHash is the engine hash of the block before BlockHashes[0];
	// nil for a chain that starts at the root.
	ParentBlockHash *uint64
	// TokenIDs are the tokens of all the blocks, len = len(BlockHashes)*BlockSize.
	TokenIDs  []uint32
	BlockSize int
	// LoraID is deprecated in vLLM (consumers ignore it) but still on the wire.
	LoraID *int
	// Medium is the storage tier ("GPU", "CPU", ...); "" encodes None.
	Medium   string
	LoraName *string
}

// BlockRemoved reports blocks evicted from the given medium.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      string // "" encodes None
}

// AllBlocksCleared reports that the engine dropped its whole prefix cache.
type AllBlocksCleared struct{}

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// Shape selects how events are laid out inside the batch. The batch envelope
// itself is always the msgspec array_like 3-tuple [ts, events, dp_rank].
type Shape uint8

const (
	// ShapeMap is vLLM's current encoding (PR #42892, v0.26+): every event is
	// a msgspec tagged struct without array_like, i.e. a map whose first key is
	// "type" with the class name as value, then the fields in declaration
	// order; fields without a default (lora_id, medium, lora_name) are always
	// present, trailing fields whose value is their default None are omitted
	// (omit_defaults=True).
	ShapeMap Shape = iota
	// ShapePositional is the legacy encoding (vLLM before PR #42892; SGLang):
	// every event is an array [tag, fields...] in declaration order. msgspec
	// ignores omit_defaults for array_like structs (msgspec#720), so all
	// declared fields are present, trailing Nones included.
	ShapePositional
)

func (s Shape) String() string {
	switch s {
	case ShapeMap:
		return "map"
	case ShapePositional:
		return "positional"
	}
	return "unknown"
}

// Field names and tags as msgspec writes them.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

// AppendBatch appends one vLLM KVEventBatch in vLLM's current shape (ShapeMap
// events in the array_like [ts, [events...], data_parallel_rank] envelope) to
// dst and returns the extended slice. A nil dpRank encodes None; vLLM's
// publisher always fills its own rank in.
func AppendBatch(dst []byte, ts float64, events []Event, dpRank *int) []byte {
	return AppendBatchShape(dst, ShapeMap, ts, events, dpRank)
}

// AppendBatchShape is AppendBatch with a choice of event shape.
func AppendBatchShape(dst []byte, shape Shape, ts float64, events []Event, dpRank *int) []byte {
	// The batch struct is array_like, so all three fields are always written.
	dst = msgp.AppendArrayHeader(dst, 3)
	dst = msgp.AppendFloat64(dst, ts)
	dst = msgp.AppendArrayHeader(dst, uint32(len(events)))
	for _, e := range events {
		dst = appendEvent(dst, shape, e)
	}
	return appendOptInt(dst, dpRank)
}

func appendEvent(dst []byte, shape Shape, e Event) []byte {
	switch ev := e.(type) {
	case *BlockStored:
		return appendStored(dst, shape, ev)
	case BlockStored:
		return appendStored(dst, shape, &ev)
	case *BlockRemoved:
		return appendRemoved(dst, shape, ev)
	case BlockRemoved:
		return appendRemoved(dst, shape, &ev)
	case *AllBlocksCleared, AllBlocksCleared:
		if shape == ShapePositional {
			return msgp.AppendString(msgp.AppendArrayHeader(dst, 1), tagCleared)
		}
		return msgp.AppendString(msgp.AppendString(msgp.AppendMapHeader(dst, 1), "type"), tagCleared)
	}
	// Unreachable: Event is sealed. A nil interface lands here; encode it as
	// msgpack nil, which decoders count as a malformed event rather than a
	// batch-wide failure.
	return msgp.AppendNil(dst)
}

func appendStored(dst []byte, shape Shape, e *BlockStored) []byte {
	if shape == ShapePositional {
		// tag + 11 declared fields (block_hashes … kv_cache_spec_sliding_window).
		dst = msgp.AppendArrayHeader(dst, 12)
		dst = msgp.AppendString(dst, tagStored)
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendOptHash(dst, e.ParentBlockHash)
		dst = appendTokens(dst, e.TokenIDs)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = appendOptInt(dst, e.LoraID)
		dst = appendOptStr(dst, e.Medium)
		dst = appendOptStrPtr(dst, e.LoraName)
		// extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
		return append(dst, 0xc0, 0xc0, 0xc0, 0xc0)
	}
	dst = msgp.AppendMapHeader(dst, 8)
	dst = msgp.AppendString(dst, "type")
	dst = msgp.AppendString(dst, tagStored)
	dst = msgp.AppendString(dst, "block_hashes")
	dst = appendHashes(dst, e.BlockHashes)
	dst = msgp.AppendString(dst, "parent_block_hash")
	dst = appendOptHash(dst, e.ParentBlockHash)
	dst = msgp.AppendString(dst, "token_ids")
	dst = appendTokens(dst, e.TokenIDs)
	dst = msgp.AppendString(dst, "block_size")
	dst = appendInt(dst, int64(e.BlockSize))
	dst = msgp.AppendString(dst, "lora_id")
	dst = appendOptInt(dst, e.LoraID)
	dst = msgp.AppendString(dst, "medium")
	dst = appendOptStr(dst, e.Medium)
	dst = msgp.AppendString(dst, "lora_name")
	return appendOptStrPtr(dst, e.LoraName)
}

func appendRemoved(dst []byte, shape Shape, e *BlockRemoved) []byte {
	if shape == ShapePositional {
		// tag, block_hashes, medium, group_idx (None).
		dst = msgp.AppendArrayHeader(dst, 4)
		dst = msgp.AppendString(dst, tagRemoved)
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendOptStr(dst, e.Medium)
		return msgp.AppendNil(dst)
	}
	dst = msgp.AppendMapHeader(dst, 3)
	dst = msgp.AppendString(dst, "type")
	dst = msgp.AppendString(dst, tagRemoved)
	dst = msgp.AppendString(dst, "block_hashes")
	dst = appendHashes(dst, e.BlockHashes)
	dst = msgp.AppendString(dst, "medium")
	return appendOptStr(dst, e.Medium)
}

// appendHashes writes hashes as msgspec writes Python ints in [0, 2^64): the
// smallest unsigned encoding, 0xcf for values at or above 2^32.
func appendHashes(dst []byte, hs []uint64) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = msgp.AppendUint64(dst, h)
	}
	return dst
}

func appendTokens(dst []byte, ts []uint32) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(ts)))
	for _, t := range ts {
		// Inline the common cases: tokens are the bulk of a batch.
		switch {
		case t < 0x80:
			dst = append(dst, byte(t))
		case t <= math.MaxUint8:
			dst = append(dst, 0xcc, byte(t))
		case t <= math.MaxUint16:
			dst = append(dst, 0xcd, byte(t>>8), byte(t))
		default:
			dst = append(dst, 0xce, byte(t>>24), byte(t>>16), byte(t>>8), byte(t))
		}
	}
	return dst
}

// appendInt writes a Python int as msgspec does: non-negative values in the
// smallest unsigned form, negative ones in the smallest signed form.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}

func appendOptInt(dst []byte, v *int) []byte {
	if v == nil {
		return msgp.AppendNil(dst)
	}
	return appendInt(dst, int64(*v))
}

func appendOptHash(dst []byte, v *uint64) []byte {
	if v == nil {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendUint64(dst, *v)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, s)
}

func appendOptStrPtr(dst []byte, s *string) []byte {
	if s == nil {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, *s)
}
