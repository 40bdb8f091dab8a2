package kvlisten

import (
	"encoding/binary"
	"slices"
	"testing"
)

func TestParseReplayReply(t *testing.T) {
	seq := binary.BigEndian.AppendUint64(nil, 42)
	end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
	payload := []byte{0x93}
	cases := []struct {
		name    string
		frames  [][]byte
		wantOK  bool
		wantSeq uint64
	}{
		{"three frames", [][]byte{{}, seq, payload}, true, 42},
		{"four frames with topic", [][]byte{{}, []byte("kv-events"), seq, payload}, true, 42},
		{"end marker, three frames", [][]byte{{}, end, {}}, false, 0},
		{"end marker, four frames", [][]byte{{}, []byte("kv-events"), end, {}}, false, 0},
		{"short sequence frame", [][]byte{{}, seq[:4], payload}, false, 0},
		{"two frames", [][]byte{seq, payload}, false, 0},
		{"five frames", [][]byte{{}, {}, {}, seq, payload}, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, p, ok := parseReplayReply(tc.frames)
			if ok != tc.wantOK || s != tc.wantSeq {
				t.Fatalf("parseReplayReply = (%d, %x, %v), want (%d, _, %v)", s, p, ok, tc.wantSeq, tc.wantOK)
			}
			if ok && !slices.Equal(p, payload) {
				t.Fatalf("payload %x, want %x", p, payload)
			}
		})
	}
}
