package affinity

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// refSession is the obvious model of one session under one live worker (so
// Hard and Soft agree and nothing fails over): a binding, its lease count and
// its idle deadline, which starts at the last lease release.
type refSession struct {
	bound    bool
	leases   int
	deadline time.Time
}

func (r *refSession) live(now time.Time) bool {
	return r.bound && (r.leases > 0 || now.Before(r.deadline))
}

// TestRandomizedLeaseCountingAgainstModel drives one session through random
// acquire/commit/abort/release/reap sequences with a fake clock and checks
// the table against refSession after every step.
func TestRandomizedLeaseCountingAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		tb := newTable(t, Mode(rng.IntN(2)))
		var m refSession
		var leases []*Lease
		var initHold *Hold
		now := t0
		for step := 0; step < 1500; step++ {
			now = now.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
			switch op := rng.IntN(6); {
			case op <= 1 && initHold == nil:
				h, wait, err := tb.Acquire(now, "s", nil)
				if err != nil || wait != nil {
					t.Fatalf("seed %d step %d: Acquire = (%v, %v)", seed, step, wait, err)
				}
				if m.live(now) != (h.Kind() == HoldBound) {
					t.Fatalf("seed %d step %d: kind %v, model live %v", seed, step, h.Kind(), m.live(now))
				}
				if h.Kind() == HoldInitialize {
					m = refSession{} // expired: re-initializing
					initHold = h
					break
				}
				m.leases++
				if rng.IntN(4) == 0 {
					h.Abort(now)
					m.leases--
					m.deadline = now.Add(ttl)
				} else {
					leases = append(leases, commit(t, h, now, rt(1, 0), nil))
				}
			case op <= 1:
				// Another request finds the session initializing and must wait.
				if h, wait, _ := tb.Acquire(now, "s", nil); h != nil || wait == nil {
					t.Fatalf("seed %d step %d: no wait during initialization", seed, step)
				}
			case op == 2 && initHold != nil:
				if rng.IntN(3) == 0 {
					initHold.Abort(now)
				} else {
					leases = append(leases, commit(t, initHold, now, rt(1, 0), nil))
					m = refSession{bound: true, leases: 1, deadline: now.Add(ttl)}
				}
				initHold = nil
			case op == 3 && len(leases) > 0:
				i := rng.IntN(len(leases))
				leases[i].Release(now)
				leases = append(leases[:i], leases[i+1:]...)
				m.leases--
				m.deadline = now.Add(ttl)
			case op == 4:
				tb.Reap(now)
			}
			_, ok := boundTo(t, tb, now, "s")
			if ok != m.live(now) {
				t.Fatalf("seed %d step %d: bound %v, model %+v at %v", seed, step, ok, m, now.Sub(t0))
			}
			if n, present := tb.LeaseCount("s"); present && m.bound && n != m.leases {
				t.Fatalf("seed %d step %d: leases %d, model %d", seed, step, n, m.leases)
			}
		}
	}
}

// TestConcurrentBookingsKeepLeaseCounts runs many goroutines through the
// managed path (waiting on initializations like the service does) on a few
// sessions while workers come and go; after every lease is released no
// session holds a lease and the reaper empties the table.
func TestConcurrentBookingsKeepLeaseCounts(t *testing.T) {
	for _, mode := range []Mode{Hard, Soft} {
		tb := newTable(t, mode)
		var liveMu sync.Mutex
		gone := map[uint64]bool{}
		sched := func(tg Target) bool { liveMu.Lock(); defer liveMu.Unlock(); return !gone[tg.WorkerID] }
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 3))
				for i := range 400 {
					now := at(time.Duration(i) * time.Millisecond)
					sid := fmt.Sprintf("s%d", rng.IntN(4))
					var h *Hold
					for h == nil {
						var wait <-chan struct{}
						var err error
						h, wait, err = tb.Acquire(now, sid, sched)
						if err != nil {
							t.Error(err)
							return
						}
						if wait != nil {
							<-wait
						}
					}
					if rng.IntN(50) == 0 {
						liveMu.Lock()
						w := uint64(rng.IntN(3))
						gone[w] = !gone[w]
						liveMu.Unlock()
					}
					target, ok := h.Target()
					if !ok || rng.IntN(5) == 0 {
						target = rt(uint64(rng.IntN(3)), 0)
					}
					if rng.IntN(6) == 0 {
						h.Abort(now)
						continue
					}
					l, err := h.Commit(now, target, sched)
					// Besides a Hard conflict, an initializing hold may lose
					// its entry to the others: a failover joins and binds it,
					// then a request that finds the bound worker gone (or the
					// binding idle on its own clock) drops and re-initializes
					// it before this commit.
					if err != nil && !isConflict(err) && !errors.Is(err, ErrInitializationChanged) && !errors.Is(err, ErrInitializationCancelled) {
						t.Error(err)
					}
					l.Release(now)
				}
			}()
		}
		wg.Wait()
		for i := range 4 {
			if n, ok := tb.LeaseCount(fmt.Sprintf("s%d", i)); ok && n != 0 {
				t.Fatalf("%v: s%d has %d leases after all released", mode, i, n)
			}
		}
		tb.Reap(at(time.Hour))
		if tb.Len() != 0 {
			t.Fatalf("%v: Len = %d after reaping", mode, tb.Len())
		}
	}
}

func isConflict(err error) bool {
	_, ok := err.(*ConflictError)
	return ok
}
