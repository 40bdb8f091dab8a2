package kvevents

import (
	"errors"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func TestParseTopic(t *testing.T) {
	cases := []struct {
		topic, hostPort, model string
		ok                     bool
	}{
		{"kv@127.0.0.1:8000@fake-model", "127.0.0.1:8000", "fake-model", true},
		{"kv@10.0.0.7:8000@meta-llama/Llama-3.1-8B", "10.0.0.7:8000", "meta-llama/Llama-3.1-8B", true},
		{"kv@10.0.0.7:8000@org/model@rev", "10.0.0.7:8000", "org/model@rev", true},
		{"kv@[fd00::7]:8000@m", "[fd00::7]:8000", "m", true},
		{"kv@10.0.0.7@m", "", "", false}, // no port
		{"kv@10.0.0.7:8000@", "", "", false},
		{"kv@:8000", "", "", false},
		{"kv@@m", "", "", false},
		{"kv_events", "", "", false},
		{"", "", "", false},
		{"KV@10.0.0.7:8000@m", "", "", false},
	}
	for _, tc := range cases {
		hp, m, ok := ParseTopic([]byte(tc.topic))
		if string(hp) != tc.hostPort || string(m) != tc.model || ok != tc.ok {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want %q, %q, %v", tc.topic, hp, m, ok, tc.hostPort, tc.model, tc.ok)
		}
	}
}

func TestBatchRank(t *testing.T) {
	ev := storedPos(Hs(11), Nil(), Toks(1, 2), 2)
	cases := []struct {
		name    string
		payload []byte
		rank    uint32
		present bool
		err     bool
	}{
		{"array with rank", batch(3, ev), 3, true, false},
		{"array with nil rank", batch(-1, ev), 0, false, false},
		{"two-element array", A(F(ts), A(ev)), 0, false, false},
		{"map with dp_rank", M("ts", F(ts), "events", A(ev), "dp_rank", U(5)), 5, true, false},
		{"map with data_parallel_rank first", M("data_parallel_rank", U(2), "ts", F(ts), "events", A()), 2, true, false},
		{"map without rank", M("ts", F(ts), "events", A(ev)), 0, false, false},
		{"negative rank", A(F(ts), A(ev), I(-1)), 0, false, true},
		{"four-element array", A(F(ts), A(ev), U(1), U(2)), 0, false, true},
		{"truncated", batch(3, ev)[:5], 0, false, true},
		{"not a batch", U(7), 0, false, true},
		{"empty", nil, 0, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rank, present, err := BatchRank(tc.payload)
			if (err != nil) != tc.err || (err != nil && !errors.Is(err, ErrBatch)) {
				t.Fatalf("err = %v, want error %v wrapping ErrBatch", err, tc.err)
			}
			if rank != tc.rank || present != tc.present {
				t.Fatalf("BatchRank = %d, %v; want %d, %v", rank, present, tc.rank, tc.present)
			}
		})
	}
}

// FuzzTopic: the topic parser never panics, and whatever it accepts
// round-trips to the topic it was read from.
func FuzzTopic(f *testing.F) {
	for _, s := range []string{"kv@127.0.0.1:8000@fake-model", "kv@[::1]:1@a@b", "kv@", "kv@a:1@", "", "x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, topic []byte) {
		hp, m, ok := ParseTopic(topic)
		if !ok {
			return
		}
		if got := TopicPrefix + string(hp) + "@" + string(m); got != string(topic) {
			t.Fatalf("ParseTopic(%q) read %q and %q", topic, hp, m)
		}
	})
}

// FuzzBatchRank: the rank peek never panics, and on every batch the decoder
// accepts it names the rank the decoder files the events under.
func FuzzBatchRank(f *testing.F) {
	ev := storedPos(Hs(11), Nil(), Toks(1, 2), 2)
	for _, s := range [][]byte{batch(3, ev), batch(-1, ev), M("ts", F(ts), "events", A(ev), "dp_rank", U(5)), A(F(ts), A(ev))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		rank, present, perr := BatchRank(payload)
		d := newDec(t, Config{WorkerID: wid, BlockSize: 2, DPRank: 77})
		evs, _, derr := d.Decode(payload, nil)
		if derr != nil {
			return
		}
		if perr != nil {
			t.Fatalf("the decoder accepted a batch BatchRank rejects: %v", perr)
		}
		want := uint32(77)
		if present {
			want = rank
		}
		for _, e := range evs {
			if e.Worker != (index.WorkerKey{WorkerID: wid, DPRank: want}) {
				t.Fatalf("event filed under %v, BatchRank says rank %d (present %v)", e.Worker, rank, present)
			}
		}
	})
}
