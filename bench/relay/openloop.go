package relay

import (
	"context"
	"sync"
	"time"
)

// OpenLoop sends n requests open loop, as clients arrive regardless of how
// fast they are served: one(i) starts at start+at(i) on a goroutine of its
// own, with at most inFlight running (a later arrival waits for a slot, as a
// gateway's connection limit would make it). It returns once every started
// call has returned, with ctx's error if ctx ended first.
func OpenLoop(ctx context.Context, start time.Time, n int, at func(i int) time.Duration, inFlight int, one func(i int)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, inFlight)
	for i := range n {
		if d := time.Until(start.Add(at(i))); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case slots <- struct{}{}:
		}
		wg.Go(func() {
			defer func() { <-slots }()
			one(i)
		})
	}
	return nil
}
