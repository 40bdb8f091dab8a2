package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
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
}

func (m Mismatch) String() string {
	return fmt.Sprintf("replica %s, worker %d: pool %d blocks, index %d; %d missing %x, %d extra %x",
		m.Replica, m.Worker, m.Pool, m.Indexed, m.NMiss, m.Missing, m.NExtra, m.Extra)
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
			for _, m := range ms {
				p.violate("index truth", m.String())
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
		for _, w := range fl.workers {
			if w.sim {
				continue
			}
			pool, set := pools[w.id], indexed[w.id]
			m := Mismatch{Replica: r.name, Worker: w.id, Pool: len(pool), Indexed: len(set)}
			inPool := map[uint64]bool{}
			for _, h := range pool {
				inPool[h] = true
				if !set[h] {
					m.NMiss++
					if len(m.Missing) < 4 {
						m.Missing = append(m.Missing, h)
					}
				}
			}
			for h := range set {
				if !inPool[h] {
					m.NExtra++
					if len(m.Extra) < 4 {
						m.Extra = append(m.Extra, h)
					}
				}
			}
			if m.NMiss+m.NExtra > 0 {
				ms = append(ms, m)
			}
		}
	}
	return ms, total, nil
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
