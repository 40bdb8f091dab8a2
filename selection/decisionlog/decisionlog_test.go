package decisionlog

import "testing"

func TestLogIsBounded(t *testing.T) {
	l := New(3)
	for i := range 5 {
		l.Add(Record{WorkerID: uint64(i)})
	}
	var ids []uint64
	for _, r := range l.Latest(0) {
		ids = append(ids, r.WorkerID)
	}
	if len(ids) != 3 || ids[0] != 4 || ids[2] != 2 {
		t.Errorf("kept %v, want the newest three, newest first", ids)
	}
	if got := l.Latest(2); len(got) != 2 || got[0].WorkerID != 4 {
		t.Errorf("Latest(2) = %+v", got)
	}
	if New(-1).Latest(0) != nil {
		t.Error("a disabled log returned records")
	}
}

// Observe keeps the totals consistent whatever a caller passes: a prompt's
// cached tokens are at most its length, and the best-cached tokens at least
// the chosen rank's and at most the prompt.
func TestObserveClampsTheTotals(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		isl, cached, best         int
		wantPrompt, wantC, wantBC uint64
	}{
		{"the chosen rank was the best cached", 100, 40, 40, 100, 40, 40},
		{"cache given up for load", 100, 10, 60, 100, 10, 60},
		{"best below chosen reads as chosen", 100, 30, 0, 100, 30, 30},
		{"both capped at the prompt", 16, 32, 48, 16, 16, 16},
		{"negative counts read as none", 8, -4, -1, 8, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Counters
			c.Observe(tc.isl, tc.cached, tc.best)
			r := c.Totals("m", "g")
			if r.Decisions != 1 || r.PromptTokens != tc.wantPrompt || r.CachedTokens != tc.wantC || r.BestCachedTokens != tc.wantBC {
				t.Errorf("totals %+v, want prompt %d, cached %d, best %d", r, tc.wantPrompt, tc.wantC, tc.wantBC)
			}
		})
	}
}
