package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// Errors Decode and ParseMessage return. They are sentinels so listeners count
// them with errors.Is; the wrapped message says what was wrong.
var (
	// ErrFrames: a ZMQ message that is not [topic, seq(8 bytes BE), payload].
	ErrFrames = errors.New("kvevents: bad multipart message")
	// ErrBatch: a payload that is not a well-formed msgpack event batch. Nothing
	// of such a batch is applied and the decoder state is unchanged.
	ErrBatch = errors.New("kvevents: malformed event batch")
)

// ParseMessage splits one live ZMQ message of an engine's KV event publisher
// (vLLM's ZmqEventPublisher): exactly three frames, the topic, the sequence
// number as 8 bytes big-endian, and the msgpack batch. Dynamo drops any other
// shape with a warning; the caller does the same with the returned error.
// topic and payload alias frames.
func ParseMessage(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return nil, 0, nil, fmt.Errorf("%w: %d frames, want 3 (topic, seq, payload)", ErrFrames, len(frames))
	}
	if len(frames[1]) != 8 {
		return nil, 0, nil, fmt.Errorf("%w: sequence frame is %d bytes, want 8", ErrFrames, len(frames[1]))
	}
	return frames[0], binary.BigEndian.Uint64(frames[1]), frames[2], nil
}

// readHash reads an engine block hash. vLLM sends unsigned ints
// (0xcf above 2^63), SGLang and TRT-LLM signed int64, which are reinterpreted
// bitwise as Dynamo's BlockHashValue::into_u64 does. Raw hash bytes (vLLM with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) arrive as bin (or str): their last 8
// bytes big-endian, left-padded, equal vLLM's own int.from_bytes(h) & (2^64-1).
// The newest Dynamo types.rs only takes ints; an earlier Dynamo version took
// bytes the same way, and accepting them cannot misread an int.
func readHash(b []byte) (uint64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType:
		v, o, err := msgp.ReadInt64Bytes(b)
		return uint64(v), o, err
	case msgp.UintType:
		return msgp.ReadUint64Bytes(b)
	case msgp.BinType:
		v, o, err := msgp.ReadBytesZC(b)
		return last8(v), o, err
	case msgp.StrType:
		v, o, err := msgp.ReadStringZC(b)
		return last8(v), o, err
	}
	return 0, b, errType("block hash")
}

func last8(v []byte) uint64 {
	if len(v) >= 8 {
		return binary.BigEndian.Uint64(v[len(v)-8:])
	}
	var buf [8]byte
	copy(buf[8-len(v):], v)
	return binary.BigEndian.Uint64(buf[:])
}

// readOptStr reads a str or nil. present is false for nil.
func readOptStr(b []byte) (s []byte, present bool, o []byte, err error) {
	if msgp.IsNil(b) {
		o, err = msgp.ReadNilBytes(b)
		return nil, false, o, err
	}
	s, o, err = msgp.ReadStringZC(b)
	return s, err == nil, o, err
}

// readOptUint32 reads a non-negative int that fits in 32 bits, or nil.
func readOptUint32(b []byte) (v uint32, present bool, o []byte, err error) {
	if msgp.IsNil(b) {
		o, err = msgp.ReadNilBytes(b)
		return 0, false, o, err
	}
	v, o, err = msgp.ReadUint32Bytes(b)
	return v, err == nil, o, err
}

type typeError string

func (e typeError) Error() string { return "unexpected msgpack type for " + string(e) }

func errType(what string) error { return typeError(what) }

// Tags msgspec writes for the event classes (tag=True uses the class name).
var (
	tagStored    = []byte("BlockStored")
	tagRemoved   = []byte("BlockRemoved")
	tagCleared   = []byte("AllBlocksCleared")
	tagIgnored   = []byte("Ignored")
	localityLoc  = []byte("LOCAL")
	saltPrefix   = []byte("dynamo-cache-salt:") // components/src/dynamo/vllm/handlers.py
	keyCacheSalt = []byte("cache_salt")
	keyMMObjects = []byte("mm_objects")
	keyMMHash    = []byte("mm_hash")
)

// isMainKind reports whether a kv_cache_spec_kind is a prefix-cacheable main
// group (Dynamo filter.rs is_main_attention). Unknown kinds are non-main.
func isMainKind(kind []byte) bool {
	switch string(kind) {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// hexU64 parses the first 16 chars of a 64-char hex digest (vLLM's SHA-256 MM
// hash), as Dynamo's parse_mm_hash_from_extra_key. ok is false for anything that
// is not exactly 64 hex digits.
func hexU64(s []byte) (uint64, bool) {
	if len(s) != 64 {
		return 0, false
	}
	var v uint64
	for i, c := range s {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		if i < 16 {
			v = v<<4 | uint64(d)
		}
	}
	return v, true
}
