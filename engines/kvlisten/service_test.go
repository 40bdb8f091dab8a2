package kvlisten

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// TestServiceIndexesRegisteredWorkerEvents is the end-to-end path: a worker
// registered with the selection service, whose engine publishes real KV events
// on ZMQ, shows exactly its cached blocks in /overlap_scores; deleting the
// worker detaches its listener and purges them.
func TestServiceIndexesRegisteredWorkerEvents(t *testing.T) {
	e := newEngine(t, true)
	l := newListeners(t)
	svc, err := selection.New(selection.Config{Router: routerconfig.Default(), Listeners: l})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	endpoint, bs := "http://worker:8000", uint32(blockSize)
	rank := uint32(0)
	rec, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: 7, ModelName: "m", Endpoint: &endpoint, BlockSize: &bs,
		KVEventsEndpoint: &e.pubEP, ReplayEndpoint: &e.replayEP, DataParallelStartRank: &rank})
	if err != nil || rec.Lifecycle != catalog.Schedulable {
		t.Fatalf("upsert: %+v %v", rec, err)
	}
	c := newChain(0, 5000, 6)
	for _, b := range c.batches {
		e.publish(b)
	}
	e.heartbeat(0)
	defer e.stopHeartbeat()
	isl := uint64(len(c.locals) * blockSize)
	query := &selection.PromptQuery{PartitionKey: selection.PartitionKey{ModelName: "m"}, PromptRequest: selection.PromptRequest{
		BlockHashes: i64(c.locals), SequenceHashes: i64(kvhash.SequenceHashes(c.locals)), ISLTokens: &isl}}
	deviceBlocks := func() uint32 {
		resp, err := svc.Inspect().OverlapScores(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range resp.Workers {
			if row.WorkerID == 7 {
				return row.DeviceBlocks
			}
		}
		return 0
	}
	eventually(t, "the published blocks in /overlap_scores", func() bool { return deviceBlocks() == 6 })

	// GET /workers shows the rank's listener state; /metrics its counters.
	ws := svc.Workers(nil, nil)
	if len(ws) != 1 {
		t.Fatalf("%d workers", len(ws))
	}
	if st, ok := ws[0].KVEventsStatus[0]; !ok || !st.Complete || !st.Connected || st.LastSequence == nil || st.LostBatches != 0 {
		t.Fatalf("kv_events_status %+v", ws[0].KVEventsStatus)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(l)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["worker_id"] != "7" || labels["model_name"] != "m" {
				continue
			}
			got[f.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if got["kvselect_kv_events_blocks_total"] < 6 || got["kvselect_kv_events_batches_total"] < 6 ||
		got["kvselect_kv_events_connected"] != 1 || got["kvselect_kv_events_complete"] != 1 {
		t.Fatalf("metrics for worker 7: %v", got)
	}
	if _, err := svc.DeleteWorker(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Status(index.Partition{Model: "m", RoutingGroup: "default"}, index.WorkerKey{WorkerID: 7}); ok {
		t.Fatal("the listener survived the delete")
	}
}

func i64(in []uint64) []int64 {
	out := make([]int64, len(in))
	for i, v := range in {
		out[i] = int64(v)
	}
	return out
}
