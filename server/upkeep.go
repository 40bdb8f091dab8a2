package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/internal/memrelease"
	"github.com/kvselect/kvselect/replicas/recovery"
	"github.com/kvselect/kvselect/selection"
)

// maintainEvery is the cadence of svc.Maintain. Dynamo runs its expiry task
// every 60 s, so a stale booking lingers five to six minutes at the default
// 300 s expiry (lib/kv-router/src/sequences in ai-dynamo/dynamo). Maintain
// only walks the partitions and what has expired, so a 5 s tick costs nothing
// measurable while keeping every deadline it enforces (active-request expiry,
// idle session bindings down to the 1 s minimum TTL, approximate-index TTL,
// queued waiters re-checking load) within 5 s of its configured value.
const maintainEvery = 5 * time.Second

// upkeepInterval is maintainEvery, or a tenth of the flow control queue TTL
// when that is shorter (but at least 50 ms): Maintain is what takes a
// request past its TTL out of the queue, so this bounds how late that is.
func upkeepInterval(svc *selection.Service) time.Duration {
	if fc := svc.Inspect().FlowConfig(); fc != nil {
		return min(maintainEvery, max(fc.TTL/10, 50*time.Millisecond))
	}
	return maintainEvery
}

// endsSlack is the least an ends loop (KeepEnds) sleeps: estimated ends
// due within it of each other are acted on together, one wake for a burst.
const endsSlack = time.Millisecond

// KeepEnds frees the bookings kept to an estimated end (--booking-end auto
// or estimate) as they come due, until ctx ends: it sleeps until the next
// estimated instant (svc.MaintainEnds), waking early when a booking is
// given an end due before that (svc.EndsChanged). Behind NGINX Gateway
// Fabric, which hides every response, a booking freed on a 100 ms tick
// outlived its request by 50 ms on average: at 60 requests/s, three
// requests too many in /loads all along.
func KeepEnds(ctx context.Context, svc *selection.Service) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		wait := time.Hour // nothing kept: only EndsChanged wakes the loop
		if next, ok := svc.MaintainEnds(ctx); ok {
			wait = max(time.Until(next), endsSlack)
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-svc.EndsChanged():
		}
	}
}

// Upkeep calls svc.Maintain every interval until ctx ends: the one timer of
// the selection core, which starts none of its own. Run starts it; a program
// that embeds a selection.Service without Run starts it the same way, in a
// goroutine of its own (and, when it keeps bookings to estimated ends,
// KeepEnds beside it).
func Upkeep(ctx context.Context, svc *selection.Service, interval time.Duration) {
	every(ctx, interval, func() { svc.Maintain(ctx) })
}

// every calls fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// startUpkeep runs, beside the fronts, what keeps the core current: the
// upkeep ticker, discovery (startDiscovery, from prepareDiscovery), engine
// metrics and health probes, index recovery from --indexer-peers, and the
// config reloads of r (nil: none). stop ends them all and waits for them,
// before the service's adapters close.
func startUpkeep(ctx context.Context, o *options, svc *selection.Service, startDiscovery func(context.Context, *sync.WaitGroup), r *reloader,
	reg prometheus.Registerer, log *slog.Logger) (stop func()) {
	upkeep, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { Upkeep(upkeep, svc, upkeepInterval(svc)) })
	if o.bookEnd.keepsEnds() {
		wg.Go(func() { KeepEnds(upkeep, svc) })
	}
	startDiscovery(upkeep, &wg)
	wg.Go(o.engines.startEngines(upkeep, svc, reg, log))
	if len(o.indexerPeers) > 0 {
		wg.Go(func() {
			recovery.Run(upkeep, svc.Replica(), recovery.Options{Peers: o.indexerPeers, Logger: log, TokenFile: o.indexerPeersToken})
		})
	}
	if r != nil {
		wg.Go(func() { r.run(upkeep) })
	}
	if o.memoryReleaseInterval > 0 {
		rel := memrelease.New(memrelease.Config{Interval: o.memoryReleaseInterval, MinBytes: o.memoryReleaseMinBytes,
			Activity: svc.Prepared}, reg, log)
		wg.Go(func() { rel.Run(upkeep) })
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
