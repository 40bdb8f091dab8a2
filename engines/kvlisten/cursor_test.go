package kvlisten

import (
	"slices"
	"testing"
)

func TestCursorObserve(t *testing.T) {
	synced := func(last uint64) cursor { return cursor{synced: true, last: last} }
	cases := []struct {
		name string
		cur  cursor
		seq  uint64
		want observation
	}{
		{"first message at 0 is accepted", cursor{}, 0, observation{verdict: verdictAccept}},
		{"first message above 0 replays from 0", cursor{}, 5, observation{verdict: verdictReplay, from: 0, to: 5}},
		{"first message at 1 replays seq 0", cursor{}, 1, observation{verdict: verdictReplay, from: 0, to: 1}},
		{"next in order is accepted", synced(4), 5, observation{verdict: verdictAccept}},
		{"next after watermark 0 is accepted", synced(0), 1, observation{verdict: verdictAccept}},
		{"duplicate of the watermark is stale", synced(4), 4, observation{verdict: verdictStale}},
		{"below the watermark is stale", synced(4), 1, observation{verdict: verdictStale}},
		{"restart from 0 is stale", synced(4), 0, observation{verdict: verdictStale}},
		{"gap replays the missing range", synced(4), 8, observation{verdict: verdictReplay, from: 5, to: 8, gap: true}},
		{"gap of one batch", synced(4), 6, observation{verdict: verdictReplay, from: 5, to: 6, gap: true}},
		{"gap after watermark 0", synced(0), 2, observation{verdict: verdictReplay, from: 1, to: 2, gap: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.cur
			if got := tc.cur.observe(tc.seq); got != tc.want {
				t.Fatalf("observe(%d) on %+v = %+v, want %+v", tc.seq, before, got, tc.want)
			}
			if tc.cur != before {
				t.Fatalf("observe moved the cursor: %+v, was %+v", tc.cur, before)
			}
		})
	}
}

func TestCursorAdvanceSetsWatermark(t *testing.T) {
	var c cursor
	if last, ok := c.watermark(); ok || last != 0 {
		t.Fatalf("zero cursor has watermark %d (synced %v)", last, ok)
	}
	c.advance(0)
	if last, ok := c.watermark(); !ok || last != 0 {
		t.Fatalf("after advance(0): watermark %d (synced %v), want 0 synced", last, ok)
	}
	if got := c.observe(0); got.verdict != verdictStale {
		t.Fatalf("seq 0 after advance(0): %+v, want stale", got)
	}
	c.advance(7)
	if last, ok := c.watermark(); !ok || last != 7 {
		t.Fatalf("after advance(7): watermark %d (synced %v), want 7 synced", last, ok)
	}
}

// TestCursorStream walks a live stream the way a rank does: every accepted
// batch and every batch of a replayed range advances the cursor.
func TestCursorStream(t *testing.T) {
	var c cursor
	steps := []struct {
		seq  uint64
		want observation
	}{
		{3, observation{verdict: verdictReplay, from: 0, to: 3}}, // joined a running publisher
		{4, observation{verdict: verdictAccept}},
		{4, observation{verdict: verdictStale}},
		{7, observation{verdict: verdictReplay, from: 5, to: 7, gap: true}},
		{6, observation{verdict: verdictStale}}, // replayed already
		{8, observation{verdict: verdictAccept}},
	}
	for i, s := range steps {
		got := c.observe(s.seq)
		if got != s.want {
			t.Fatalf("step %d: observe(%d) = %+v, want %+v", i, s.seq, got, s.want)
		}
		switch got.verdict {
		case verdictReplay:
			rg := newReplayRange(got.from, got.to)
			for seq := got.from; seq < got.to; seq++ {
				if rg.take(seq) {
					c.advance(seq)
				}
			}
			if _, _, reason := rg.result(); reason != "" {
				t.Fatalf("step %d: complete replay reported %q", i, reason)
			}
			c.advance(s.seq)
		case verdictAccept:
			c.advance(s.seq)
		}
	}
	if last, ok := c.watermark(); !ok || last != 8 {
		t.Fatalf("watermark %d (synced %v), want 8", last, ok)
	}
}

func TestReplayRangeClassifiesAnswer(t *testing.T) {
	cases := []struct {
		name          string
		start, target uint64
		replies       []uint64 // sequence numbers in arrival order
		wantTaken     []uint64
		wantLost      uint64
		wantReason    string
	}{
		{"complete", 2, 5, []uint64{2, 3, 4}, []uint64{2, 3, 4}, 0, ""},
		{"complete from 0", 0, 3, []uint64{0, 1, 2}, []uint64{0, 1, 2}, 0, ""},
		{"live batch and newer in the answer are ignored", 2, 5, []uint64{2, 3, 4, 5, 6}, []uint64{2, 3, 4}, 0, ""},
		{"batches before the range are ignored", 2, 5, []uint64{0, 1, 2, 3, 4}, []uint64{2, 3, 4}, 0, ""},
		{"duplicates are ignored", 2, 5, []uint64{2, 2, 3, 3, 4, 4}, []uint64{2, 3, 4}, 0, ""},
		{"empty answer", 2, 5, nil, nil, 3, ReasonEmpty},
		{"only out-of-range answers count as empty", 2, 5, []uint64{0, 1, 5, 9}, nil, 3, ReasonEmpty},
		{"ring overflowed: started after requested", 0, 5, []uint64{3, 4}, []uint64{3, 4}, 3, ReasonStartedAfterRequested},
		{"started after requested wins over a later hole", 0, 6, []uint64{2, 4, 5}, []uint64{2, 4, 5}, 3, ReasonStartedAfterRequested},
		{"started after requested wins over ending short", 0, 6, []uint64{2, 3}, []uint64{2, 3}, 4, ReasonStartedAfterRequested},
		{"hole inside the range", 2, 6, []uint64{2, 4, 5}, []uint64{2, 4, 5}, 1, ReasonNonContiguous},
		{"hole wins over ending short", 2, 8, []uint64{2, 4}, []uint64{2, 4}, 4, ReasonNonContiguous},
		{"out of order: the late one is ignored", 2, 5, []uint64{2, 4, 3}, []uint64{2, 4}, 1, ReasonNonContiguous},
		{"ended before target", 2, 6, []uint64{2, 3}, []uint64{2, 3}, 2, ReasonEndedBeforeTarget},
		{"ended before target with duplicates", 2, 6, []uint64{2, 2, 3}, []uint64{2, 3}, 2, ReasonEndedBeforeTarget},
		{"nothing requested", 4, 4, []uint64{4}, nil, 0, ""},
		// Publishers numbering from 1 (llm-d-inference-sim): batch 0 never
		// existed, so the initial catch-up does not miss it.
		{"numbering from 1: catch-up", 0, 4, []uint64{1, 2, 3}, []uint64{1, 2, 3}, 0, ""},
		{"numbering from 1: first live batch, empty answer", 0, 1, nil, nil, 0, ""},
		{"numbering from 1: the answer holds only the live batch", 0, 1, []uint64{1, 2}, nil, 0, ""},
		{"numbering from 1: the answer starts at 1", 0, 3, []uint64{1, 2}, []uint64{1, 2}, 0, ""},
		{"numbering from 1: a hole after batch 1", 0, 4, []uint64{1, 3}, []uint64{1, 3}, 1, ReasonNonContiguous},
		{"unknown numbering, ring overflowed: counted from 0", 0, 6, []uint64{3, 4, 5}, []uint64{3, 4, 5}, 3, ReasonStartedAfterRequested},
		{"catch-up from 0, nothing came back", 0, 3, nil, nil, 3, ReasonEmpty},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rg := newReplayRange(tc.start, tc.target)
			var taken []uint64
			for _, s := range tc.replies {
				if rg.take(s) {
					taken = append(taken, s)
				}
			}
			if !slices.Equal(taken, tc.wantTaken) {
				t.Fatalf("[%d, %d) fed %v: took %v, want %v", tc.start, tc.target, tc.replies, taken, tc.wantTaken)
			}
			got, lost, reason := rg.result()
			if got != uint64(len(tc.wantTaken)) || lost != tc.wantLost || reason != tc.wantReason {
				t.Fatalf("[%d, %d) fed %v: result (%d, %d, %q), want (%d, %d, %q)",
					tc.start, tc.target, tc.replies, got, lost, reason, len(tc.wantTaken), tc.wantLost, tc.wantReason)
			}
		})
	}
}

// A restarted publisher is told from duplicates and reordered batches: the
// live stream (accepted batches as 'a', stale ones as their sequence number)
// ends in a restart only for a new session below the watermark or a run of
// different stale batches with none accepted between them.
func TestCursorRestarted(t *testing.T) {
	cases := []struct {
		name      string
		stream    []uint64 // live sequence numbers after a watermark of 100
		newAt     int      // index of the first batch of a new session; -1 none
		restartAt int      // index at which restarted reports true; -1 never
	}{
		{"new session below the watermark", []uint64{0}, 0, 0},
		{"new session, restarted publisher a few batches in", []uint64{7}, 0, 0},
		{"same session, restarted publisher counting up", []uint64{0, 1, 2}, -1, 2},
		{"same session, caught from its fifth batch", []uint64{5, 6, 7}, -1, 2},
		{"duplicates between accepted batches", []uint64{100, 101, 101, 102, 102, 103, 103}, -1, -1},
		{"reordered pairs", []uint64{102, 101, 104, 103, 106, 105}, -1, -1},
		{"a late batch, then another one", []uint64{50, 101, 60}, -1, -1},
		{"two in a row, then accepted: not yet", []uint64{3, 4, 101, 5}, -1, -1},
		{"same session, restarted publisher behind a reordering relay", []uint64{1, 0, 3, 2, 5}, -1, 2},
		{"same session, restarted publisher behind a duplicating relay", []uint64{0, 0, 1, 1, 2}, -1, 4},
		{"one batch duplicated over and over", []uint64{100, 100, 100, 100}, -1, -1},
		{"a held-back batch, then its duplicate and the batch after it", []uint64{102, 101, 102, 103, 105, 104, 105}, -1, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cursor{synced: true, last: 100}
			got := -1
			for i, seq := range tc.stream {
				if c.observe(seq).verdict != verdictStale {
					c.advance(seq)
					continue
				}
				if c.restarted(seq, i == tc.newAt) {
					got = i
					break
				}
			}
			if got != tc.restartAt {
				t.Fatalf("restart recognized at batch %d, want %d", got, tc.restartAt)
			}
		})
	}
}
