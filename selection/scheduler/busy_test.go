package scheduler

import (
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

func u64(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }
func boolp(v bool) *bool     { return &v }
func show(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}

func TestBusyComparesActivePrefillWithThresholdTimesCapacity(t *testing.T) {
	for _, tc := range []struct {
		name      string
		active    int
		max       *uint64
		threshold float64
		want      bool
	}{
		{"below", 100, u64(1000), 0.5, false},
		{"at the threshold is not busy", 500, u64(1000), 0.5, false},
		{"above", 501, u64(1000), 0.5, true},
		{"unknown capacity is 10M tokens", 9_000_000, nil, 1, false},
		{"unknown capacity can still be exceeded", 10_000_001, nil, 1, true},
		{"threshold 0: any active prefill is busy", 1, u64(4), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Busy(tc.active, tc.max, tc.threshold); got != tc.want {
				t.Errorf("Busy = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAllBusyQueuesOnlyWhenEveryEligibleRankIsBusy(t *testing.T) {
	rank := func(id uint64, r uint32, active int, taints ...string) Candidate {
		return Candidate{Worker: index.WorkerKey{WorkerID: id, DPRank: r}, ActivePrefillTokens: active, MaxNumBatchedTokens: u64(100), Taints: taints}
	}
	fleet := []Candidate{rank(1, 0, 200), rank(1, 1, 0), rank(2, 0, 200, "gpu")}
	for _, tc := range []struct {
		name string
		req  Request
		want bool
	}{
		{"one idle rank admits", Request{}, false},
		{"allow list narrows to a busy worker", Request{AllowedWorkers: []uint64{2}}, true},
		{"required taint narrows to a busy worker", Request{RequiredTaints: []string{"gpu"}}, true},
		{"pinned busy rank waits", Request{Pinned: &index.WorkerKey{WorkerID: 1}}, true},
		{"pinned idle rank admits", Request{Pinned: &index.WorkerKey{WorkerID: 1, DPRank: 1}}, false},
		{"no eligible rank falls through to selection", Request{AllowedWorkers: []uint64{9}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AllBusy(&tc.req, fleet, 1); got != tc.want {
				t.Errorf("AllBusy = %v, want %v", got, tc.want)
			}
		})
	}
}

// Dynamo's selection core test of advisory selection
// (lib/kv-router/src/services/selection/core/tests.rs): thresholds prefill 0.5, decode 0.0, total_kv_blocks 1000,
// max_num_batched_tokens 1024 on an idle worker give decode_busy true and
// prefill_busy false; without thresholds or capacity both are omitted.
func TestBusyFlagsOfTheSelectionResponse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want *bool
	}{
		{"decode busy at threshold 0", DecodeBusy(1, u64(1000), f64(0)), boolp(true)},
		{"decode not busy below threshold", DecodeBusy(800, u64(1000), f64(0.8)), boolp(false)},
		{"decode busy above threshold", DecodeBusy(801, u64(1000), f64(0.8)), boolp(true)},
		{"decode omitted without threshold", DecodeBusy(1, u64(1000), nil), nil},
		{"decode omitted without capacity", DecodeBusy(1, nil, f64(0)), nil},
		{"prefill idle is not busy", PrefillBusy(0, u64(1024), f64(0.5)), boolp(false)},
		{"prefill busy", PrefillBusy(513, u64(1024), f64(0.5)), boolp(true)},
		{"prefill omitted without threshold", PrefillBusy(513, u64(1024), nil), nil},
		{"prefill unknown capacity is 10M", PrefillBusy(4_000_000, nil, f64(0.5)), boolp(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if (tc.got == nil) != (tc.want == nil) || (tc.got != nil && *tc.got != *tc.want) {
				t.Errorf("got %v, want %v", show(tc.got), show(tc.want))
			}
		})
	}
	if PrefillTokenCapacity(nil) != 10_000_000 || PrefillTokenCapacity(u64(8192)) != 8192 {
		t.Error("PrefillTokenCapacity")
	}
}

func TestOverlapRefreshDueOnceTheWaitReachesTheThreshold(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		wait  time.Duration
		after time.Duration
		want  bool
	}{
		{"short wait keeps the enqueue-time overlap", 9 * time.Second, DefaultOverlapRefreshAfter, false},
		{"exactly the threshold refreshes", 10 * time.Second, DefaultOverlapRefreshAfter, true},
		{"long wait refreshes", time.Minute, DefaultOverlapRefreshAfter, true},
		{"zero disables", time.Hour, 0, false},
		{"clock going back does not refresh", -time.Minute, time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := OverlapRefreshDue(t0, t0.Add(tc.wait), tc.after); got != tc.want {
				t.Errorf("OverlapRefreshDue = %v, want %v", got, tc.want)
			}
		})
	}
}
