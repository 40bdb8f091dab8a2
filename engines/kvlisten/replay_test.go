package kvlisten

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
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

// A replay reads the engine's answer only as far as the range asked for:
// the engine sends its whole ring from the start on, and a listener that
// missed one batch must not read thousands for it.
func TestReplayStopsAtTheEndOfTheRange(t *testing.T) {
	p := newPublisher(t, kvpublish.Options{ReplayEndpoint: "tcp://127.0.0.1:0", RingSize: 5000})
	rank := 0
	for range 3000 {
		if _, err := p.Publish(&rank); err != nil {
			t.Fatal(err)
		}
	}
	l := New(t.Context(), Options{Logger: quietLogger()})
	t.Cleanup(l.Close)
	rg := newReplayRange(10, 13)
	var read []uint64
	requested, err := l.requestReplay(t.Context(), p.ReplayEndpoint(), 10, func(s uint64, _ []byte) bool {
		read = append(read, s)
		rg.take(s)
		return !rg.past(s)
	})
	if !requested || err != nil {
		t.Fatalf("requestReplay = %v, %v", requested, err)
	}
	if !slices.Equal(read, []uint64{10, 11, 12}) {
		t.Fatalf("read %d replies %v…, want 10, 11, 12", len(read), read[:min(len(read), 5)])
	}
	if got, lost, reason := rg.result(); got != 3 || lost != 0 || reason != "" {
		t.Fatalf("result = %d, %d, %q; want 3, 0, whole", got, lost, reason)
	}
}

func TestReplayRangePast(t *testing.T) {
	cases := []struct {
		name          string
		start, target uint64
		replies       []uint64
		wantPastAt    int // index of the reply after which the range is over; -1 never
	}{
		{"contiguous", 5, 8, []uint64{5, 6, 7, 8}, 2},
		{"a hole before the last", 5, 8, []uint64{5, 7, 8}, 1},
		{"the ring skips past the range", 5, 8, []uint64{5, 9, 10}, 1},
		{"ring starts after the range", 5, 8, []uint64{12, 13}, 0},
		{"older batches first", 5, 8, []uint64{3, 4, 5, 6, 7}, 4},
		{"a publisher numbering from 1, range [0, 1)", 0, 1, []uint64{1, 2}, 0},
		{"vLLM numbering from 0, range [0, 1)", 0, 1, []uint64{0, 1}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rg := newReplayRange(tc.start, tc.target)
			got := -1
			for i, s := range tc.replies {
				rg.take(s)
				if rg.past(s) {
					got = i
					break
				}
			}
			if got != tc.wantPastAt {
				t.Fatalf("range over after reply %d, want %d", got, tc.wantPastAt)
			}
		})
	}
}
