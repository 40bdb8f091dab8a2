package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestOpenLoopCallsEveryRequestWithinItsSlots(t *testing.T) {
	const n, slots = 40, 3
	var running, most, calls atomic.Int64
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- OpenLoop(context.Background(), time.Now(), n, func(int) time.Duration { return 0 }, slots, func(int) {
			r := running.Add(1)
			for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
			}
			<-release
			running.Add(-1)
			calls.Add(1)
		})
	}()
	// The loop blocks with every slot taken until a call returns.
	for running.Load() < slots {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if calls.Load() != n {
		t.Errorf("%d calls, want %d", calls.Load(), n)
	}
	if most.Load() > slots {
		t.Errorf("%d calls ran at once, want at most %d", most.Load(), slots)
	}
}

func TestOpenLoopStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	err := OpenLoop(ctx, time.Now(), 10, func(i int) time.Duration { return time.Duration(i) * time.Hour }, 2, func(int) {
		calls.Add(1)
		cancel() // the first call ends the run; the second arrives an hour later
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d calls, want 1", calls.Load())
	}
}
