package mesh

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/index"
)

var textRE = regexp.MustCompile(`\{[^}]*\}`)

// golden joins annotated hex: each line is "hex bytes  # comment"; spaces
// and comments are ignored.
func golden(t *testing.T, annotated string) []byte {
	t.Helper()
	var clean strings.Builder
	for line := range strings.SplitSeq(annotated, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		// {text} stands for the UTF-8 bytes of text; the string header before
		// it stays hand-written.
		line = textRE.ReplaceAllStringFunc(line, func(m string) string { return hex.EncodeToString([]byte(m[1 : len(m)-1])) })
		clean.WriteString(strings.ReplaceAll(strings.TrimSpace(line), " ", ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		t.Fatalf("bad golden hex: %v", err)
	}
	return b
}

// goldenFree is the envelope of Dynamo's own replica_sync.rs test fixture
// (event(): model "model", group "group", block size 16, request "request",
// worker (1, 0), Free, router 42, no LoRA) as rmp_serde::to_vec_named writes
// it: the v1 envelope's four keys (model_name, routing_group, block_size,
// event), ActiveSequenceEvent's five fields in declaration order, the unit
// variant as a bare string.
func goldenFree(t *testing.T) []byte {
	return golden(t, `
		84                        # map, 4 entries: exactly the v1 envelope keys
		aa {model_name}           # fixstr, 10 bytes
		a5 {model}
		ad {routing_group}        # 13 bytes
		a5 {group}
		aa {block_size}
		10                        # 16, positive fixint
		a5 {event}
		85                        # map, 5 entries: ActiveSequenceEvent
		aa {request_id}
		a7 {request}
		a6 {worker}
		82                        # WorkerWithDpRank
		a9 {worker_id} 01         # 1
		a7 {dp_rank} 00           # 0
		a4 {data}
		a4 {Free}                 # unit variant = its name
		a9 {router_id} 2a         # 42
		a9 {lora_name} c0         # None
	`)
}

func TestBookingGoldenBytes(t *testing.T) {
	free := selection.BookingEvent{Kind: selection.BookingFreed, Partition: index.Partition{Model: "model", RoutingGroup: "group"},
		BlockSize: 16, RequestID: "request", Worker: index.WorkerKey{WorkerID: 1}, Origin: 42}
	add := selection.BookingEvent{Kind: selection.BookingAdded, Partition: index.Partition{Model: "m", RoutingGroup: "default"},
		BlockSize: 4, RequestID: "r-1", Worker: index.WorkerKey{WorkerID: 7, DPRank: 1}, Origin: 0xfedcba9876543210,
		LoraName: "ad", TrackingHashes: []uint64{1, 0x8000000000000000}, TrackPrefill: true,
		ExpectedOutputTokens: ptr(uint32(300)), PrefillTokens: ptr(uint64(4))}
	prefill := selection.BookingEvent{Kind: selection.BookingPrefillCompleted, Partition: index.Partition{Model: "m", RoutingGroup: "g"},
		BlockSize: 64, RequestID: "x", Worker: index.WorkerKey{WorkerID: 300, DPRank: 2}, Origin: 5}
	for _, c := range []struct {
		name string
		ev   selection.BookingEvent
		want []byte
	}{
		{"free (Dynamo's fixture)", free, goldenFree(t)},
		{"add request", add, golden(t, `
			84
			aa {model_name} a1 {m}
			ad {routing_group} a7 {default}
			aa {block_size} 04
			a5 {event} 85
			aa {request_id} a3 {r-1}
			a6 {worker} 82 a9 {worker_id} 07 a7 {dp_rank} 01
			a4 {data}
			81 aa {AddRequest}                 # struct variant: {"AddRequest": {...}}
			84                                 # 4 fields, declaration order
			ae {token_sequence}
			92 01 cf 8000000000000000          # [1, 2^63]: fixint, then the uint64 marker
			b4 {track_prefill_tokens} c3       # true
			b6 {expected_output_tokens}
			cd 012c                            # 300, uint16
			b1 {prefill_load_hint}
			82                                 # PrefillLoadHint
			d9 20 {initial_effective_prefill_tokens}  # str8: 32 bytes do not fit a fixstr
			04
			b9 {expected_prefill_duration} c0  # None
			a9 {router_id} cf fedcba9876543210
			a9 {lora_name} a2 {ad}
		`)},
		{"mark prefill completed", prefill, golden(t, `
			84
			aa {model_name} a1 {m}
			ad {routing_group} a1 {g}
			aa {block_size} 40                 # 64
			a5 {event} 85
			aa {request_id} a1 {x}
			a6 {worker} 82 a9 {worker_id} cd 012c a7 {dp_rank} 02
			a4 {data} b4 {MarkPrefillCompleted}
			a9 {router_id} 05
			a9 {lora_name} c0
		`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := AppendBooking(nil, &c.ev)
			if !bytes.Equal(got, c.want) {
				t.Fatalf("encoded\n%x\nwant\n%x", got, c.want)
			}
			back, err := DecodeBooking(c.want)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, c.ev) {
				t.Fatalf("decoded %+v\nwant    %+v", back, c.ev)
			}
		})
	}
}

func TestBindingGoldenBytes(t *testing.T) {
	sb := selection.SessionBinding{Partition: index.Partition{Model: "model", RoutingGroup: "default"},
		BindingEvent: affinity.BindingEvent{SessionID: "sess", WorkerID: 3, DPRank: ptr(uint32(1)),
			Sequence: 1_700_000_000_000_000_123, WriterID: 9}}
	want := golden(t, `
		87                                  # 7 entries, the flattened partition first
		aa {model_name} a5 {model}
		ad {routing_group} a7 {default}
		aa {session_id} a4 {sess}
		a9 {worker_id} 03
		a7 {dp_rank} 01
		a8 {sequence} cf 17979cfe362a007b   # wall-clock nanoseconds at table creation
		a9 {writer_id} 09
	`)
	if got := AppendBinding(nil, &sb); !bytes.Equal(got, want) {
		t.Fatalf("encoded\n%x\nwant\n%x", got, want)
	}
	back, err := DecodeBinding(want)
	if err != nil || !reflect.DeepEqual(back, sb) {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	// A worker-only binding carries dp_rank nil.
	sb.DPRank = nil
	back, err = DecodeBinding(AppendBinding(nil, &sb))
	if err != nil || back.DPRank != nil {
		t.Fatalf("worker-only: %+v, %v", back, err)
	}
}

// mapOf builds a msgpack map from alternating string keys and encoded values.
func mapOf(kv ...any) []byte {
	out := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		out = msgp.AppendString(out, kv[i].(string))
		out = append(out, kv[i+1].([]byte)...)
	}
	return out
}

func S(s string) []byte { return msgp.AppendString(nil, s) }
func U(u uint64) []byte { return msgp.AppendUint64(nil, u) }
func I(i int64) []byte  { return msgp.AppendInt64(nil, i) }
func Nil() []byte       { return msgp.AppendNil(nil) }

func event(data []byte, extra ...any) []byte {
	return mapOf(append([]any{"request_id", S("r"), "worker", mapOf("worker_id", U(1), "dp_rank", U(0)),
		"data", data, "router_id", U(2)}, extra...)...)
}

func envelope(ev []byte, extra ...any) []byte {
	return mapOf(append([]any{"model_name", S("m"), "routing_group", S("g"), "block_size", U(4), "event", ev}, extra...)...)
}

// serde's derive rules: any field order, unknown fields ignored, missing
// Option fields None, track_prefill_tokens defaulting to true, signed
// non-negative integers accepted, {"Free": nil} for a unit variant.
func TestDecodeBookingLenient(t *testing.T) {
	for _, c := range []struct {
		name string
		p    []byte
		want selection.BookingEvent
	}{
		{"reordered with unknown fields, no lora_name", mapOf("event", event(S("Free"), "future", S("x")), "block_size", U(4),
			"routing_group", S("g"), "extra", mapOf("a", U(1)), "model_name", S("m")),
			selection.BookingEvent{Kind: selection.BookingFreed}},
		{"unit variant as a map", envelope(event(mapOf("MarkPrefillCompleted", Nil()))),
			selection.BookingEvent{Kind: selection.BookingPrefillCompleted}},
		{"add request with only token_sequence", envelope(event(mapOf("AddRequest", mapOf("token_sequence", Nil())))),
			selection.BookingEvent{Kind: selection.BookingAdded, TrackPrefill: true}},
		{"add request with a hint carrying a duration", envelope(event(mapOf("AddRequest", mapOf(
			"token_sequence", msgp.AppendArrayHeader(nil, 0), "track_prefill_tokens", msgp.AppendBool(nil, false),
			"prefill_load_hint", mapOf("initial_effective_prefill_tokens", I(12), "expected_prefill_duration", mapOf("secs", U(1), "nanos", U(5))))))),
			selection.BookingEvent{Kind: selection.BookingAdded, TrackingHashes: []uint64{}, PrefillTokens: ptr(uint64(12))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeBooking(c.p)
			if err != nil {
				t.Fatal(err)
			}
			c.want.Partition, c.want.BlockSize, c.want.RequestID = index.Partition{Model: "m", RoutingGroup: "g"}, 4, "r"
			c.want.Worker, c.want.Origin = index.WorkerKey{WorkerID: 1}, 2
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestDecodeBookingRejects(t *testing.T) {
	free := event(S("Free"))
	for _, c := range []struct {
		name, frag string
		p          []byte
	}{
		{"legacy tenant_id envelope", "missing field `routing_group`",
			mapOf("model_name", S("m"), "tenant_id", S("t"), "block_size", U(16), "event", free)},
		{"missing event", "missing field `event`", mapOf("model_name", S("m"), "routing_group", S("g"), "block_size", U(4))},
		{"missing router_id", "missing field `router_id`", envelope(mapOf("request_id", S("r"),
			"worker", mapOf("worker_id", U(1), "dp_rank", U(0)), "data", S("Free")))},
		{"missing dp_rank", "missing field `dp_rank`", envelope(mapOf("request_id", S("r"),
			"worker", mapOf("worker_id", U(1)), "data", S("Free"), "router_id", U(1)))},
		{"duplicate field", "duplicate field `block_size`", envelope(free, "block_size", U(4))},
		{"block size above u32", "block_size", mapOf("model_name", S("m"), "routing_group", S("g"), "block_size", U(1<<32), "event", free)},
		{"negative router id", "router_id", envelope(mapOf("request_id", S("r"), "worker", mapOf("worker_id", U(1), "dp_rank", U(0)),
			"data", S("Free"), "router_id", I(-1)))},
		{"unknown variant", "unknown variant", envelope(event(S("OutputBlock")))},
		{"unit variant with a body", "variant", envelope(event(mapOf("Free", U(1))))},
		{"two-entry enum map", "2 entries", envelope(event(mapOf("Free", Nil(), "AddRequest", Nil())))},
		{"add request as nil", "AddRequest", envelope(event(mapOf("AddRequest", Nil())))},
		{"token sequence longer than the payload", "elements", envelope(event(mapOf("AddRequest",
			mapOf("token_sequence", msgp.AppendArrayHeader(nil, 1<<30)))))},
		{"hint without initial tokens", "initial_effective_prefill_tokens", envelope(event(mapOf("AddRequest",
			mapOf("prefill_load_hint", mapOf("expected_prefill_duration", Nil())))))},
		{"model name not a string", "model_name", mapOf("model_name", U(1), "routing_group", S("g"), "block_size", U(4), "event", free)},
		{"not a map", "", msgp.AppendArrayHeader(nil, 4)},
		{"truncated", "", goldenFree(t)[:40]},
		{"trailing bytes", "trailing", append(goldenFree(t), 0xc0)},
		{"empty", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeBooking(c.p)
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.frag) {
				t.Fatalf("err = %v, want ErrMalformed containing %q", err, c.frag)
			}
		})
	}
}

func TestDecodeBindingRejects(t *testing.T) {
	base := []any{"model_name", S("m"), "routing_group", S("g"), "session_id", S("s"), "worker_id", U(1),
		"dp_rank", Nil(), "sequence", U(5), "writer_id", U(6)}
	if _, err := DecodeBinding(mapOf(base...)); err != nil {
		t.Fatal(err)
	}
	without := func(key string) []byte {
		var kv []any
		for i := 0; i < len(base); i += 2 {
			if base[i] != key {
				kv = append(kv, base[i], base[i+1])
			}
		}
		return mapOf(kv...)
	}
	// dp_rank is an Option: absent is a worker-only binding.
	if sb, err := DecodeBinding(without("dp_rank")); err != nil || sb.DPRank != nil {
		t.Fatalf("without dp_rank: %+v %v", sb, err)
	}
	for _, key := range []string{"model_name", "routing_group", "session_id", "worker_id", "sequence", "writer_id"} {
		if _, err := DecodeBinding(without(key)); err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), key) {
			t.Errorf("without %s: %v", key, err)
		}
	}
	if _, err := DecodeBinding(mapOf(append(base, "dp_rank", U(1))...)); err == nil {
		t.Error("duplicate dp_rank accepted")
	}
	if _, err := DecodeBinding(mapOf("model_name", S("m"), "routing_group", S("g"), "session_id", S("s"), "worker_id", U(1),
		"dp_rank", U(1<<33), "sequence", U(5), "writer_id", U(6))); err == nil {
		t.Error("dp_rank above u32 accepted")
	}
}

func ptr[T any](v T) *T { return &v }
