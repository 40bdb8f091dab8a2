package memrelease

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestIdle(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name        string
		before, now Heap
		min         uint64
		want        bool
	}{
		{"a burst's free pages, nothing allocated since", Heap{Allocated: 900 * mib}, Heap{Allocated: 901 * mib, Objects: 40 * mib, Live: 40 * mib, Free: 200 * mib}, 16 * mib, true},
		{"dead objects no collection has swept", Heap{Allocated: 900 * mib}, Heap{Allocated: 900 * mib, Objects: 140 * mib, Live: 40 * mib}, 16 * mib, true},
		{"steady load allocates more than is free", Heap{Allocated: 900 * mib}, Heap{Allocated: 1400 * mib, Objects: 90 * mib, Live: 40 * mib, Free: 100 * mib}, 16 * mib, false},
		{"too little to give back", Heap{Allocated: 900 * mib}, Heap{Allocated: 900 * mib, Objects: 40 * mib, Live: 38 * mib, Free: 10 * mib}, 16 * mib, false},
		{"exactly the minimum", Heap{}, Heap{Free: 16 * mib}, 16 * mib, true},
		{"live above objects (grown since the collection) counts no dead", Heap{}, Heap{Objects: 40 * mib, Live: 50 * mib, Free: 20 * mib}, 16 * mib, true},
		{"nothing free", Heap{}, Heap{Objects: 40 * mib, Live: 40 * mib}, 16 * mib, false},
		{"allocated the minimum since", Heap{Allocated: 0}, Heap{Allocated: 16 * mib, Free: 300 * mib}, 16 * mib, false},
		{"a trickle of long requests holds more than it allocates", Heap{Allocated: 900 * mib}, Heap{Allocated: 940 * mib, Objects: 150 * mib, Live: 50 * mib, Free: 60 * mib}, 16 * mib, false},
		{"steady short requests will grow the heap back soon", Heap{Allocated: 900 * mib}, Heap{Allocated: 910 * mib, Objects: 70 * mib, Live: 40 * mib, Free: 2 * mib}, 16 * mib, false},
		{"idle garbage well over what the interval allocated", Heap{Allocated: 900 * mib}, Heap{Allocated: 901 * mib, Objects: 58 * mib, Live: 40 * mib}, 16 * mib, true},
		{"a counter that went back (never) reads as nothing allocated", Heap{Allocated: 50 * mib}, Heap{Allocated: 10 * mib, Free: 30 * mib}, 16 * mib, true},
		{"long requests whose buffers are kept: little allocated, but work began", Heap{Allocated: 900 * mib, Work: 40}, Heap{Allocated: 910 * mib, Objects: 100 * mib, Live: 60 * mib, Free: 40 * mib, Work: 45}, 16 * mib, false},
		{"the same once the requests stopped", Heap{Allocated: 910 * mib, Work: 45}, Heap{Allocated: 911 * mib, Objects: 100 * mib, Live: 60 * mib, Free: 40 * mib, Work: 45}, 16 * mib, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Idle(tt.before, tt.now, tt.min); got != tt.want {
				t.Errorf("Idle(%+v, %+v, %d) = %v, want %v", tt.before, tt.now, tt.min, got, tt.want)
			}
		})
	}
}

// sink keeps the burst's buffers reachable until the test drops them, so the
// compiler cannot make them stack or dead allocations.
var sink [][]byte

// TestReleaseAfterABurst drives the process's own heap: a burst of 96 MiB in
// 16 KiB pieces (a long request body's chunks, a KV event batch's buffers),
// held and then dropped, then quiet looks. Whether the releaser or the
// runtime's own scavenger gives the memory back depends on when the runtime
// last collected, so the test asserts what matters: after two quiet looks
// the heap holds less than MinBytes reclaimable, every release the releaser
// made returned memory, and a further quiet look releases nothing.
func TestReleaseAfterABurst(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates and returns 96 MiB")
	}
	const burst, piece = 96 << 20, 16 << 10
	reg := prometheus.NewPedanticRegistry()
	r := New(Config{Interval: DefaultInterval, MinBytes: DefaultMinBytes}, reg, nil)
	runtime.GC()

	before := ReadHeap()
	for range burst / piece {
		b := make([]byte, piece)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1 // resident, as a parsed body is
		}
		sink = append(sink, b)
	}
	sink = nil

	look := r.Step(before)
	if got := counterValue(t, r.releases); got != 0 {
		t.Fatalf("the look spanning the burst released (%v releases): it allocated %d bytes, reclaimable %d", got, look.Allocated-before.Allocated, look.Reclaimable())
	}
	look = r.Step(r.Step(look))
	if got := look.Reclaimable(); got >= DefaultMinBytes {
		t.Fatalf("after two quiet looks %d bytes are reclaimable, want under %d", got, DefaultMinBytes)
	}
	releases := counterValue(t, r.releases)
	if releases > 1 {
		t.Errorf("%v releases in two quiet looks, want at most 1", releases)
	}
	if returned := counterValue(t, r.returned); releases == 1 && returned == 0 {
		t.Errorf("a release returned nothing")
	}
	t.Logf("%v releases by the releaser, %.0f bytes returned", releases, counterValue(t, r.returned))

	r.Step(look)
	if got := counterValue(t, r.releases); got != releases {
		t.Errorf("a third quiet look released again: %v releases, want %v", got, releases)
	}
	families, err := reg.Gather()
	if err != nil || len(families) != 2 {
		t.Errorf("gathered %d metric families (%v), want the two counters", len(families), err)
	}
}

// TestStepReleasesOnlyWhenIdle runs Step's decision against a scripted heap:
// a release runs once, between the look that sees the heap quiet and the
// next, and the look it returns is taken after the release.
func TestStepReleasesOnlyWhenIdle(t *testing.T) {
	const mib = 1 << 20
	heaps := []Heap{
		{Allocated: 500 * mib, Objects: 150 * mib, Live: 40 * mib, Free: 30 * mib}, // the burst's look
		{Allocated: 501 * mib, Objects: 150 * mib, Live: 40 * mib, Free: 30 * mib}, // quiet: release
		{Allocated: 501 * mib, Objects: 40 * mib, Live: 40 * mib},                  // read after the release
		{Allocated: 502 * mib, Objects: 41 * mib, Live: 40 * mib},                  // quiet, nothing to give
	}
	next := 0
	r := New(Config{Interval: DefaultInterval, MinBytes: DefaultMinBytes}, nil, nil)
	r.read = func() Heap { h := heaps[next]; next++; return h }
	released := 0
	r.release = func() { released++ }

	look := r.Step(Heap{Allocated: 100 * mib}) // 400 MiB allocated since: busy
	if released != 0 {
		t.Fatalf("released during the burst")
	}
	look = r.Step(look)
	if released != 1 || look != heaps[2] {
		t.Fatalf("quiet look: %d releases, returned %+v; want 1 and the look after the release", released, look)
	}
	r.Step(look)
	if released != 1 || next != len(heaps) {
		t.Errorf("after the release: %d releases, %d looks; want 1 and %d", released, next, len(heaps))
	}
}

// TestActivityCountsAtEachLook: with Config.Activity every look carries the
// host's work count at that moment (TestIdle has what it decides); without
// one it is 0.
func TestActivityCountsAtEachLook(t *testing.T) {
	work := uint64(3)
	r := New(Config{Interval: DefaultInterval, MinBytes: DefaultMinBytes, Activity: func() uint64 { return work }}, nil, nil)
	for _, want := range []uint64{3, 9} {
		work = want
		if got := r.read().Work; got != want {
			t.Fatalf("look's work = %d, want %d", got, want)
		}
	}
	if got := New(Config{Interval: DefaultInterval}, nil, nil).read().Work; got != 0 {
		t.Errorf("look's work without Activity = %d, want 0", got)
	}
}

func TestOffWithoutInterval(t *testing.T) {
	r := New(Config{}, nil, nil)
	r.read = func() Heap { t.Fatal("read the heap with releasing off"); return Heap{} }
	r.Run(t.Context()) // returns at once
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatalf("reading a counter: %v", err)
	}
	return m.GetCounter().GetValue()
}
