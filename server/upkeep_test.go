package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// TestKeepEndsWakesForANewEnd: an idle ends loop sleeps with nothing due
// (an hour), so only EndsChanged can make it free a booking given a short
// estimated end afterwards; it does, and then sleeps again.
func TestKeepEndsWakesForANewEnd(t *testing.T) {
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint, bs := "http://worker-1:8000", uint32(4)
	if _, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: 1, ModelName: "m", Endpoint: &endpoint, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { KeepEnds(ctx, svc); close(done) }()
	// Let the loop go idle first: with nothing kept it waits an hour.
	time.Sleep(20 * time.Millisecond)

	for i, id := range []string{"a", "b"} {
		out := uint32(1)
		req := &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "m"},
			PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3, 4, 5}}, SelectionID: &id, ExpectedOutputTokens: &out}
		if _, err := svc.SelectAndReserve(ctx, req); err != nil {
			t.Fatal(err)
		}
		end, err := svc.EndByEstimate(ctx, id, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Generous: the loop must wake for the end, not on some tick.
		proctest.Eventually(t, fmt.Sprintf("booking %d (%s), given an end at %v, to be freed", i, id, end), 10*time.Second,
			func() bool { return svc.Inspect().EstimatedEnds() == 0 })
	}
	cancel()
	<-done
}
