package selection_test

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// The loop a caller runs: register workers, then per request select and book,
// report the prefill and the streamed tokens, and free; upkeep when the
// caller's ticker says so. The second request of the same prompt goes where
// the first one's blocks are cached.
func Example() {
	ctx := context.Background()
	rc := routerconfig.Default()
	rc.UseKVEvents = false // no KV events here: the index learns from the service's own bookings
	now := time.Unix(1_700_000_000, 0)
	svc, err := selection.New(selection.Config{
		Router: rc,
		Clock:  func() time.Time { return now }, // the caller's clock
		Rand:   rand.New(rand.NewPCG(1, 2)),     // seeded: the same choices every run
	})
	if err != nil {
		log.Fatal(err)
	}
	for id := uint64(1); id <= 2; id++ {
		endpoint, blockSize := fmt.Sprintf("10.0.0.%d:8000", id), uint32(4)
		if _, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: id, ModelName: "llama",
			Endpoint: &endpoint, BlockSize: &blockSize}); err != nil {
			log.Fatal(err)
		}
	}

	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	for i := range 2 {
		resp, err := svc.SelectAndReserve(ctx, &selection.SelectRequest{
			PartitionKey:  selection.PartitionKey{ModelName: "llama"},
			PromptRequest: selection.PromptRequest{TokenIDs: prompt},
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("request %d to %s, %d of %d prompt tokens cached there\n",
			i+1, resp.Endpoint, resp.Decision.CachedTokens, resp.Decision.ISLTokens)
		// ... the request goes to resp.Endpoint; its response comes back ...
		id := *resp.SelectionID
		if err := svc.PrefillComplete(ctx, id); err != nil {
			log.Fatal(err)
		}
		if _, err := svc.OutputTokens(ctx, id, 20); err != nil {
			log.Fatal(err)
		}
		if err := svc.Free(ctx, id); err != nil {
			log.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	svc.Maintain(ctx) // on the caller's ticker, every few seconds

	for _, l := range svc.Inspect().Loads(nil, nil)[0].Loads {
		fmt.Printf("worker %d: %d active requests\n", l.WorkerID, l.ActiveRequests)
	}
	// Output:
	// request 1 to 10.0.0.1:8000, 0 of 12 prompt tokens cached there
	// request 2 to 10.0.0.1:8000, 12 of 12 prompt tokens cached there
	// worker 1: 0 active requests
	// worker 2: 0 active requests
}
