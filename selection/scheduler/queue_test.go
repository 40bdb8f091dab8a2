package scheduler

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

type arrival struct {
	name     string
	at       float64 // seconds after epoch
	isl      int
	cached   int
	jump     float64
	strict   uint32
	wantRank int // expected dequeue position
}

// Ports of scheduling/policy.rs tests (fcfs, lcfs, wspt, strict priority) plus FIFO ties.
func TestQueueOrdersByStrictPriorityThenPolicyScore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   QueuePolicy
		arrivals []arrival
	}{
		{"fcfs: first come first served", FCFS, []arrival{
			{name: "a", at: 0, isl: 512, wantRank: 0}, {name: "b", at: 1, isl: 512, wantRank: 1}, {name: "c", at: 2, isl: 512, wantRank: 2},
		}},
		{"fcfs: priority jump beats earlier arrival", FCFS, []arrival{
			{name: "a", at: 0, isl: 512, wantRank: 1}, {name: "b", at: 5, isl: 512, jump: 50, wantRank: 0},
		}},
		{"fcfs: jump is measured in seconds", FCFS, []arrival{
			{name: "a", at: 0, isl: 512, wantRank: 0}, {name: "b", at: 5, isl: 512, jump: 4, wantRank: 1},
		}},
		{"fcfs: negative jump counts as zero", FCFS, []arrival{
			{name: "a", at: 0, isl: 512, jump: -100, wantRank: 0}, {name: "b", at: 1, isl: 512, wantRank: 1},
		}},
		{"fcfs: equal keys keep arrival order", FCFS, []arrival{
			{name: "a", at: 3, isl: 1, wantRank: 0}, {name: "b", at: 3, isl: 1, wantRank: 1}, {name: "c", at: 3, isl: 1, wantRank: 2},
		}},
		{"lcfs: latest first", LCFS, []arrival{
			{name: "a", at: 1, isl: 512, wantRank: 1}, {name: "b", at: 10, isl: 512, wantRank: 0},
		}},
		{"lcfs: priority jump promotes", LCFS, []arrival{
			{name: "a", at: 10, isl: 512, wantRank: 1}, {name: "b", at: 10, isl: 512, jump: 100, wantRank: 0},
		}},
		{"strict priority precedes fcfs score", FCFS, []arrival{
			{name: "low", at: 0, isl: 512, jump: 1000, wantRank: 1}, {name: "high", at: 1000, isl: 512, strict: 1, wantRank: 0},
		}},
		{"strict priority precedes lcfs score", LCFS, []arrival{
			{name: "low", at: 1000, isl: 512, jump: 1000, wantRank: 1}, {name: "high", at: 0, isl: 512, strict: 1, wantRank: 0},
		}},
		{"strict priority precedes wspt score", WSPT, []arrival{
			{name: "low", isl: 1, jump: 1000, wantRank: 1}, {name: "high", isl: 10_000, strict: 1, wantRank: 0},
		}},
		{"wspt: shorter request first", WSPT, []arrival{
			{name: "long", isl: 1000, wantRank: 1}, {name: "short", at: 1, isl: 100, wantRank: 0},
		}},
		{"wspt: overlap reduces the effective cost", WSPT, []arrival{
			{name: "cold", isl: 1024, wantRank: 1}, {name: "warm", at: 1, isl: 1024, cached: 960, wantRank: 0},
		}},
		{"wspt: priority jump promotes", WSPT, []arrival{
			{name: "normal", isl: 512, wantRank: 1}, {name: "boosted", at: 1, isl: 512, jump: 5, wantRank: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := NewQueue[string](tc.policy, epoch)
			for _, a := range tc.arrivals {
				q.Push(epoch.Add(secs(a.at)), Entry[string]{Payload: a.name, ISL: a.isl, CachedTokens: a.cached, PriorityJump: a.jump, StrictPriority: a.strict})
			}
			want := make([]string, len(tc.arrivals))
			for _, a := range tc.arrivals {
				want[a.wantRank] = a.name
			}
			var got []string
			for q.Len() > 0 {
				e, _ := q.Pop()
				got = append(got, e.Payload)
			}
			if !slices.Equal(got, want) {
				t.Errorf("dequeue order %v, want %v", got, want)
			}
		})
	}
}

// policy.rs wspt_* tests: the exact WSPT score, with BestCachedTokens
// choosing the cached prefix the way SchedulingContext::best_cached_tokens does.
func TestWSPTScoreUsesBestEligibleCachedPrefix(t *testing.T) {
	cands := func(devices ...uint32) []Candidate {
		out := make([]Candidate, len(devices))
		for i, d := range devices {
			out[i] = Candidate{Worker: key(uint64(i)), Overlap: index.Overlap{Device: d}}
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		req   Request
		cands []Candidate
		jump  float64
		want  float64
	}{
		{"max overlap over workers", Request{ISL: 1024}, cands(10, 20, 50, 60), 0, 1.0 / 64},
		{"no overlap falls back to isl", Request{ISL: 512}, nil, 0, 1.0 / 512},
		{"full overlap clamps to one token", Request{ISL: 512}, cands(64), 0, 1},
		{"pinned worker's own overlap", Request{ISL: 1024, Pinned: &index.WorkerKey{WorkerID: 1}}, cands(60, 1), 0, 1.0 / 1008},
		{"missing pinned overlap is zero", Request{ISL: 1024, Pinned: &index.WorkerKey{WorkerID: 9}}, cands(60), 0, 1.0 / 1024},
		{"required taints ignore incompatible overlap", Request{ISL: 1024, RequiredTaints: []string{"mdc-b"}},
			[]Candidate{
				{Worker: key(0), Overlap: index.Overlap{Device: 60}, Taints: []string{"mdc-a"}},
				{Worker: key(1), Overlap: index.Overlap{Device: 1}, Taints: []string{"mdc-b"}},
			}, 0, 1.0 / 1008},
		{"overloaded workers' overlap is ignored", Request{ISL: 1024},
			[]Candidate{{Worker: key(0), Overlap: index.Overlap{Device: 60}, Overloaded: true}}, 0, 1.0 / 1024},
		{"overlap counts when prefill is not tracked", Request{ISL: 1024, Weights: Weights{TrackPrefillTokens: false}}, cands(60), 0, 1.0 / 64},
		{"priority jump weighs the score", Request{ISL: 512}, nil, 3, 4.0 / 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			req.BlockSize = 16
			cached := BestCachedTokens(&req, tc.cands)
			q := NewQueue[int](WSPT, epoch)
			q.Push(epoch, Entry[int]{ISL: req.ISL, CachedTokens: cached, PriorityJump: tc.jump})
			if got := q.Peek().Score(); got != tc.want {
				t.Errorf("score = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestQueueAccountsPendingLoad(t *testing.T) {
	q := NewQueue[int](FCFS, epoch)
	q.Push(epoch, Entry[int]{Payload: 1, ISL: 100, CachedTokens: 40})
	q.Push(epoch.Add(time.Second), Entry[int]{Payload: 2, ISL: 50, CachedTokens: 80}) // cached clamps to 50
	q.Push(epoch.Add(2*time.Second), Entry[int]{Payload: 3, ISL: 10})
	if q.Len() != 3 || q.PendingISL() != 160 || q.PendingCachedTokens() != 90 {
		t.Fatalf("len %d isl %d cached %d, want 3 160 90", q.Len(), q.PendingISL(), q.PendingCachedTokens())
	}
	removed := q.Remove(func(e *Entry[int]) bool { return e.Payload != 2 })
	if got := []int{removed[0].Payload, removed[1].Payload}; !slices.Equal(got, []int{1, 3}) {
		t.Errorf("removed %v in that order, want [1 3]", got)
	}
	if q.Len() != 1 || q.PendingISL() != 50 || q.PendingCachedTokens() != 50 {
		t.Errorf("after remove: len %d isl %d cached %d, want 1 50 50", q.Len(), q.PendingISL(), q.PendingCachedTokens())
	}
	if e, ok := q.Pop(); !ok || e.Payload != 2 || !e.Enqueued.Equal(epoch.Add(time.Second)) {
		t.Errorf("pop = %+v, %v", e, ok)
	}
	if _, ok := q.Pop(); ok || q.Peek() != nil || q.PendingISL() != 0 {
		t.Error("empty queue still yields entries")
	}
}

func TestPopReadyBlocksBehindAnUnreadyHead(t *testing.T) {
	q := NewQueue[string](FCFS, epoch)
	q.Push(epoch, Entry[string]{Payload: "head", ISL: 1})
	q.Push(epoch.Add(time.Second), Entry[string]{Payload: "next", ISL: 1})
	notHead := func(e *Entry[string]) bool { return e.Payload != "head" }
	if _, ok := q.PopReady(notHead); ok {
		t.Fatal("popped past a head that is not ready")
	}
	if e, ok := q.PopReady(func(*Entry[string]) bool { return true }); !ok || e.Payload != "head" {
		t.Fatalf("PopReady = %q, %v, want head", e.Payload, ok)
	}
	if e, ok := q.PopReady(notHead); !ok || e.Payload != "next" {
		t.Fatalf("PopReady = %q, %v, want next", e.Payload, ok)
	}
}

// A heap stress against a sorted reference: interleaved pushes and pops keep order.
func TestQueueMatchesSortedReference(t *testing.T) {
	rnd := seeded(7)
	for _, policy := range []QueuePolicy{FCFS, WSPT, LCFS} {
		q := NewQueue[int](policy, epoch)
		var ref []Entry[int]
		for i := range 2000 {
			if rnd.IntN(3) > 0 || len(ref) == 0 {
				e := Entry[int]{Payload: i, ISL: 1 + rnd.IntN(50), PriorityJump: float64(rnd.IntN(3)), StrictPriority: uint32(rnd.IntN(2))}
				q.Push(epoch.Add(secs(float64(i/4))), e)
				ref = append(ref, *q.find(i))
				continue
			}
			slices.SortStableFunc(ref, func(a, b Entry[int]) int {
				if before(&a, &b) {
					return -1
				}
				if before(&b, &a) {
					return 1
				}
				return 0
			})
			got, _ := q.Pop()
			if got.Payload != ref[0].Payload {
				t.Fatalf("%v: popped %d, reference head %d", policy, got.Payload, ref[0].Payload)
			}
			ref = ref[1:]
		}
	}
}

func (q *Queue[T]) find(payload int) *Entry[T] {
	for i := range q.heap {
		if any(q.heap[i].Payload) == any(payload) {
			return &q.heap[i]
		}
	}
	return nil
}

func TestParseQueuePolicy(t *testing.T) {
	for _, p := range []QueuePolicy{FCFS, WSPT, LCFS} {
		got, err := ParseQueuePolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParseQueuePolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParseQueuePolicy("sjf"); !errors.Is(err, ErrQueuePolicy) {
		t.Errorf("ParseQueuePolicy(sjf) err = %v", err)
	}
}
