package loads

import (
	"errors"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// Moving a booking leaves both ranks exactly as if it had been booked on the
// destination from the start: shared blocks stay with the other bookings,
// decayed output blocks keep their weight.
func TestMoveEqualsBookingOnTheDestination(t *testing.T) {
	prompt := []uint64{1, 2, 3, 4}
	shared := []uint64{1, 2, 9}
	build := func(onB bool) *Tracker {
		tr := newTracker(t, DefaultConfig(4), w2, w1)
		home := w2
		if onB {
			home = w1
		}
		mustAdd(t, tr, t0, Booking{RequestID: "other", Worker: w2, TrackingHashes: shared, ISL: 12, PrefillTokens: 12, TrackPrefill: true})
		mustAdd(t, tr, t0, Booking{RequestID: "m", Worker: home, TrackingHashes: prompt, ISL: 16, PrefillTokens: 10, TrackPrefill: true})
		if err := tr.AddOutputBlock("m", nil); err != nil {
			t.Fatal(err)
		}
		if err := tr.AddOutputBlock("m", frac(0.5)); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	moved := build(false)
	if _, err := moved.Move("m", w1); err != nil {
		t.Fatal(err)
	}
	want := build(true)
	for _, w := range []index.WorkerKey{w2, w1} {
		if got, exp := load1(t, moved, w), load1(t, want, w); got != exp {
			t.Fatalf("rank %v after move: %+v, want %+v", w, got, exp)
		}
	}
	if err := moved.Free("m"); err != nil {
		t.Fatal(err)
	}
	if l := load1(t, moved, w1); l != (WorkerLoad{Worker: w1}) {
		t.Fatalf("destination keeps load after free: %+v", l)
	}
	if _, err := moved.Move("m", w2); !errors.Is(err, ErrRequestNotFound) {
		t.Fatalf("move of a freed booking: %v", err)
	}
	if _, err := moved.Move("other", index.WorkerKey{WorkerID: 99}); !errors.Is(err, ErrWorkerNotFound) {
		t.Fatalf("move to an unknown rank: %v", err)
	}
}
