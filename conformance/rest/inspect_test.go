package rest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// GET /loads lists every initialized partition matching the filters, sorted by
// (model_name, routing_group), with one row per (worker, rank) and the queue counters.
func TestLoadsFiltersAndShape(t *testing.T) {
	s := conformance(t)
	modelA, modelB := s.model(t, "a"), s.model(t, "b")
	wb := s.addSimpleWorker(t, modelB)
	id := s.workerID()
	b := workerBody(id, modelA)
	b["data_parallel_size"] = 2
	s.addWorker(t, b)
	b2 := workerBody(s.workerID(), modelA)
	b2["routing_group"] = "g2"
	s.addWorker(t, b2)

	r := s.get(t, "/loads?model_name="+url.QueryEscape(modelA)).want(t, http.StatusOK)
	var parts []partitionLoads
	r.decode(t, &parts)
	if len(parts) != 2 || parts[0].ModelName != modelA || parts[0].RoutingGroup != "default" ||
		parts[1].ModelName != modelA || parts[1].RoutingGroup != "g2" {
		t.Fatalf("GET /loads?model_name=A: want partitions default then g2 of A, got %+v", parts)
	}
	var raw []map[string]json.RawMessage
	r.decode(t, &raw)
	wantKeys(t, "ModelLoadResponse", raw[0], "model_name", "routing_group", "loads", "pending_count", "pending_isl_tokens")
	if *parts[0].PendingCount != 0 || *parts[0].PendingISLTokens != 0 {
		t.Errorf("no queueing: pending_count %d pending_isl_tokens %d, want 0", *parts[0].PendingCount, *parts[0].PendingISLTokens)
	}
	var rows []string
	for _, l := range parts[0].Loads {
		rows = append(rows, fmt.Sprintf("%d/%d", l.WorkerID, l.DPRank))
	}
	slices.Sort(rows)
	if want := []string{fmt.Sprintf("%d/0", id), fmt.Sprintf("%d/1", id)}; !equal(rows, want) {
		t.Fatalf("rows of a two-rank worker: %q, want %q", rows, want)
	}
	var rawRows struct {
		Loads []map[string]json.RawMessage `json:"loads"`
	}
	if err := json.Unmarshal(raw[0]["loads"], &rawRows.Loads); err != nil || len(rawRows.Loads) == 0 {
		t.Fatalf("loads rows: %v", err)
	}
	wantKeys(t, "PotentialLoad", rawRows.Loads[0], "worker_id", "dp_rank", "potential_prefill_tokens", "potential_decode_blocks", "active_requests")

	t.Run("routing_group filter", func(t *testing.T) {
		for _, p := range s.loads(t, "", "g2") {
			if p.RoutingGroup != "g2" {
				t.Fatalf("routing_group=g2 returned %+v", p)
			}
		}
		if got := s.loads(t, modelB, "g2"); len(got) != 0 {
			t.Fatalf("model B has no g2 partition, got %+v", got)
		}
		if got := s.loads(t, modelB, "default"); len(got) != 1 || len(got[0].Loads) != 1 || got[0].Loads[0].WorkerID != wb {
			t.Fatalf("model B/default: %+v", got)
		}
	})
	t.Run("unfiltered is sorted", func(t *testing.T) {
		all := s.loads(t, "", "")
		if !slices.IsSortedFunc(all, func(a, b partitionLoads) int {
			if c := strings.Compare(a.ModelName, b.ModelName); c != 0 {
				return c
			}
			return strings.Compare(a.RoutingGroup, b.RoutingGroup)
		}) {
			t.Fatalf("GET /loads not sorted by (model_name, routing_group)")
		}
		n := 0
		for _, p := range all {
			if p.ModelName == modelA || p.ModelName == modelB {
				n++
			}
		}
		if n != 3 {
			t.Fatalf("unfiltered GET /loads holds %d of this test's 3 partitions", n)
		}
	})
}

// /potential_loads projects the prompt onto every worker without booking, and blocks already
// active on a worker (same tracking hashes) are not counted twice (Dynamo's HTTP test
// explicit_replay_preserves_disabled_prefill_tracking).
func TestPotentialLoadsDeduplicatesActiveBlocks(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 4), "selection_id": s.selectionID("pl")})
	s.wantLoad(t, "after booking", model, id, 0, load{prefill: 4, decode: 1, active: 1})

	project := func(first, n int) potentialLoad {
		t.Helper()
		var rows []potentialLoad
		s.post(t, "/potential_loads", obj{"model_name": model, "token_ids": tokens(first, n)}).want(t, http.StatusOK).decode(t, &rows)
		if len(rows) != 1 || rows[0].WorkerID != id || rows[0].DPRank != 0 {
			t.Fatalf("potential_loads rows %+v, want one row for worker %d rank 0", rows, id)
		}
		return rows[0]
	}
	if got := project(1, 4); got.PotentialDecodeBlocks != 1 {
		t.Fatalf("same prompt as the active booking: potential_decode_blocks %d, want 1 (deduplicated)", got.PotentialDecodeBlocks)
	}
	if got := project(1, 8); got.PotentialDecodeBlocks != 2 {
		t.Fatalf("prompt extending the active booking by one block: potential_decode_blocks %d, want 2", got.PotentialDecodeBlocks)
	}
	if got := project(101, 4); got.PotentialDecodeBlocks != 2 {
		t.Fatalf("unrelated one-block prompt: potential_decode_blocks %d, want 2", got.PotentialDecodeBlocks)
	}
	s.wantLoad(t, "after potential_loads (books nothing)", model, id, 0, load{prefill: 4, decode: 1, active: 1})

	t.Run("not-ready partition", func(t *testing.T) {
		s.anchor(t)
		other := s.model(t, "empty")
		wantPartitionNotReady(t, s.post(t, "/potential_loads", obj{"model_name": other, "token_ids": tokens(1, 4)}), other)
	})
}

type overlapScoreRow struct {
	WorkerID                  uint64   `json:"worker_id"`
	DPRank                    uint32   `json:"dp_rank"`
	DeviceBlocks              uint64   `json:"device_blocks"`
	HostPinnedBlocks          uint64   `json:"host_pinned_blocks"`
	DiskBlocks                uint64   `json:"disk_blocks"`
	HostPinnedExtensionBlocks uint64   `json:"host_pinned_extension_blocks"`
	DiskExtensionBlocks       uint64   `json:"disk_extension_blocks"`
	SharedBeyondDeviceBlocks  *uint64  `json:"shared_beyond_device_blocks"`
	RouterCreditBlocks        *float64 `json:"router_credit_blocks"`
}

type overlapScores struct {
	BlockSize   uint32            `json:"block_size"`
	NumBlocks   uint64            `json:"num_blocks"`
	Workers     []overlapScoreRow `json:"workers"`
	SharedCache struct {
		Enabled        bool            `json:"enabled"`
		TotalHitBlocks uint64          `json:"total_hit_blocks"`
		Ranges         json.RawMessage `json:"ranges"`
	} `json:"shared_cache"`
}

// /overlap_scores: one row per rank of every schedulable worker, sorted by (worker_id,
// dp_rank), in blocks (Dynamo's HTTP test overlap_scores_returns_all_schedulable_worker_ranks).
func TestOverlapScoresListsEveryRank(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	w1, w2 := s.workerID(), s.workerID()
	b2 := workerBody(w2, model)
	b2["data_parallel_start_rank"] = 2
	b2["data_parallel_size"] = 2
	s.addWorker(t, b2) // registered first: rows must still come out sorted
	s.addWorker(t, workerBody(w1, model))
	incomplete := workerBody(s.workerID(), model)
	delete(incomplete, "endpoint")
	s.putWorker(t, incomplete)

	r := s.post(t, "/overlap_scores", obj{"model_name": model, "token_ids": tokens(1, 4)}).want(t, http.StatusOK)
	var got overlapScores
	r.decode(t, &got)
	var rows []string
	for _, w := range got.Workers {
		rows = append(rows, fmt.Sprintf("%d/%d", w.WorkerID, w.DPRank))
		if w.DeviceBlocks != 0 || w.HostPinnedBlocks != 0 || w.DiskBlocks != 0 || w.RouterCreditBlocks == nil || *w.RouterCreditBlocks != 0 {
			t.Errorf("fresh partition row %+v: want zero overlap", w)
		}
	}
	want := []string{fmt.Sprintf("%d/0", w1), fmt.Sprintf("%d/2", w2), fmt.Sprintf("%d/3", w2)}
	if !equal(rows, want) {
		t.Fatalf("overlap_scores rows %q, want %q", rows, want)
	}
	if got.BlockSize != 4 || got.NumBlocks != 1 || got.SharedCache.Enabled || got.SharedCache.TotalHitBlocks != 0 ||
		strings.TrimSpace(string(got.SharedCache.Ranges)) != "[]" {
		t.Fatalf("overlap_scores %s", r.body)
	}
	f := r.fields(t)
	wantKeys(t, "OverlapScoresResponse", f, "block_size", "num_blocks", "workers", "shared_cache")
	var raw struct {
		Workers     []map[string]json.RawMessage `json:"workers"`
		SharedCache map[string]json.RawMessage   `json:"shared_cache"`
	}
	r.decode(t, &raw)
	wantKeys(t, "overlap row", raw.Workers[0], "worker_id", "dp_rank", "device_blocks", "host_pinned_blocks", "disk_blocks",
		"host_pinned_extension_blocks", "disk_extension_blocks", "shared_beyond_device_blocks", "router_credit_blocks")
	wantKeys(t, "shared_cache", raw.SharedCache, "enabled", "total_hit_blocks", "ranges", "error")

	t.Run("num_blocks counts complete blocks", func(t *testing.T) {
		var got overlapScores
		s.post(t, "/overlap_scores", obj{"model_name": model, "token_ids": tokens(1, 11)}).want(t, http.StatusOK).decode(t, &got)
		if got.NumBlocks != 2 {
			t.Fatalf("11 tokens at block size 4: num_blocks %d, want 2", got.NumBlocks)
		}
	})
}

// GET /dump is the indexer recovery snapshot keyed "<model>:<group>", the format a replica
// started with --indexer-peers replays (Dynamo's HTTP test
// dump_exposes_compatible_indexer_snapshot).
func TestDumpShape(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	id := s.addSimpleWorker(t, model)
	g := workerBody(s.workerID(), model)
	g["routing_group"] = "g2"
	g["block_size"] = 8
	s.addWorker(t, g)
	s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(1, 8), "selection_id": s.selectionID("dump")})

	r := s.get(t, "/dump").want(t, http.StatusOK)
	var dump map[string]json.RawMessage
	r.decode(t, &dump)
	for key, bs := range map[string]uint32{model + ":default": 4, model + ":g2": 8} {
		raw, ok := dump[key]
		if !ok {
			t.Fatalf("GET /dump has no key %q", key)
		}
		var part struct {
			BlockSize *uint32                      `json:"block_size"`
			Events    []map[string]json.RawMessage `json:"events"`
			Error     *string                      `json:"error"`
		}
		if err := json.Unmarshal(raw, &part); err != nil {
			t.Fatalf("dump[%q]: %v (%s)", key, err, truncate(raw, 300))
		}
		if part.Error != nil {
			t.Fatalf("dump[%q] reports an indexer error: %s", key, *part.Error)
		}
		if part.BlockSize == nil || *part.BlockSize != bs || part.Events == nil {
			t.Fatalf("dump[%q] = %s; want block_size %d and an events array", key, truncate(raw, 300), bs)
		}
		for _, ev := range part.Events {
			wantKeys(t, "RouterEvent", ev, "worker_id", "event")
			var inner map[string]json.RawMessage
			if err := json.Unmarshal(ev["event"], &inner); err != nil {
				t.Fatalf("RouterEvent.event: %v", err)
			}
			wantKeys(t, "RouterEvent.event", inner, "event_id", "data", "dp_rank")
			var wid uint64
			if err := json.Unmarshal(ev["worker_id"], &wid); err != nil || wid != id {
				t.Errorf("dump[%q] holds an event of worker %s; only %d booked", key, ev["worker_id"], id)
			}
		}
	}
}
