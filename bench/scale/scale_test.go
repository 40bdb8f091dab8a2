package scale

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/report/reporttest"
	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// small is a run small enough for the default test run: two fleet sizes, a
// cache of 64 blocks per rank, short prompts.
func small() Config {
	c := Defaults()
	c.Ranks, c.RanksPerWorker, c.RanksPerGroup = []int{8, 24}, 4, 4
	c.CacheBlocks, c.SystemTokens, c.QuestionTokens, c.OutputTokens = 64, 128, 128, 64
	c.Requests, c.Warmup, c.InFlight = 40, 10, 8
	c.IngestEngines, c.IngestSeconds = []int{8}, 0.5
	c.Replicas, c.FleetRates, c.ReplicaDuration, c.ReplicaRanks = []int{1, 2}, []float64{200}, 300*time.Millisecond, 8
	c.Parts = []string{"selection", "ingest"}
	return c
}

// The selection and ingest curves come out whole and sane: every rank's
// cache full and indexed, latencies ordered, the hot prompt and the groups
// hit, events of both kinds decoded. Figures are measurements and never
// compared with a time.
func TestSelectionAndIngestAreSane(t *testing.T) {
	c := small()
	rep, err := Run(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Selection) != len(c.Ranks) || len(rep.Ingest) != len(c.IngestEngines) {
		t.Fatalf("%d selection points, %d ingest points", len(rep.Selection), len(rep.Ingest))
	}
	for i, p := range rep.Selection {
		if p.Ranks != c.Ranks[i] || p.Workers != c.Ranks[i]/c.RanksPerWorker {
			t.Errorf("point %d: %d ranks, %d workers", i, p.Ranks, p.Workers)
		}
		if p.IndexedBlocks != int64(p.Ranks*c.CacheBlocks) {
			t.Errorf("%d ranks: %d indexed blocks, want every cache full (%d)", p.Ranks, p.IndexedBlocks, p.Ranks*c.CacheBlocks)
		}
		if p.Requests != c.Requests || p.P50 <= 0 || p.P50 > p.P90 || p.P90 > p.P99 || p.P99 > p.Max || p.CPUPerRequest <= 0 {
			t.Errorf("%d ranks: latencies %+v", p.Ranks, p)
		}
		if p.HitShare <= 0 || p.HitShare > 1 {
			t.Errorf("%d ranks: hit share %v", p.Ranks, p.HitShare)
		}
		if p.BytesPerRank <= 0 || p.BytesPerBlock <= 0 || p.PopulateEvents == 0 {
			t.Errorf("%d ranks: memory %+v", p.Ranks, p)
		}
	}
	in := rep.Ingest[0]
	if in.Events == 0 || in.Stored == 0 || in.Removed == 0 || in.Batches == 0 || in.EventsPerEngineSecond <= 0 ||
		in.NsPerEvent <= 0 || in.SaturationEngines <= 0 {
		t.Errorf("ingest: %+v", in)
	}
	if in.IndexedBlocks != int64(in.Engines*c.CacheBlocks) {
		t.Errorf("ingest: %d blocks cached, want %d", in.IndexedBlocks, in.Engines*c.CacheBlocks)
	}

	var out bytes.Buffer
	if err := rep.Table(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Selection on one core", "Ingest on one core", "saturation engines"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	reporttest.CheckSVG(t, filepath.Join(dir, "scale-selection.svg"), "p99")
	reporttest.CheckSVG(t, filepath.Join(dir, "scale-memory.svg"), "bytes per indexed block")
	reporttest.CheckSVG(t, filepath.Join(dir, "scale-ingest.svg"), "25 %")
	got := reporttest.ReadJSON[Report](t, filepath.Join(dir, "scale.json"))
	if len(got.Selection) != len(rep.Selection) {
		t.Errorf("scale.json: %d selection points", len(got.Selection))
	}
}

// Two replicas exchange every booking event over the real mesh: each
// request's admission, prefill completion and free reach the peer and are
// applied. Wall-clock driven, so skipped with -short.
func TestReplicaMeshCarriesEveryRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock experiment over loopback ZMQ")
	}
	c := small()
	c.Parts = []string{"replicas"}
	rep, err := Run(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Replicas) != 2 {
		t.Fatalf("%d replica points", len(rep.Replicas))
	}
	one, two := rep.Replicas[0], rep.Replicas[1]
	if one.Replicas != 1 || one.Received != 0 || one.Served == 0 || one.Published != 3*uint64(one.Served) {
		t.Errorf("one replica: %+v", one)
	}
	if two.Replicas != 2 || two.Served == 0 || two.Published != 3*uint64(two.Served) || two.Received == 0 || two.Applied == 0 {
		t.Errorf("two replicas: %+v", two)
	}
	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	reporttest.CheckSVG(t, filepath.Join(dir, "scale-replicas.svg"), "2 replicas")
}

// The simulated engine's events are vLLM's: a request stores its prompt's
// uncached blocks once, reuses the cached prefix, and a full cache evicts
// one BlockRemoved per block, least recently used first.
func TestEngineStoresOnceAndEvictsLRU(t *testing.T) {
	const bs = 4
	p := newPrompts(2, 8, 8, 4, bs) // prompts of 4 blocks: 2 system, 2 question
	for _, tc := range []struct {
		name         string
		capacity     int
		requests     [][2]int // (group, question)
		stored       []int    // blocks stored by each request's prefill
		removedTotal int
	}{
		{"a cached prefix is reused", 16, [][2]int{{0, 0}, {0, 1}, {0, 0}}, []int{4, 2, 0}, 0},
		{"another group shares nothing", 16, [][2]int{{0, 0}, {1, 0}}, []int{4, 4}, 0},
		{"a full cache evicts", 4, [][2]int{{0, 0}, {1, 0}}, []int{4, 4}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(tc.capacity, bs, 1)
			removed := 0
			for i, rq := range tc.requests {
				evs, _ := e.prefill(p.prompt(rq[0], rq[1]))
				stored := 0
				for _, ev := range evs {
					stored += storedBlocks(ev)
					if rm, ok := ev.(*kvpublish.BlockRemoved); ok {
						removed += len(rm.BlockHashes)
					}
				}
				if stored != tc.stored[i] {
					t.Errorf("request %d stored %d blocks, want %d", i, stored, tc.stored[i])
				}
			}
			if removed != tc.removedTotal || e.cached() > tc.capacity {
				t.Errorf("removed %d blocks, want %d; %d cached of %d", removed, tc.removedTotal, e.cached(), tc.capacity)
			}
		})
	}
}

func TestConfigRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown part", func(c *Config) { c.Parts = []string{"selection", "gpu"} }, "unknown part"},
		{"zero ranks", func(c *Config) { c.Ranks = []int{0} }, "positive"},
		{"prompt not in blocks", func(c *Config) { c.SystemTokens = 100 }, "multiple"},
		{"cache smaller than a request", func(c *Config) { c.CacheBlocks = 8 }, "cannot hold"},
		{"hot share above one", func(c *Config) { c.HotShare = 2 }, "hot share"},
		{"zero fleet rate", func(c *Config) { c.FleetRates = []float64{0} }, "fleet rates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := small()
			tc.edit(&c)
			_, err := Run(context.Background(), c, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}
