package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection/index"
)

// Mismatch is a replica's index disagreeing with a worker's cache.
type Mismatch struct {
	Replica string   `json:"replica"`
	Worker  int      `json:"worker"`
	Pool    int      `json:"pool_blocks"`
	Indexed int      `json:"indexed_blocks"`
	Missing []uint64 `json:"missing,omitempty"` // in the pool, not in the index (first few)
	Extra   []uint64 `json:"extra,omitempty"`   // in the index, not in the pool (first few)
	NMiss   int      `json:"n_missing"`
	NExtra  int      `json:"n_extra"`
	// Listener is the replica's KV event counters for the worker's ranks
	// (kvselect_kv_events_*, without the prefix), read when the mismatch is
	// reported: whether it knew of gaps, losses, rejected events or restarts.
	Listener map[string]float64 `json:"listener,omitempty"`
}

func (m Mismatch) String() string {
	s := fmt.Sprintf("replica %s, worker %d: pool %d blocks, index %d; %d missing %x, %d extra %x",
		m.Replica, m.Worker, m.Pool, m.Indexed, m.NMiss, m.Missing, m.NExtra, m.Extra)
	if len(m.Listener) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(m.Listener)) {
			kv = append(kv, fmt.Sprintf("%s=%g", k, m.Listener[k]))
		}
		s += "; its listener: " + strings.Join(kv, " ")
	}
	return s
}

// listenerCounters reads the replica's KV event listener series for worker
// id, summed over its ranks. Nonzero counters only: a mismatch with none
// (no gap, loss, rejection or restart known) is one the listener did not see.
func (fl *cluster) listenerCounters(ctx context.Context, rest string, id int) map[string]float64 {
	s, err := promtext.Scrape(ctx, fl.hc, rest+"/metrics")
	if err != nil {
		return map[string]float64{"scrape_failed": 1}
	}
	out := map[string]float64{}
	for _, x := range s.Where("worker_id", strconv.Itoa(id)) {
		name, ok := strings.CutPrefix(x.Name, "kvselect_kv_events_")
		if ok && x.Value != 0 {
			out[name] += x.Value
		}
	}
	return out
}

// IndexTruth is the end-of-run comparison of every replica's index with every
// worker's prefix cache.
type IndexTruth struct {
	OK         bool          `json:"ok"`
	Settled    time.Duration `json:"settled"` // how long after the faults stopped they agreed
	Blocks     int           `json:"blocks"`  // blocks compared per replica
	Nudges     int           `json:"nudges"`
	Mismatches []Mismatch    `json:"mismatches,omitempty"`
}

// checkIndexTruth compares until every replica agrees with every worker or a
// minute passes. A publisher's last gap only shows when its next batch
// arrives, so a worker some replica disagrees about gets a small request of
// its own (a nudge) between rounds.
func (p *phaseRun) checkIndexTruth(ctx context.Context) IndexTruth {
	begin := time.Now()
	var it IndexTruth
	for round := 0; ; round++ {
		ms, blocks, err := p.fl.compareIndexes(ctx)
		it.Blocks = blocks
		if err == nil && len(ms) == 0 {
			it.OK, it.Settled, it.Mismatches = true, time.Since(begin), nil
			return it
		}
		it.Mismatches = ms
		if time.Since(begin) > time.Minute {
			if err != nil {
				p.violate("index truth", err.Error())
			}
			for i := range ms {
				for _, r := range p.fl.replicas {
					if r.name == ms[i].Replica {
						ms[i].Listener = p.fl.listenerCounters(ctx, r.kv.REST, ms[i].Worker)
					}
				}
				p.violate("index truth", ms[i].String())
			}
			return it
		}
		nudged := map[int]bool{}
		for _, m := range ms {
			if !nudged[m.Worker] {
				nudged[m.Worker] = true
				it.Nudges++
				p.fl.nudge(ctx, m.Worker, round)
			}
		}
		time.Sleep(2 * time.Second)
	}
}

// compareIndexes reads every worker's pool and every replica's dump, pools
// first: a block the traffic (stopped by now) cannot change.
func (fl *cluster) compareIndexes(ctx context.Context) ([]Mismatch, int, error) {
	pools := map[int][]uint64{}
	total := 0
	for _, w := range fl.workers {
		if w.sim {
			continue
		}
		var d mockworker.PoolDump
		if err := fleet.GetJSON(ctx, fl.hc, w.url()+"/admin/pool", &d); err != nil {
			return nil, 0, fmt.Errorf("worker %d pool: %w", w.id, err)
		}
		for _, r := range d.Ranks {
			pools[w.id] = append(pools[w.id], r.Blocks...)
		}
		slices.Sort(pools[w.id])
		total += len(pools[w.id])
	}
	var ms []Mismatch
	for _, r := range fl.replicas {
		status, b, err := fleet.Call(ctx, fl.hc, http.MethodGet, r.kv.REST+"/dump", nil)
		if err != nil || status != http.StatusOK {
			return nil, total, fmt.Errorf("replica %s dump: %d %v", r.name, status, err)
		}
		var d index.Dump
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, total, fmt.Errorf("replica %s dump: %w", r.name, err)
		}
		indexed := map[int]map[uint64]bool{}
		for _, part := range d {
			indexedBlocks(part, indexed)
		}
		for _, w := range fl.workers {
			if w.sim {
				continue
			}
			pool, set := pools[w.id], indexed[w.id]
			missing, extra := diffBlocks(pool, set)
			m := Mismatch{Replica: r.name, Worker: w.id, Pool: len(pool), Indexed: len(set),
				Missing: missing[:min(len(missing), 4)], Extra: extra[:min(len(extra), 4)],
				NMiss: len(missing), NExtra: len(extra)}
			if m.NMiss+m.NExtra > 0 {
				ms = append(ms, m)
			}
		}
	}
	return ms, total, nil
}

// indexedBlocks adds the engine block hashes a partition's dump holds to
// indexed, by worker id. A dump has the blocks reachable from the root, as
// the index matches prompts; a block the index holds under a hole is left
// out, and counts as missing.
func indexedBlocks(part index.PartitionDump, indexed map[int]map[uint64]bool) {
	for _, ev := range part.Events {
		if ev.Event.Data.Stored == nil {
			continue
		}
		set := indexed[int(ev.WorkerID)]
		if set == nil {
			set = map[uint64]bool{}
			indexed[int(ev.WorkerID)] = set
		}
		for _, blk := range ev.Event.Data.Stored.Blocks {
			set[uint64(blk.BlockHash)] = true
		}
	}
}

// diffBlocks returns the blocks of a worker's pool the index does not hold
// (missing, in pool order) and those it holds that the pool does not (extra).
func diffBlocks(pool []uint64, indexed map[uint64]bool) (missing, extra []uint64) {
	inPool := make(map[uint64]bool, len(pool))
	for _, h := range pool {
		inPool[h] = true
		if !indexed[h] {
			missing = append(missing, h)
		}
	}
	for h := range indexed {
		if !inPool[h] {
			extra = append(extra, h)
		}
	}
	return missing, extra
}

// nudge sends worker id one small request of its own, straight to it.
func (fl *cluster) nudge(ctx context.Context, id, round int) {
	for _, w := range fl.workers {
		if w.id != id {
			continue
		}
		toks := make([]string, blockSize+1)
		for i := range toks {
			toks[i] = fmt.Sprint(30000 + (round*7+id*131+i)%1999)
		}
		body := fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":1}`, model, strings.Join(toks, ","))
		fleet.Call(ctx, fl.hc, http.MethodPost, w.url()+"/v1/completions", []byte(body))
	}
}
