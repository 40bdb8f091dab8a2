package loads

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

var (
	t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w1 = index.WorkerKey{WorkerID: 1}
	w2 = index.WorkerKey{WorkerID: 2, DPRank: 2}
	w3 = index.WorkerKey{WorkerID: 2, DPRank: 3}
)

func newTracker(t testing.TB, cfg Config, ws ...index.WorkerKey) *Tracker {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr.SetWorkers(ws)
	return tr
}

func mustAdd(t testing.TB, tr *Tracker, now time.Time, b Booking) {
	t.Helper()
	if err := tr.Add(now, b); err != nil {
		t.Fatalf("Add(%s): %v", b.RequestID, err)
	}
}

func load1(t testing.TB, tr *Tracker, w index.WorkerKey) WorkerLoad {
	t.Helper()
	for _, l := range tr.Loads() {
		if l.Worker == w {
			return l
		}
	}
	t.Fatalf("no load row for %v", w)
	return WorkerLoad{}
}

func frac(f float64) *float64 { return &f }
func u32(v uint32) *uint32    { return &v }

func TestNewValidatesConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", DefaultConfig(16), true},
		{"zero block size", Config{TrackActiveBlocks: true}, false},
		{"output blocks need active blocks", Config{BlockSize: 16, TrackOutputBlocks: true}, false},
		{"negative expiry", Config{BlockSize: 16, TrackActiveBlocks: true, Expiry: -time.Second}, false},
		{"zero expiry means default", Config{BlockSize: 16, TrackActiveBlocks: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := New(tc.cfg)
			if tc.ok != (err == nil) {
				t.Fatalf("New(%+v) error = %v, want ok=%v", tc.cfg, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v is not ErrInvalidConfig", err)
			}
			if tr != nil && tr.Config().Expiry != DefaultExpiry {
				t.Fatalf("expiry = %v, want %v", tr.Config().Expiry, DefaultExpiry)
			}
		})
	}
}

// Port of single.rs test_active_sequences_shared_blocks (newest version).
func TestSharedPromptBlocksCountOnce(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w1)
	type step struct {
		op           string
		id           string
		hashes       []uint64
		prefill      int
		blocks, toks int
	}
	for _, s := range []step{
		{"add", "request_1", []uint64{1, 2, 3}, 12, 3, 12},
		{"add", "request_2", []uint64{5}, 4, 4, 16},
		{"add", "request_3", []uint64{1, 2, 3, 4}, 0, 5, 16},
		{"free", "request_2", nil, 0, 4, 12},
		{"free", "request_3", nil, 0, 3, 12},
		{"free", "request_1", nil, 0, 0, 0},
	} {
		if s.op == "add" {
			mustAdd(t, tr, t0, Booking{RequestID: s.id, Worker: w1, TrackingHashes: s.hashes, PrefillTokens: s.prefill, TrackPrefill: true})
		} else if err := tr.Free(s.id); err != nil {
			t.Fatal(err)
		}
		got := load1(t, tr, w1)
		if got.ActiveDecodeBlocks != s.blocks || got.ActivePrefillTokens != s.toks {
			t.Fatalf("after %s %s: blocks %d tokens %d, want %d %d", s.op, s.id, got.ActiveDecodeBlocks, got.ActivePrefillTokens, s.blocks, s.toks)
		}
	}
}

// Port of single.rs test_output_blocks_with_fractional_decay.
func TestOutputBlockDecayWeightsOnlyExclusiveBlocks(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w1)
	blocks := func() int { return load1(t, tr, w1).ActiveDecodeBlocks }
	mustAdd(t, tr, t0, Booking{RequestID: "r1", Worker: w1, TrackingHashes: []uint64{1, 2, 3}})
	if got := blocks(); got != 3 {
		t.Fatalf("blocks = %d, want 3", got)
	}
	// Four exclusive blocks (three prompt, one output) at 0.5.
	if err := tr.AddOutputBlock("r1", frac(0.5)); err != nil {
		t.Fatal(err)
	}
	if got := blocks(); got != 2 {
		t.Fatalf("after decay 0.5: blocks = %d, want 2", got)
	}
	// Sharing [1,2] keeps their 0.5 weight and adds nothing.
	mustAdd(t, tr, t0, Booking{RequestID: "r2", Worker: w1, TrackingHashes: []uint64{1, 2}})
	if got := blocks(); got != 2 {
		t.Fatalf("after shared add: blocks = %d, want 2", got)
	}
	// 0.0 re-weights only r1's exclusive blocks: 3 and both outputs.
	if err := tr.AddOutputBlock("r1", frac(0)); err != nil {
		t.Fatal(err)
	}
	if got := blocks(); got != 1 {
		t.Fatalf("after decay 0.0: blocks = %d, want 1", got)
	}
	for _, id := range []string{"r2", "r1"} {
		if err := tr.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := load1(t, tr, w1); got != (WorkerLoad{Worker: w1}) {
		t.Fatalf("after freeing all: %+v", got)
	}
}

func TestActiveBlocksRoundHalfAwayFromZero(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hashes []uint64
		decay  float64
		want   int
	}{
		{"output only at 0.5 rounds up", nil, 0.5, 1},
		{"prompt and output at 0.25 sum to a half and round up", []uint64{1}, 0.25, 1},
		{"prompt and output at 0.2 round down", []uint64{1}, 0.2, 0},
		{"two at 0.75 round to 2", []uint64{1}, 0.75, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(t, DefaultConfig(4), w1)
			mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: tc.hashes})
			if err := tr.AddOutputBlock("r", frac(tc.decay)); err != nil {
				t.Fatal(err)
			}
			if got := load1(t, tr, w1).ActiveDecodeBlocks; got != tc.want {
				t.Fatalf("blocks = %d, want %d", got, tc.want)
			}
		})
	}
}

// Ports of single.rs test_mark_prefill_completed and of the selection core
// tests' (services/selection/core/tests.rs) prefill_complete cases: repeating
// it is idempotent, and it takes the prefill load to 0 while the blocks stay.
func TestPrefillCompleteIsIdempotentAndKeepsBlocks(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w1)
	mustAdd(t, tr, t0, Booking{RequestID: "r1", Worker: w1, TrackingHashes: []uint64{1, 2, 3}, ISL: 12, PrefillTokens: 12, TrackPrefill: true})
	for i := range 2 {
		if err := tr.PrefillComplete("r1"); err != nil {
			t.Fatalf("prefill complete #%d: %v", i+1, err)
		}
		if got, want := load1(t, tr, w1), (WorkerLoad{Worker: w1, ActiveDecodeBlocks: 3, ActiveRequests: 1}); got != want {
			t.Fatalf("prefill complete #%d: %+v, want %+v", i+1, got, want)
		}
	}
	mustAdd(t, tr, t0, Booking{RequestID: "r2", Worker: w1, TrackingHashes: []uint64{4, 5}, PrefillTokens: 8, TrackPrefill: true})
	if got := load1(t, tr, w1).ActivePrefillTokens; got != 8 {
		t.Fatalf("tokens = %d, want 8", got)
	}
	if err := tr.Free("r2"); err != nil {
		t.Fatal(err)
	}
	if got := load1(t, tr, w1).ActivePrefillTokens; got != 0 {
		t.Fatalf("free left %d prefill tokens", got)
	}
}

// single.rs test_force_expiry / test_force_expiry_uses_custom_duration, with the
// selection service's rule: absolute age from admission, strictly greater than
// the expiry.
func TestExpireReclaimsByAbsoluteAgeSinceAdmission(t *testing.T) {
	for _, tc := range []struct {
		name    string
		expiry  time.Duration
		at      time.Duration
		expired []string
	}{
		{"default: live at 121 s", 0, 121 * time.Second, nil},
		{"default: live at exactly 300 s", 0, 300 * time.Second, nil},
		{"default: r1 reclaimed just past 300 s", 0, 300*time.Second + time.Nanosecond, []string{"r1"}},
		{"default: both reclaimed once r2 is past 300 s", 0, 300*time.Second + time.Millisecond + time.Nanosecond, []string{"r1", "r2"}},
		{"custom 60 s: reclaimed at 61 s", 60 * time.Second, 61 * time.Second, []string{"r1", "r2"}},
		{"custom 60 s: r2 admitted later stays", 60 * time.Second, 60*time.Second + time.Millisecond, []string{"r1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig(4)
			cfg.Expiry = tc.expiry
			tr := newTracker(t, cfg, w1)
			mustAdd(t, tr, t0, Booking{RequestID: "r1", Worker: w1, TrackingHashes: []uint64{1, 2}, PrefillTokens: 8, TrackPrefill: true})
			mustAdd(t, tr, t0.Add(time.Millisecond), Booking{RequestID: "r2", Worker: w1, TrackingHashes: []uint64{3, 4}, PrefillTokens: 8, TrackPrefill: true})
			// Progress does not refresh the admission age.
			if err := tr.PrefillComplete("r1"); err != nil {
				t.Fatal(err)
			}
			if err := tr.AddOutputBlock("r1", nil); err != nil {
				t.Fatal(err)
			}
			got := tr.Expire(t0.Add(tc.at))
			if !slices.Equal(got, tc.expired) {
				t.Fatalf("Expire = %v, want %v", got, tc.expired)
			}
			for _, id := range tc.expired {
				if _, ok := tr.Has(id); ok {
					t.Fatalf("%s still live after expiry", id)
				}
				if err := tr.Free(id); !errors.Is(err, ErrRequestNotFound) {
					t.Fatalf("Free(expired %s) = %v, want ErrRequestNotFound", id, err)
				}
			}
			if len(tc.expired) == 2 {
				if got := load1(t, tr, w1); got != (WorkerLoad{Worker: w1}) {
					t.Fatalf("after expiring all: %+v", got)
				}
			}
		})
	}
}

// The HTTP-level tests of Dynamo's selection service
// (lib/kv-router/src/services/selection/tests.rs) that exercise active load,
// restated at this package's boundary (block_size 4; the tracking hash of the
// one-block prompt [1,2,3,4] stands in as 0xabc). Each case names its Dynamo
// test.
func TestSelectionServiceLoadScenarios(t *testing.T) {
	const h = 0xabc
	type check struct {
		prefill, decode, requests int
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, tr *Tracker) check
		want check
	}{
		{
			// select_and_reserve_books_and_duplicate_reservation_conflicts:
			// select_and_reserve books; repeat conflicts; DELETE frees.
			name: "booking counts prefill and conflicts on repeat",
			run: func(t *testing.T, tr *Tracker) check {
				b := Booking{RequestID: "res-a", Worker: w1, TrackingHashes: []uint64{h}, ISL: 4, PrefillTokens: 4, TrackPrefill: true}
				mustAdd(t, tr, t0, b)
				if err := tr.Add(t0, b); !errors.Is(err, ErrDuplicateRequest) {
					t.Fatalf("repeat Add = %v, want ErrDuplicateRequest", err)
				}
				l := load1(t, tr, w1)
				if err := tr.Free("res-a"); err != nil {
					t.Fatal(err)
				}
				return check{l.ActivePrefillTokens, l.ActiveDecodeBlocks, l.ActiveRequests}
			},
			want: check{4, 1, 1},
		},
		{
			// explicit_replay_preserves_disabled_prefill_tracking: disabled
			// prefill tracking survives explicit replay; /potential_loads for
			// the same prompt still reports 1 block.
			name: "disabled prefill tracking books no prefill and dedupes the prompt",
			run: func(t *testing.T, tr *Tracker) check {
				mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: []uint64{h}, ISL: 4, PrefillTokens: 4})
				p, ok := tr.Project1(w1, []uint64{h})
				if !ok || p.PotentialDecodeBlocks() != 1 {
					t.Fatalf("potential decode blocks = %d (ok %v), want 1", p.PotentialDecodeBlocks(), ok)
				}
				l := load1(t, tr, w1)
				return check{l.ActivePrefillTokens, l.ActiveDecodeBlocks, l.ActiveRequests}
			},
			want: check{0, 1, 1},
		},
		{
			// output_block_endpoint_updates_reserved_load: output_block {} adds
			// exactly one block; 1.5 is rejected first.
			name: "output block adds exactly one block and rejects decay 1.5",
			run: func(t *testing.T, tr *Tracker) check {
				mustAdd(t, tr, t0, Booking{RequestID: "res-output", Worker: w1, TrackingHashes: []uint64{h}, ISL: 4, PrefillTokens: 4, TrackPrefill: true})
				before := load1(t, tr, w1).ActiveDecodeBlocks
				if err := tr.AddOutputBlock("res-output", nil); err != nil {
					t.Fatal(err)
				}
				err := tr.AddOutputBlock("res-output", frac(1.5))
				if !errors.Is(err, ErrDecayFraction) || err.Error() != "decay_fraction must be between 0.0 and 1.0" {
					t.Fatalf("decay 1.5: %v", err)
				}
				l := load1(t, tr, w1)
				return check{l.ActivePrefillTokens, l.ActiveDecodeBlocks - before, l.ActiveRequests}
			},
			want: check{4, 1, 1},
		},
		{
			// explicit_reservation_books_after_select: explicit reservation
			// with sequence_hashes [1], then prefill_complete.
			name: "explicit reservation books prefill then prefill complete clears it",
			run: func(t *testing.T, tr *Tracker) check {
				mustAdd(t, tr, t0, Booking{RequestID: "res-b", Worker: w1, TrackingHashes: []uint64{1}, ISL: 4, PrefillTokens: 4, TrackPrefill: true})
				if got := load1(t, tr, w1).ActivePrefillTokens; got != 4 {
					t.Fatalf("prefill before complete = %d, want 4", got)
				}
				if err := tr.PrefillComplete("res-b"); err != nil {
					t.Fatal(err)
				}
				l := load1(t, tr, w1)
				return check{l.ActivePrefillTokens, l.ActiveDecodeBlocks, l.ActiveRequests}
			},
			want: check{0, 1, 1},
		},
		{
			// cached_booking_honors_prefill_tracking: cached booking honours
			// prefill tracking off, then on.
			name: "prefill counted only when the booking tracks it",
			run: func(t *testing.T, tr *Tracker) check {
				mustAdd(t, tr, t0, Booking{RequestID: "off", Worker: w1, TrackingHashes: []uint64{h}, ISL: 4, PrefillTokens: 4})
				if got := load1(t, tr, w1).ActivePrefillTokens; got != 0 {
					t.Fatalf("untracked prefill = %d, want 0", got)
				}
				if err := tr.Free("off"); err != nil {
					t.Fatal(err)
				}
				mustAdd(t, tr, t0, Booking{RequestID: "on", Worker: w1, TrackingHashes: []uint64{h}, ISL: 4, PrefillTokens: 4, TrackPrefill: true})
				l := load1(t, tr, w1)
				return check{l.ActivePrefillTokens, l.ActiveDecodeBlocks, l.ActiveRequests}
			},
			want: check{4, 1, 1},
		},
		{
			// POST /potential_loads: active blocks are deduplicated by tracking
			// hash, so a booked prompt adds no block.
			name: "potential loads dedupe a booked prompt",
			run: func(t *testing.T, tr *Tracker) check {
				mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: []uint64{h}, ISL: 4, PrefillTokens: 4, TrackPrefill: true})
				ps := tr.Project([]uint64{h}, nil)
				if len(ps) != 1 || ps[0].PotentialDecodeBlocks() != 1 || ps[0].AdditionalBlocks != 0 {
					t.Fatalf("projection = %+v, want potential 1, additional 0", ps)
				}
				return check{ps[0].ActivePrefillTokens, ps[0].PotentialDecodeBlocks(), ps[0].ActiveRequests}
			},
			want: check{4, 1, 1},
		},
		{
			// select_echoes_selection_id_and_does_not_book_load: a query-only
			// select books nothing; /loads shows a zero row.
			name: "idle rank reports a zero row",
			run: func(t *testing.T, tr *Tracker) check {
				l := load1(t, tr, w1)
				return check{l.ActivePrefillTokens, l.ActiveDecodeBlocks, l.ActiveRequests}
			},
			want: check{0, 0, 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(t, DefaultConfig(4), w1)
			if got := tc.run(t, tr); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The lifecycle error cases of Dynamo's selection core tests
// (services/selection/core/tests.rs), at this package's boundary.
func TestLifecycleErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(tr *Tracker) error
		want error
	}{
		{"second free is not found", func(tr *Tracker) error {
			_ = tr.Free("r")
			return tr.Free("r")
		}, ErrRequestNotFound},
		{"output block after free is not found", func(tr *Tracker) error {
			_ = tr.Free("r")
			return tr.AddOutputBlock("r", nil)
		}, ErrRequestNotFound},
		{"prefill complete after free is not found", func(tr *Tracker) error {
			_ = tr.Free("r")
			return tr.PrefillComplete("r")
		}, ErrRequestNotFound},
		{"output tokens after free is not found", func(tr *Tracker) error {
			_ = tr.Free("r")
			_, err := tr.RecordOutputTokens("r", 100)
			return err
		}, ErrRequestNotFound},
		{"decay fraction is checked before the lookup", func(tr *Tracker) error {
			return tr.AddOutputBlock("unknown", frac(-0.1))
		}, ErrDecayFraction},
		{"NaN decay fraction is rejected", func(tr *Tracker) error {
			return tr.AddOutputBlock("r", frac(math.NaN()))
		}, ErrDecayFraction},
		{"decay fractions 0 and 1 are accepted", func(tr *Tracker) error {
			return errors.Join(tr.AddOutputBlock("r", frac(0)), tr.AddOutputBlock("r", frac(1)))
		}, nil},
		{"booking an unregistered rank is refused", func(tr *Tracker) error {
			return tr.Add(t0, Booking{RequestID: "peer", Worker: index.WorkerKey{WorkerID: 9}})
		}, ErrWorkerNotFound},
		{"live id on another rank conflicts", func(tr *Tracker) error {
			return tr.Add(t0, Booking{RequestID: "r", Worker: w2})
		}, ErrDuplicateRequest},
		{"freed id can be booked again", func(tr *Tracker) error {
			_ = tr.Free("r")
			return tr.Add(t0, Booking{RequestID: "r", Worker: w2})
		}, nil},
		{"negative prefill is an invalid booking", func(tr *Tracker) error {
			return tr.Add(t0, Booking{RequestID: "neg", Worker: w1, PrefillTokens: -1})
		}, ErrInvalidBooking},
		{"empty id is an invalid booking", func(tr *Tracker) error {
			return tr.Add(t0, Booking{Worker: w1})
		}, ErrInvalidBooking},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(t, DefaultConfig(4), w1, w2)
			mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: []uint64{1}, PrefillTokens: 4, TrackPrefill: true})
			err := tc.run(tr)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			for _, l := range tr.Loads() {
				if l.ActiveDecodeBlocks < 0 || l.ActivePrefillTokens < 0 || l.ActiveRequests < 0 {
					t.Fatalf("negative load %+v", l)
				}
			}
		})
	}
}

func TestSetWorkersDropsBookingsOfDepartedRanks(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w3, w1, w2)
	if got := tr.Loads(); len(got) != 3 || got[0].Worker != w1 || got[1].Worker != w2 || got[2].Worker != w3 {
		t.Fatalf("Loads not sorted by (worker_id, dp_rank): %+v", got)
	}
	mustAdd(t, tr, t0, Booking{RequestID: "b", Worker: w3, TrackingHashes: []uint64{1, 2}, PrefillTokens: 8, TrackPrefill: true})
	mustAdd(t, tr, t0, Booking{RequestID: "a", Worker: w3, TrackingHashes: []uint64{1, 3}})
	mustAdd(t, tr, t0, Booking{RequestID: "c", Worker: w2, TrackingHashes: []uint64{1, 2}})
	// DP shrink: rank 3 leaves, rank 2 and its booking stay.
	dropped := tr.SetWorkers([]index.WorkerKey{w1, w2})
	if !slices.Equal(dropped, []string{"a", "b"}) {
		t.Fatalf("dropped = %v, want [a b]", dropped)
	}
	if tr.HasWorker(w3) {
		t.Fatal("w3 still registered")
	}
	if w, ok := tr.Has("c"); !ok || w != w2 {
		t.Fatalf("Has(c) = %v %v", w, ok)
	}
	if got := load1(t, tr, w2); got.ActiveDecodeBlocks != 2 || got.ActiveRequests != 1 {
		t.Fatalf("w2 load %+v", got)
	}
	// The rank coming back starts empty (delete + re-add starts empty).
	tr.SetWorkers([]index.WorkerKey{w1, w2, w3})
	if got := load1(t, tr, w3); got != (WorkerLoad{Worker: w3}) {
		t.Fatalf("re-added w3 load %+v", got)
	}
	if err := tr.Free("c"); err != nil {
		t.Fatal(err)
	}
	for _, r := range tr.sorted {
		if len(r.held) != 0 {
			t.Fatalf("rank %v still holds %d paths", r.key, len(r.held))
		}
	}
}

// TestBookingsFollowTheirRanksWhenPacked: a change of the rank set moves
// every rank into one array; live bookings keep counting on, and leave
// from, their own rank, and the ranks stay sorted.
func TestBookingsFollowTheirRanksWhenPacked(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w1, w3)
	mustAdd(t, tr, t0, Booking{RequestID: "a", Worker: w3, TrackingHashes: []uint64{1, 2}, PrefillTokens: 8, TrackPrefill: true})
	mustAdd(t, tr, t0, Booking{RequestID: "b", Worker: w1, TrackingHashes: []uint64{1}})
	before := tr.Loads()
	w0 := index.WorkerKey{WorkerID: 0}
	tr.SetWorkers([]index.WorkerKey{w3, w0, w2, w1}) // two ranks join: the set is packed
	got := tr.Loads()
	if len(got) != 4 || got[0].Worker != w0 || got[1] != before[0] || got[2] != (WorkerLoad{Worker: w2}) || got[3] != before[1] {
		t.Fatalf("loads after packing %+v, before %+v", got, before)
	}
	for i, r := range tr.sorted {
		if tr.ranks[r.key] != r || (i > 0 && compareKeys(tr.sorted[i-1].key, r.key) >= 0) {
			t.Fatalf("rank %v: map and sorted list disagree", r.key)
		}
	}
	if err := tr.PrefillComplete("a"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Free("b"); err != nil {
		t.Fatal(err)
	}
	if l := load1(t, tr, w3); l.ActivePrefillTokens != 0 || l.ActiveDecodeBlocks != 2 || l.ActiveRequests != 1 {
		t.Fatalf("w3 after its booking's prefill completed: %+v", l)
	}
	if l := load1(t, tr, w1); l != (WorkerLoad{Worker: w1}) {
		t.Fatalf("w1 after its booking left: %+v", l)
	}
	if err := tr.Free("a"); err != nil {
		t.Fatal(err)
	}
	for _, l := range tr.Loads() {
		if l != (WorkerLoad{Worker: l.Worker}) {
			t.Fatalf("load left after every booking left: %+v", l)
		}
	}
}

func TestProjectionCountsBlocksNotYetActive(t *testing.T) {
	tr := newTracker(t, DefaultConfig(16), w1, w2)
	// Standalone slot-tracker case: [1,2,3] active, prompt [1,2,4] adds one block.
	mustAdd(t, tr, t0, Booking{RequestID: "req-1", Worker: w1, TrackingHashes: []uint64{1, 2, 3}, PrefillTokens: 8, TrackPrefill: true})
	// Path identity: [3,2] shares no prefix with [1,2], so 2 counts twice.
	mustAdd(t, tr, t0, Booking{RequestID: "req-2", Worker: w2, TrackingHashes: []uint64{1, 2}})
	mustAdd(t, tr, t0, Booking{RequestID: "req-3", Worker: w2, TrackingHashes: []uint64{3, 2}})
	for _, tc := range []struct {
		name       string
		w          index.WorkerKey
		query      []uint64
		active     int
		additional int
	}{
		{"shared prefix then a new block", w1, []uint64{1, 2, 4}, 3, 1},
		{"whole prompt active", w1, []uint64{1, 2, 3}, 3, 0},
		{"longer prompt", w1, []uint64{1, 2, 3, 4, 5}, 3, 2},
		{"no shared prefix", w1, []uint64{2, 3}, 3, 2},
		{"empty prompt", w1, nil, 3, 0},
		{"same hash under another parent is not shared", w2, []uint64{2}, 4, 1},
		{"prefix walk stops at the first miss", w2, []uint64{1, 9, 2}, 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := tr.Project1(tc.w, tc.query)
			if !ok {
				t.Fatal("rank not registered")
			}
			if p.ActiveDecodeBlocks != tc.active || p.AdditionalBlocks != tc.additional || p.TrackedBlocks != len(tc.query) {
				t.Fatalf("projection %+v, want active %d additional %d", p, tc.active, tc.additional)
			}
			all := tr.Project(tc.query, make([]Projection, 0, 2))
			if i := slices.IndexFunc(all, func(q Projection) bool { return q.Worker == tc.w }); i < 0 || all[i] != p {
				t.Fatalf("Project row %+v differs from Project1 %+v", all, p)
			}
		})
	}
	if _, ok := tr.Project1(w3, nil); ok {
		t.Fatal("Project1 of an unregistered rank reported ok")
	}
}

func TestUntrackedActiveBlocksIgnorePromptHashes(t *testing.T) {
	cfg := DefaultConfig(4)
	cfg.TrackActiveBlocks = false
	tr := newTracker(t, cfg, w1)
	mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: []uint64{1, 2, 3}})
	p, _ := tr.Project1(w1, []uint64{1, 2, 3, 4})
	if p.ActiveDecodeBlocks != 0 || p.AdditionalBlocks != 0 || p.TrackedBlocks != 0 || p.ActiveRequests != 1 {
		t.Fatalf("projection %+v, want no blocks and one request", p)
	}
	// The service's /output_block still adds a block.
	if err := tr.AddOutputBlock("r", nil); err != nil {
		t.Fatal(err)
	}
	if got := load1(t, tr, w1).ActiveDecodeBlocks; got != 1 {
		t.Fatalf("blocks = %d, want 1", got)
	}
}

// push_router.rs: one output block per call that crosses into a new block of
// isl+generated, weighted 1 − generated/expected.
func TestRecordOutputTokensEmitsAtBlockBoundaries(t *testing.T) {
	type step struct {
		generated int
		added     bool
		blocks    int
	}
	for _, tc := range []struct {
		name     string
		track    bool
		expected *uint32
		steps    []step
	}{
		{"disabled never adds", false, nil, []step{{1, false, 2}, {100, false, 2}}},
		// 10 → 20 tokens crosses two boundaries (3 → 5 blocks) but adds one block.
		{"one block per boundary call", true, nil, []step{{1, false, 2}, {3, true, 3}, {4, false, 3}, {14, true, 4}, {14, false, 4}}},
		// isl 6: prompt blocks (2) and the output blocks are exclusive, so all
		// take the decay weight: 3 × 0.7 = 2.1 → 2; then 4 × 0.0 → 0.
		{"decay from expected output tokens", true, u32(10), []step{{3, true, 2}, {10, true, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig(4)
			cfg.TrackOutputBlocks = tc.track
			tr := newTracker(t, cfg, w1)
			mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: []uint64{1, 2}, ISL: 6, ExpectedOutputTokens: tc.expected})
			for _, s := range tc.steps {
				added, err := tr.RecordOutputTokens("r", s.generated)
				if err != nil {
					t.Fatal(err)
				}
				if got := load1(t, tr, w1).ActiveDecodeBlocks; added != s.added || got != s.blocks {
					t.Fatalf("generated %d: added %v blocks %d, want %v %d", s.generated, added, got, s.added, s.blocks)
				}
			}
		})
	}
}

func TestAddStreamedOutputAddsABlockPerBlockSizeOfTokens(t *testing.T) {
	type step struct {
		generated, added, blocks int
	}
	for _, tc := range []struct {
		name     string
		expected *uint32
		steps    []step
	}{
		// Prompt: 2 tracked blocks. Whole blocks of streamed tokens count
		// once each, whatever the calls' granularity; a repeated or smaller
		// total adds nothing.
		{"without an expected length", nil, []step{{3, 0, 2}, {4, 1, 3}, {11, 1, 4}, {11, 0, 4}, {9, 0, 4}, {20, 3, 7}}},
		// Block n weighs 1 − 4n/8 on every block only this booking holds:
		// 3 × 0.5 = 1.5 → 2, then 4 × 0 → 0.
		{"decay toward the expected length", u32(8), []step{{4, 1, 2}, {8, 1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(t, DefaultConfig(4), w1)
			mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, TrackingHashes: []uint64{1, 2}, ISL: 8, ExpectedOutputTokens: tc.expected})
			for _, s := range tc.steps {
				added, err := tr.AddStreamedOutput("r", s.generated)
				if err != nil {
					t.Fatal(err)
				}
				if got := load1(t, tr, w1).ActiveDecodeBlocks; added != s.added || got != s.blocks {
					t.Fatalf("generated %d: added %d, %d decode blocks; want %d, %d", s.generated, added, got, s.added, s.blocks)
				}
			}
		})
	}
}

func TestAddStreamedOutputIsBoundedAndChecked(t *testing.T) {
	tr := newTracker(t, DefaultConfig(4), w1)
	mustAdd(t, tr, t0, Booking{RequestID: "r", Worker: w1, ISL: 8})
	if added, err := tr.AddStreamedOutput("r", 1<<30); err != nil || added != MaxStreamedOutputBlocks {
		t.Fatalf("a response without end: added %d, %v; want the cap %d", added, err, MaxStreamedOutputBlocks)
	}
	if added, err := tr.AddStreamedOutput("r", 1<<31); err != nil || added != 0 {
		t.Fatalf("past the cap: added %d, %v", added, err)
	}
	if _, err := tr.AddStreamedOutput("r", -1); !errors.Is(err, ErrInvalidBooking) {
		t.Errorf("negative count: %v, want ErrInvalidBooking", err)
	}
	if _, err := tr.AddStreamedOutput("gone", 4); !errors.Is(err, ErrRequestNotFound) {
		t.Errorf("unknown booking: %v, want ErrRequestNotFound", err)
	}
}

func TestDecayFractionFormula(t *testing.T) {
	for _, tc := range []struct {
		generated int
		expected  *uint32
		want      *float64
	}{
		{5, nil, nil},
		{0, u32(10), frac(1)},
		{5, u32(10), frac(0.5)},
		{15, u32(10), frac(0)},
		{0, u32(0), frac(1)},
		{1, u32(0), frac(0)},
	} {
		got := decayFraction(tc.generated, tc.expected)
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("decayFraction(%d, %v) = %v, want %v", tc.generated, tc.expected, got, tc.want)
		}
	}
}

func TestConcurrentBookingsDrainToZero(t *testing.T) {
	ranks := []index.WorkerKey{w1, w2, w3}
	tr := newTracker(t, DefaultConfig(16), ranks...)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Projection
			for i := range 300 {
				id := fmt.Sprintf("g%d-%d", g, i)
				hashes := []uint64{1, 2, uint64(g), uint64(i % 7)}
				if err := tr.Add(t0, Booking{RequestID: id, Worker: ranks[(g+i)%3], TrackingHashes: hashes, PrefillTokens: 16, TrackPrefill: true}); err != nil {
					t.Error(err)
					return
				}
				dst = tr.Project(hashes, dst)
				if i%3 == 0 {
					_ = tr.PrefillComplete(id)
				}
				if i%4 == 0 {
					_ = tr.AddOutputBlock(id, frac(0.5))
				}
				_ = tr.Loads()
				if err := tr.Free(id); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, l := range tr.Loads() {
		if l != (WorkerLoad{Worker: l.Worker}) {
			t.Fatalf("load not drained: %+v", l)
		}
	}
}

// TestDrainedRankGivesLongTablesBack: a rank that held a long prompt keeps
// its table through the drain and the upkeeps of the next longTableHold, so
// the next long prompt writes into pages already mapped, and gives it back
// at the first upkeep after that, so memory returns to what it was before
// the prompt; a short prompt's table stays always. The records' long path
// keys follow the same rule. Both ways of releasing (the last booking's
// pass over the table, the probe per block) leave the same loads.
func TestDrainedRankGivesLongTablesBack(t *testing.T) {
	w := index.WorkerKey{WorkerID: 1}
	tr := newTracker(t, DefaultConfig(16), w)
	long := benchHashes(20_000, 1)
	short := benchHashes(100, 2)
	now := t0
	for _, tc := range []struct {
		name  string
		books [][]uint64
	}{{"last booking", [][]uint64{long}}, {"shared prefix", [][]uint64{long, long[:19_000]}}, {"short after long", [][]uint64{long, short}}} {
		for i, h := range tc.books {
			mustAdd(t, tr, now, Booking{RequestID: fmt.Sprint(i), Worker: w, TrackingHashes: h, ISL: 16 * len(h)})
		}
		if err := tr.AddOutputBlock("0", frac(0.5)); err != nil {
			t.Fatal(err)
		}
		for i := range tc.books {
			if err := tr.Free(fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
		}
		r := tr.ranks[w]
		longKeys := func() bool {
			for _, rq := range tr.spare {
				if cap(rq.keys) > shrinkSlots {
					return true
				}
			}
			return false
		}
		// The upkeeps within the hold: the first after the booking, and
		// one just short of longTableHold after it.
		for _, at := range []time.Duration{time.Second, longTableHold} {
			tr.Expire(now.Add(at))
			if cap(r.held) <= shrinkSlots || !longKeys() {
				t.Fatalf("%s: the table (%d slots) or the path keys were freed %v after the booking; the next long prompt would allocate them again",
					tc.name, cap(r.held), at)
			}
		}
		now = now.Add(time.Second + longTableHold)
		tr.Expire(now)
		if longKeys() {
			t.Fatalf("%s: a recycled record keeps long path keys past the hold", tc.name)
		}
		if len(r.held) != 0 || cap(r.held) > shrinkSlots || r.unit != 0 || r.fracN != 0 || r.fracSum != 0 || r.requests != 0 {
			t.Fatalf("%s: rank after the hold: %d held in %d slots, unit %d, frac %d/%v, %d requests",
				tc.name, len(r.held), cap(r.held), r.unit, r.fracN, r.fracSum, r.requests)
		}
		now = now.Add(time.Minute)
	}
	// A rank booked again within the hold keeps its table: the hold counts
	// from the last booking, not the first.
	mustAdd(t, tr, now, Booking{RequestID: "a", Worker: w, TrackingHashes: long})
	if err := tr.Free("a"); err != nil {
		t.Fatal(err)
	}
	tr.Expire(now.Add(time.Second))
	mustAdd(t, tr, now, Booking{RequestID: "b", Worker: w, TrackingHashes: long})
	if err := tr.Free("b"); err != nil {
		t.Fatal(err)
	}
	tr.Expire(now.Add(20 * time.Second))
	tr.Expire(now.Add(40 * time.Second))
	if cap(tr.ranks[w].held) <= shrinkSlots {
		t.Fatal("a table booked 20 s ago was freed at 40 s")
	}
	tr.Expire(now.Add(20*time.Second + longTableHold))
	if cap(tr.ranks[w].held) > shrinkSlots {
		t.Fatal("the table outlived the hold after its last booking")
	}
	now = now.Add(time.Hour)
	mustAdd(t, tr, now, Booking{RequestID: "s", Worker: w, TrackingHashes: short})
	if err := tr.Free("s"); err != nil {
		t.Fatal(err)
	}
	tr.Expire(now)
	tr.Expire(now.Add(time.Hour))
	if c := cap(tr.ranks[w].held); c == 0 {
		t.Fatal("a short prompt's table was freed on drain; the next booking would allocate it again")
	}
}
