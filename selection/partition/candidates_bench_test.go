package partition

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/engine"
	"github.com/kvselect/kvselect/selection/health"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// BenchmarkCandidates joins the load projections of every rank with the
// overlap rows of a prompt cached on every rank (a shared system prompt),
// on fleets of workers with 8 data-parallel ranks each.
func BenchmarkCandidates(b *testing.B) {
	for _, ranks := range []int{1024, 4096, 16384} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			ws := &Workers{ByID: map[uint64]*catalog.Record{}}
			var projs []loads.Projection
			var overlaps []index.Overlap
			for w := range uint64(ranks / 8) {
				ws.ByID[w+1] = &catalog.Record{WorkerID: w + 1, DataParallelSize: new(uint32(8))}
				for r := range uint32(8) {
					k := index.WorkerKey{WorkerID: w + 1, DPRank: r}
					ws.Ranks = append(ws.Ranks, k)
					projs = append(projs, loads.Projection{WorkerLoad: loads.WorkerLoad{Worker: k}})
					overlaps = append(overlaps, index.Overlap{Worker: k, Device: 64})
				}
			}
			rc := routerconfig.Default()
			j := &Judge{Health: &health.Table{}, Engines: &engine.Table{}, Engine: &engine.Config{}, Router: &rc, Clock: time.Now}
			out := make([]scheduler.Candidate, 0, ranks)
			now := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				out, _ = ws.Candidates(out[:0], projs, overlaps, j, "", now)
			}
			if len(out) != ranks || out[ranks-1].Overlap.Device != 64 {
				b.Fatalf("%d candidates, last %+v", len(out), out[len(out)-1])
			}
		})
	}
}

// TestCandidatesJoinOverlapsInAnyOrder: each candidate gets its own rank's
// overlap row whether the projections come sorted by rank or not, and a
// rank without a row gets none.
func TestCandidatesJoinOverlapsInAnyOrder(t *testing.T) {
	ws := &Workers{ByID: map[uint64]*catalog.Record{}}
	var overlaps []index.Overlap
	for w := range uint64(3) {
		ws.ByID[w+1] = &catalog.Record{WorkerID: w + 1, DataParallelSize: new(uint32(2))}
		for r := range uint32(2) {
			k := index.WorkerKey{WorkerID: w + 1, DPRank: r}
			ws.Ranks = append(ws.Ranks, k)
			if k != (index.WorkerKey{WorkerID: 2, DPRank: 1}) {
				overlaps = append(overlaps, index.Overlap{Worker: k, Device: uint32(10*(w+1) + uint64(r))})
			}
		}
	}
	rc := routerconfig.Default()
	j := &Judge{Health: &health.Table{}, Engines: &engine.Table{}, Engine: &engine.Config{}, Router: &rc, Clock: time.Now}
	for _, order := range [][]int{{0, 1, 2, 3, 4, 5}, {5, 0, 1, 2, 3, 4}, {0, 4, 1, 2, 3, 5}, {5, 4, 3, 2, 1, 0}} {
		var projs []loads.Projection
		for _, i := range order {
			projs = append(projs, loads.Projection{WorkerLoad: loads.WorkerLoad{Worker: ws.Ranks[i]}})
		}
		out, _ := ws.Candidates(nil, projs, overlaps, j, "", time.Now())
		if len(out) != 6 {
			t.Fatalf("order %v: %d candidates", order, len(out))
		}
		for _, c := range out {
			want := uint32(10*c.Worker.WorkerID) + c.Worker.DPRank
			if c.Worker == (index.WorkerKey{WorkerID: 2, DPRank: 1}) {
				want = 0
			}
			if c.Overlap.Device != want {
				t.Errorf("order %v: %v got overlap %d, want %d", order, c.Worker, c.Overlap.Device, want)
			}
		}
	}
}
