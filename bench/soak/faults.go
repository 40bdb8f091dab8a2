package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Fault is one injected fault as it happened.
type Fault struct {
	Kind   string        `json:"kind"`
	Target string        `json:"target"`
	Start  time.Duration `json:"start"` // since the faulted phase began
	End    time.Duration `json:"end"`
	Detail string        `json:"detail,omitempty"`
	Err    string        `json:"error,omitempty"` // the fault could not be carried out or undone
}

// faultKind is a kind of fault: how often the schedule draws it and how to
// inject and undo it. run returns the target's name and what happened.
type faultKind struct {
	name   string
	weight int
	run    func(in *injector, ctx context.Context, rng *rand.Rand) (target, detail string, err error)
}

// faultKinds is the whole menu, in the order the report lists it.
var faultKinds = []faultKind{
	{"worker-kill-9", 3, (*injector).workerKill},
	{"worker-kill-9-new-port", 2, (*injector).workerKillNewPort},
	{"worker-drain", 2, (*injector).workerDrain},
	{"catalog-churn", 3, (*injector).catalogChurn},
	{"kv-drop", 2, func(in *injector, ctx context.Context, rng *rand.Rand) (string, string, error) {
		return in.proxyFault(ctx, rng, dropSome, false)
	}},
	{"kv-duplicate", 2, func(in *injector, ctx context.Context, rng *rand.Rand) (string, string, error) {
		return in.proxyFault(ctx, rng, duplicate, false)
	}},
	{"kv-reorder", 2, func(in *injector, ctx context.Context, rng *rand.Rand) (string, string, error) {
		return in.proxyFault(ctx, rng, reorder, false)
	}},
	{"kv-replay-down", 2, func(in *injector, ctx context.Context, rng *rand.Rand) (string, string, error) {
		return in.proxyFault(ctx, rng, dropSome, true)
	}},
	{"replica-kill-9", 1, (*injector).replicaKill},
	{"replica-sigstop", 1, (*injector).replicaPause},
	{"mesh-stalled-subscriber", 1, (*injector).meshStall},
}

// injector runs the fault schedule against a cluster.
type injector struct {
	fl    *cluster
	cfg   *Config
	begin time.Time

	mu     sync.Mutex
	faults []Fault
	busy   map[string]bool // targets a fault holds
	wg     sync.WaitGroup
}

// schedule injects a fault every cfg.FaultEvery (±50 %, seeded) until ctx
// ends, then waits for the running ones to be undone. The kinds come from a
// deck shuffled with the seed, each kind as many times as its weight, dealt
// out and reshuffled: every kind is injected once per round, so even a short
// run has them all.
func (in *injector) schedule(ctx context.Context) {
	rng := rand.New(rand.NewPCG(in.cfg.Seed, 0xfa017))
	d := deck{rng: rng}
	for {
		kind := d.next()
		gap := time.Duration(float64(in.cfg.FaultEvery) * (0.5 + rng.Float64()))
		select {
		case <-ctx.Done():
			in.wg.Wait()
			return
		case <-time.After(gap):
		}
		seed := rng.Uint64()
		in.wg.Go(func() {
			start := time.Since(in.begin)
			// Faults are undone on a context of their own: the end of the
			// phase must not leave a worker dead or a replica stopped.
			target, detail, err := kind.run(in, context.WithoutCancel(ctx), rand.New(rand.NewPCG(seed, 1)))
			if target == "" {
				return // every possible target was busy
			}
			f := Fault{Kind: kind.name, Target: target, Start: start, End: time.Since(in.begin), Detail: detail}
			if err != nil {
				f.Err = err.Error()
			}
			in.mu.Lock()
			in.faults = append(in.faults, f)
			in.mu.Unlock()
		})
	}
}

// deck deals fault kinds: each kind as many times as its weight per round,
// in an order shuffled anew every round.
type deck struct {
	rng   *rand.Rand
	cards []faultKind
}

func (d *deck) next() faultKind {
	if len(d.cards) == 0 {
		for _, k := range faultKinds {
			for range k.weight {
				d.cards = append(d.cards, k)
			}
		}
		d.rng.Shuffle(len(d.cards), func(i, j int) { d.cards[i], d.cards[j] = d.cards[j], d.cards[i] })
	}
	k := d.cards[0]
	d.cards = d.cards[1:]
	return k
}

// claim takes one of the targets no fault holds, at random; "" when none is free.
func (in *injector) claim(rng *rand.Rand, targets []string) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	free := slices.DeleteFunc(slices.Clone(targets), func(t string) bool { return in.busy[t] })
	if len(free) == 0 {
		return ""
	}
	t := free[rng.IntN(len(free))]
	in.busy[t] = true
	return t
}

func (in *injector) release(t string) {
	in.mu.Lock()
	delete(in.busy, t)
	in.mu.Unlock()
}

func (in *injector) snapshot() []Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.faults)
}

// claimWorker holds a worker matching ok.
func (in *injector) claimWorker(rng *rand.Rand, ok func(*worker) bool) *worker {
	var names []string
	for _, w := range in.fl.workers {
		if ok(w) {
			names = append(names, w.proc.Name)
		}
	}
	t := in.claim(rng, names)
	for _, w := range in.fl.workers {
		if w.proc.Name == t {
			return w
		}
	}
	return nil
}

func anyWorker(*worker) bool { return true }

func sleepRand(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	d := lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	time.Sleep(d)
	return d
}

// workerKill kills a worker with SIGKILL and starts it again on the same
// ports, the catalog untouched: a container that crashed and came back in its
// pod. Its publisher starts over at sequence 0 with an empty cache, which
// every replica must recognize on its own.
func (in *injector) workerKill(ctx context.Context, rng *rand.Rand) (string, string, error) {
	w := in.claimWorker(rng, anyWorker)
	if w == nil {
		return "", "", nil
	}
	defer in.release(w.proc.Name)
	w.proc.Kill()
	down := sleepRand(rng, time.Second, 4*time.Second)
	if err := in.fl.startWorker(w, false); err != nil {
		return w.proc.Name, "", err
	}
	return w.proc.Name, fmt.Sprintf("down %s, restarted on its ports, catalog untouched", down.Round(time.Millisecond)), nil
}

// workerKillNewPort kills a worker and brings it back on new ports, as a
// rescheduled pod: out of the catalog while it is gone, in with its new
// record.
func (in *injector) workerKillNewPort(ctx context.Context, rng *rand.Rand) (string, string, error) {
	w := in.claimWorker(rng, func(w *worker) bool { return !w.proxied && !w.sim })
	if w == nil {
		return "", "", nil
	}
	defer in.release(w.proc.Name)
	w.proc.Kill()
	down := sleepRand(rng, 500*time.Millisecond, 3*time.Second)
	if err := in.fl.catalog(ctx, w, false); err != nil {
		return w.proc.Name, "", err
	}
	if err := in.fl.startWorker(w, true); err != nil {
		return w.proc.Name, "", err
	}
	if err := in.fl.catalog(ctx, w, true); err != nil {
		return w.proc.Name, "", err
	}
	return w.proc.Name, fmt.Sprintf("dead %s before leaving the catalog; back at %s", down.Round(time.Millisecond), w.url()), nil
}

// workerDrain takes a worker out of the catalog, lets its requests finish,
// stops it with SIGTERM and brings it back.
func (in *injector) workerDrain(ctx context.Context, rng *rand.Rand) (string, string, error) {
	w := in.claimWorker(rng, anyWorker)
	if w == nil {
		return "", "", nil
	}
	defer in.release(w.proc.Name)
	if err := in.fl.catalog(ctx, w, false); err != nil {
		return w.proc.Name, "", err
	}
	time.Sleep(time.Second)
	w.proc.Stop(10 * time.Second)
	sleepRand(rng, 0, 2*time.Second)
	if err := in.fl.startWorker(w, false); err != nil {
		return w.proc.Name, "", err
	}
	return w.proc.Name, "drained, SIGTERM, restarted", in.fl.catalog(ctx, w, true)
}

// catalogChurn deletes a worker from the catalog and puts it back: DELETE
// and POST on every replica for a REST worker, an edit of the workers file
// for the others (an InferencePool losing and regaining a pod).
func (in *injector) catalogChurn(ctx context.Context, rng *rand.Rand) (string, string, error) {
	w := in.claimWorker(rng, anyWorker)
	if w == nil {
		return "", "", nil
	}
	defer in.release(w.proc.Name)
	how := "REST DELETE / POST"
	if w.viaFile {
		how = "workers file edit"
	}
	if err := in.fl.catalog(ctx, w, false); err != nil {
		return w.proc.Name, how, err
	}
	sleepRand(rng, 0, 3*time.Second)
	return w.proc.Name, how, in.fl.catalog(ctx, w, true)
}

// proxyFault switches a proxied worker's KV event stream to mode for a while;
// replayDown also takes its replay endpoint away, so that the gaps cannot be
// filled. Batches known lost are then repaired the way an operator answering
// the lost-batches alert would: the worker leaves the catalog and comes
// back, and the fresh listeners replay the engine's whole ring.
func (in *injector) proxyFault(ctx context.Context, rng *rand.Rand, mode proxyMode, replayDown bool) (string, string, error) {
	w := in.claimWorker(rng, func(w *worker) bool { return w.proxied })
	if w == nil {
		return "", "", nil
	}
	defer in.release(w.proc.Name)
	lostBefore := in.fl.lostBatches(ctx, w)
	before := [3]uint64{w.proxy.dropped.Load(), w.proxy.duplicated.Load(), w.proxy.reordered.Load()}
	if replayDown {
		w.replay.setDown(true)
	}
	w.proxy.setMode(mode)
	d := sleepRand(rng, 5*time.Second, 15*time.Second)
	w.proxy.setMode(passAll)
	w.replay.setDown(false)
	detail := fmt.Sprintf("%s for %s: %d dropped, %d duplicated, %d reordered", mode, d.Round(time.Millisecond),
		w.proxy.dropped.Load()-before[0], w.proxy.duplicated.Load()-before[1], w.proxy.reordered.Load()-before[2])
	if replayDown {
		detail += ", replay endpoint down"
	}
	// A gap shows only when the next batch arrives: give the stream a moment.
	time.Sleep(2 * time.Second)
	if lost := in.fl.lostBatches(ctx, w) - lostBefore; lost > 0 {
		detail += fmt.Sprintf("; %d batches lost across replicas, worker re-attached", lost)
		if err := in.fl.catalog(ctx, w, false); err != nil {
			return w.proc.Name, detail, err
		}
		if err := in.fl.catalog(ctx, w, true); err != nil {
			return w.proc.Name, detail, err
		}
	}
	return w.proc.Name, detail, nil
}

// replicaKill kills the replica that recovers from its peers and starts it
// again on the same ports.
func (in *injector) replicaKill(ctx context.Context, rng *rand.Rand) (string, string, error) {
	r := in.fl.replicas[len(in.fl.replicas)-1]
	if len(in.fl.replicas) < 2 || in.claim(rng, []string{r.kv.Proc.Name}) == "" {
		return "", "", nil
	}
	defer in.release(r.kv.Proc.Name)
	in.fl.topo.Lock()
	defer in.fl.topo.Unlock()
	r.kv.Proc.Kill()
	down := sleepRand(rng, time.Second, 5*time.Second)
	if err := r.kv.Proc.Start(); err != nil {
		return r.kv.Proc.Name, "", err
	}
	return r.kv.Proc.Name, fmt.Sprintf("down %s, recovered from its peers", down.Round(time.Millisecond)), in.fl.replicaUp(ctx, r)
}

// replicaPause stops a replica with SIGSTOP for longer than the booking
// expiry, then continues it. Its peers' mesh publishers and the workers' KV
// publishers meanwhile write to a subscriber that does not read.
func (in *injector) replicaPause(ctx context.Context, rng *rand.Rand) (string, string, error) {
	if len(in.fl.replicas) < 2 {
		return "", "", nil
	}
	r := in.fl.replicas[1]
	if in.claim(rng, []string{r.kv.Proc.Name}) == "" {
		return "", "", nil
	}
	defer in.release(r.kv.Proc.Name)
	in.fl.topo.Lock()
	err := r.kv.Proc.Pause()
	in.fl.topo.Unlock()
	if err != nil {
		return r.kv.Proc.Name, "", err
	}
	d := sleepRand(rng, in.cfg.Expiry+2*time.Second, in.cfg.Expiry+8*time.Second)
	in.fl.topo.Lock()
	defer in.fl.topo.Unlock()
	if err := r.kv.Proc.Resume(); err != nil {
		return r.kv.Proc.Name, "", err
	}
	// Catalog changes made while it slept are applied now.
	return r.kv.Proc.Name, fmt.Sprintf("stopped %s", d.Round(time.Millisecond)), in.fl.replicaUp(ctx, r)
}

// meshStall subscribes to the first replica's mesh and never reads.
func (in *injector) meshStall(ctx context.Context, rng *rand.Rand) (string, string, error) {
	r := in.fl.replicas[0]
	name := r.kv.Proc.Name + "-mesh"
	if len(in.fl.replicas) < 2 || in.claim(rng, []string{name}) == "" {
		return "", "", nil
	}
	defer in.release(name)
	s, err := newStalledSubscriber(fmt.Sprintf("tcp://127.0.0.1:%d", r.meshPort))
	if err != nil {
		return name, "", err
	}
	d := sleepRand(rng, 10*time.Second, 30*time.Second)
	s.close()
	return name, fmt.Sprintf("a subscriber that never read for %s", d.Round(time.Millisecond)), nil
}
