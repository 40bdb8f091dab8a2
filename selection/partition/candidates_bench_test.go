package partition

import (
	"fmt"
	"slices"
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
			out := make([]scheduler.Scored, 0, ranks)
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
// overlap row and record whether the projections come sorted by rank or
// not, and whether the records are joined by walking Ranks (a snapshot from
// ReplaceWorkers) or through ByID; a rank without a row gets none, and a
// projected rank that is not schedulable is no candidate.
func TestCandidatesJoinOverlapsInAnyOrder(t *testing.T) {
	ws := &Workers{ByID: map[uint64]*catalog.Record{}}
	var overlaps []index.Overlap
	for w := range uint64(3) {
		ws.ByID[w+1] = &catalog.Record{WorkerID: w + 1, DataParallelSize: new(uint32(2)), Taints: []string{fmt.Sprint("t", w+1)}}
		for r := range uint32(2) {
			k := index.WorkerKey{WorkerID: w + 1, DPRank: r}
			ws.Ranks = append(ws.Ranks, k)
			if k != (index.WorkerKey{WorkerID: 2, DPRank: 1}) {
				overlaps = append(overlaps, index.Overlap{Worker: k, Device: uint32(10*(w+1) + uint64(r))})
			}
		}
	}
	gone := index.WorkerKey{WorkerID: 2, DPRank: 7} // projected, not schedulable
	ranks := append(slices.Clone(ws.Ranks), gone)
	rc := routerconfig.Default()
	j := &Judge{Health: &health.Table{}, Engines: &engine.Table{}, Engine: &engine.Config{}, Router: &rc, Clock: time.Now}
	for _, withRecs := range []bool{false, true} {
		ws.recs = nil
		if withRecs {
			for _, w := range ws.Ranks {
				ws.recs = append(ws.recs, ws.ByID[w.WorkerID])
			}
		}
		for _, order := range [][]int{{0, 1, 2, 6, 3, 4, 5}, {5, 0, 1, 2, 3, 4, 6}, {0, 4, 1, 2, 6, 3, 5}, {6, 5, 4, 3, 2, 1, 0}} {
			var projs []loads.Projection
			for _, i := range order {
				projs = append(projs, loads.Projection{WorkerLoad: loads.WorkerLoad{Worker: ranks[i]}})
			}
			out, _ := ws.Candidates(nil, projs, overlaps, j, "", time.Now())
			if len(out) != 6 {
				t.Fatalf("records joined along Ranks %v, order %v: %d candidates", withRecs, order, len(out))
			}
			for _, c := range out {
				want := uint32(10*c.Worker.WorkerID) + c.Worker.DPRank
				if c.Worker == (index.WorkerKey{WorkerID: 2, DPRank: 1}) {
					want = 0
				}
				if c.Overlap.Device != want || !slices.Equal(c.Taints, []string{fmt.Sprint("t", c.Worker.WorkerID)}) {
					t.Errorf("records joined along Ranks %v, order %v: %v got overlap %d and taints %v, want %d and its own",
						withRecs, order, c.Worker, c.Overlap.Device, c.Taints, want)
				}
			}
		}
	}
}
