package selection

import (
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/scheduler"
)

func TestDecisionLogAndRoutingStats(t *testing.T) {
	s, clock := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}

	first, err := s.SelectAndReserve(bg, selReq("a", tokens...))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Free(bg, "a"); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Second)
	// The approximate index recorded the first booking, so the same prompt
	// now matches in full where it went.
	second, err := s.SelectAndReserve(bg, selReq("b", tokens...))
	if err != nil {
		t.Fatal(err)
	}
	if second.WorkerID != first.WorkerID || second.Decision.CachedTokens != 8 {
		t.Fatalf("second pick %d with %d cached tokens, want worker %d with 8", second.WorkerID, second.Decision.CachedTokens, first.WorkerID)
	}
	// Probes are not decisions.
	if _, err := s.Select(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"}, PromptRequest: PromptRequest{TokenIDs: tokens}, Advisory: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Select(bg, selReq("", tokens...)); err != nil {
		t.Fatal(err)
	}

	got := s.Inspect().RecentDecisions(0)
	if len(got) != 3 {
		t.Fatalf("%d decisions logged, want 3 (two bookings, one select): %+v", len(got), got)
	}
	if got[0].Op != "select" || got[1].Op != "select_and_reserve" || got[1].SelectionID != "b" || got[2].SelectionID != "a" {
		t.Errorf("log order/ops = %s %s/%s %s/%s, want newest first", got[0].Op, got[1].Op, got[1].SelectionID, got[2].Op, got[2].SelectionID)
	}
	b := got[1]
	if b.Candidates != 2 || b.RunnerUp == nil || b.RunnerUp.WorkerID == b.WorkerID || b.RunnerUp.Cost < b.Cost {
		t.Errorf("decision b weighed %d candidates, runner-up %+v against cost %v", b.Candidates, b.RunnerUp, b.Cost)
	}
	if b.ISLTokens != 8 || b.MatchedFraction() != 1 || got[2].MatchedFraction() != 0 {
		t.Errorf("matched fractions %v then %v (isl %d), want 0 then 1", got[2].MatchedFraction(), b.MatchedFraction(), b.ISLTokens)
	}
	if !b.Time.Equal(got[2].Time.Add(time.Second)) {
		t.Errorf("decision times %v, %v: not the injected clock", got[2].Time, b.Time)
	}

	stats := s.Inspect().RoutingStats()
	if len(stats) != 1 {
		t.Fatalf("routing stats for %d partitions, want 1", len(stats))
	}
	st := stats[0]
	if st.Model != "model" || st.Decisions != 3 || st.PromptTokens != 24 || st.CachedTokens != 16 || st.BestCachedTokens != 16 {
		t.Errorf("stats %+v, want 3 decisions, 24 prompt tokens, 16 cached, 16 at best", st)
	}
	if b.BestCachedTokens != 8 || got[2].BestCachedTokens != 0 {
		t.Errorf("best cached %d then %d, want 0 then 8", got[2].BestCachedTokens, b.BestCachedTokens)
	}
	if st.MatchedBuckets[0] != 1 || st.MatchedBuckets[len(st.MatchedBuckets)-2] != 1 || st.MatchedBuckets[len(st.MatchedBuckets)-1] != 3 || st.MatchedSum != 2 {
		t.Errorf("matched buckets %v sum %v, want one at 0 and two at 1", st.MatchedBuckets, st.MatchedSum)
	}
}

// A policy that does not read the cache gives it up: the decision and the
// routing totals keep what the best-cached rank had beside what the chosen
// one had.
func TestRoutingStatsCountTheCacheGivenUp(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	pol, err := scheduler.New("round-robin", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	first, err := s.SelectAndReserve(bg, selReq("a", tokens...))
	if err != nil {
		t.Fatal(err)
	}
	// Round-robin sends the same prompt to the other worker, which has
	// none of it; the first one holds all 8 tokens in the approximate index.
	second, err := s.SelectAndReserve(bg, selReq("b", tokens...))
	if err != nil {
		t.Fatal(err)
	}
	if second.WorkerID == first.WorkerID {
		t.Fatalf("round-robin chose worker %d twice", first.WorkerID)
	}
	if d := second.Decision; d.CachedTokens != 0 || d.BestCachedTokens != 8 {
		t.Errorf("second decision cached %d, best %d: want 0 and 8", d.CachedTokens, d.BestCachedTokens)
	}
	if rec := s.Inspect().RecentDecisions(1); len(rec) != 1 || rec[0].CachedTokens != 0 || rec[0].BestCachedTokens != 8 {
		t.Errorf("logged %+v, want cached 0 and best 8", rec)
	}
	st := s.Inspect().RoutingStats()
	if len(st) != 1 || st[0].CachedTokens != 0 || st[0].BestCachedTokens != 8 || st[0].PromptTokens != 16 {
		t.Errorf("routing stats %+v, want 16 prompt tokens, 0 cached, 8 at best", st)
	}
}
