// Package memrelease gives the heap's idle memory back to the operating
// system once a burst of work is over.
//
// The Go runtime keeps the memory a burst needed: it returns freed pages at a
// paced rate, and only down to what its next collection goal allows, and with
// no allocation there is no next collection (the runtime forces one only
// every two minutes). A picker that has just parsed a few 1M-token request
// bodies (~6 MB each as token ids, tens of MB with their copies and the KV
// events they cause) would hold that memory, resident, until the next burst;
// in a container with a memory limit that is memory the limit must allow
// for, all the time.
//
// A Releaser looks at the heap at a fixed interval. When the heap holds at
// least a threshold reclaimable and allocated, since the last look, less than
// that threshold and less than a quarter of what it holds reclaimable, and
// the host did no work since that look (Config.Activity) (Idle), the burst
// is over: it collects twice (sync.Pool caches survive one
// collection) and returns every free page (debug.FreeOSMemory). While
// requests keep coming it does not release, since what it gave back would
// only be faulted in again (a page fault costs microseconds, 10–25 µs a page
// on some virtual machines: tens of milliseconds for one 1M-token request
// body). After a release the reclaimable memory is near zero, so an idle
// process releases once, not at every look.
package memrelease

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultInterval is how often the heap is looked at unless configured.
const DefaultInterval = 10 * time.Second

// DefaultMinBytes is the smallest reclaimable memory worth a release (a
// collection, and page faults when the memory is needed again), and the
// allocation between looks under which the heap counts as quiet. kvselect
// with nothing to do allocates a few MiB in 10 s (~4 MiB scraping four
// engines' metrics every 200 ms).
const DefaultMinBytes = 16 << 20

// Config says how often to look and what is worth giving back.
type Config struct {
	// Interval between looks at the heap; 0 turns releasing off.
	Interval time.Duration
	// MinBytes is the reclaimable memory below which nothing is released.
	MinBytes uint64
	// Activity, when set, counts the work the host has begun (kvselect:
	// the prompts its selection core has prepared). An interval in which
	// it moved is never idle, however little it allocated: a process that
	// keeps its buffers for the next request allocates little per request,
	// and a release between requests would only have them faulted in again.
	Activity func() uint64
}

// Heap is what a decision reads from the runtime, in bytes.
type Heap struct {
	// Allocated is the total allocated since the program started
	// (/gc/heap/allocs:bytes): two looks' difference is what the interval
	// allocated.
	Allocated uint64
	// Objects is the memory of live objects and of dead ones not swept yet
	// (/memory/classes/heap/objects:bytes).
	Objects uint64
	// Live is what the last collection found live (/gc/heap/live:bytes).
	Live uint64
	// Free is free memory the runtime holds and has not returned
	// (/memory/classes/heap/free:bytes).
	Free uint64
	// Work is Config.Activity at the look, 0 without one.
	Work uint64
}

// Reclaimable is the memory a collection and a release would give back: the
// dead objects (Objects above Live) and the free pages. Fragmentation inside
// spans in use (/memory/classes/heap/unused:bytes) is not: it stays.
func (h Heap) Reclaimable() uint64 {
	dead := uint64(0)
	if h.Objects > h.Live {
		dead = h.Objects - h.Live
	}
	return dead + h.Free
}

// Idle reports whether the heap is quiet and holds enough to give back, given
// the look before: at least minBytes are reclaimable now, and since that look
// no work began and the heap allocated less than minBytes and less than a
// quietShare of what is reclaimable.
//
// Both bounds matter. A trickle of 1M-token requests (one every few
// seconds, each allocating some 15 MiB and leaving 100 MiB or more of heap
// behind) allocates far less than it holds, yet every request needs that
// memory again: the absolute bound keeps it. Steady traffic of short
// requests allocates little in absolute terms, but the heap grows back to
// its collection goal within a few intervals, faulting in again whatever
// was given back: the relative bound keeps it. Neither bound holds once the
// requests' buffers are kept from one request to the next: 1M-token requests
// every two seconds then allocated under 16 MiB in 10 s, and were released
// between (40–95 MiB each time, faulted in again by the requests after). The
// work count keeps that memory too.
func Idle(before, now Heap, minBytes uint64) bool {
	r := now.Reclaimable()
	if r < minBytes || now.Work != before.Work {
		return false
	}
	var allocated uint64
	if now.Allocated > before.Allocated {
		allocated = now.Allocated - before.Allocated
	}
	return allocated < minBytes && allocated < r/quietShare
}

// quietShare: a heap is quiet when an interval allocates less than
// 1/quietShare of what it holds reclaimable, i.e. the memory would sit
// unused for several intervals more.
const quietShare = 4

// Releaser decides and releases; see the package comment.
type Releaser struct {
	cfg      Config
	read     func() Heap
	release  func()
	log      *slog.Logger
	releases prometheus.Counter
	returned prometheus.Counter
}

// New returns a Releaser of the process's own heap. reg may be nil.
func New(cfg Config, reg prometheus.Registerer, log *slog.Logger) *Releaser {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	read := ReadHeap
	if cfg.Activity != nil {
		read = func() Heap {
			h := ReadHeap()
			h.Work = cfg.Activity()
			return h
		}
	}
	r := &Releaser{
		cfg:     cfg,
		read:    read,
		release: collectAndFree,
		log:     log,
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvselect_memory_releases_total",
			Help: "Times the idle heap was collected and its free memory returned to the operating system (--memory-release-interval).",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvselect_memory_released_bytes_total",
			Help: "Heap memory returned to the operating system by those releases, as the runtime counts it released.",
		}),
	}
	if reg != nil {
		reg.MustRegister(r.releases, r.returned)
	}
	return r
}

// Run looks at the heap every interval until ctx ends; it returns at once
// when releasing is off.
func (r *Releaser) Run(ctx context.Context) {
	if r.cfg.Interval <= 0 {
		return
	}
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	before := r.read()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		before = r.Step(before)
	}
}

// Step is one look: it releases when Idle says so and returns the look the
// next step compares with (taken after the release, if any).
func (r *Releaser) Step(before Heap) Heap {
	now := r.read()
	if !Idle(before, now, r.cfg.MinBytes) {
		return now
	}
	releasedBefore := readReleased()
	start := time.Now()
	r.release()
	returned := uint64(0)
	if after := readReleased(); after > releasedBefore {
		returned = after - releasedBefore
	}
	r.releases.Inc()
	r.returned.Add(float64(returned))
	r.log.Debug("returned idle heap memory to the system", "reclaimable_bytes", now.Reclaimable(),
		"returned_bytes", returned, "took", time.Since(start).Round(time.Microsecond).String())
	return r.read()
}

// collectAndFree collects twice and returns every free page: sync.Pool
// caches (internal/sizepool's overflow of long prompts' buffers) survive one
// collection as victims and go at the second, and a burst's buffers are
// exactly what an idle process should not keep.
func collectAndFree() {
	runtime.GC()
	debug.FreeOSMemory()
}

// The runtime/metrics names a look reads.
const (
	allocsMetric   = "/gc/heap/allocs:bytes"
	objectsMetric  = "/memory/classes/heap/objects:bytes"
	liveMetric     = "/gc/heap/live:bytes"
	freeMetric     = "/memory/classes/heap/free:bytes"
	releasedMetric = "/memory/classes/heap/released:bytes"
)

// ReadHeap reads the process's heap from runtime/metrics.
func ReadHeap() Heap {
	s := []metrics.Sample{{Name: allocsMetric}, {Name: objectsMetric}, {Name: liveMetric}, {Name: freeMetric}}
	metrics.Read(s)
	return Heap{Allocated: value(s[0]), Objects: value(s[1]), Live: value(s[2]), Free: value(s[3])}
}

func readReleased() uint64 {
	s := []metrics.Sample{{Name: releasedMetric}}
	metrics.Read(s)
	return value(s[0])
}

// value is a sample's figure, 0 if this runtime does not have the metric.
func value(s metrics.Sample) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
}
