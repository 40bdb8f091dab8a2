// Package selection is kvselect's embedded selection service: the worker
// catalog, KV-overlap indexing, KV- and load-aware worker selection,
// select/reserve booking with the reservation lifecycle, the pending-selection
// cache and session affinity — everything Dynamo's standalone selection
// service decides
// (https://docs.nvidia.com/dynamo/dev/components/router/standalone-selection-service),
// as a Go API. The REST and ext_proc fronts are thin translations over
// Service.
//
// # Usage
//
// Like etcd's raft package, the service is a state machine its caller drives:
// it does no I/O of its own, starts no goroutine and keeps no clock (time
// comes from Config.Clock, randomness from Config.Rand). The caller builds it,
// keeps its catalog current, asks it for a worker per request, reports the
// request's progress, and runs its upkeep on a ticker of its own.
//
// Build the service and register the workers (a discovery source or the REST
// API usually does this):
//
//	svc, err := selection.New(selection.Config{Router: routerconfig.Default()})
//	if err != nil {
//		return err
//	}
//	rec, err := svc.UpsertWorker(ctx, catalog.Record{WorkerID: 1, ModelName: "llama",
//		Endpoint: &endpoint, BlockSize: &blockSize, KVEventsEndpoint: &events})
//
// For each request, choose a worker and book its load in one step, send the
// request there, and report what becomes of it:
//
//	resp, err := svc.SelectAndReserve(ctx, &selection.SelectRequest{
//		PartitionKey:  selection.PartitionKey{ModelName: "llama"},
//		PromptRequest: selection.PromptRequest{TokenIDs: tokens},
//	})
//	if err != nil {
//		return err // selection.KindOf(err) says which status to answer
//	}
//	id := *resp.SelectionID
//	// ... send the request to resp.Endpoint ...
//	svc.PrefillComplete(ctx, id)             // the first response byte came back
//	svc.OutputTokens(ctx, id, generated)     // as the generated tokens stream
//	svc.Free(ctx, id)                        // the response ended, however it ended
//
// Upkeep — expiry of stale bookings, pending selections, idle sessions,
// approximate-index entries and flow-control waits — runs when the caller
// says so, every few seconds (server.Upkeep does this):
//
//	t := time.NewTicker(5 * time.Second)
//	defer t.Stop()
//	for range t.C {
//		svc.Maintain(ctx)
//	}
//
// A caller's goroutine blocks inside a selection only while the partition's
// queue holds it (queueing on and every worker busy), and honours its
// context. Everything a status page or a metrics exporter reads goes through
// Service.Inspect; the replica-sync and recovery adapters go through
// Service.Replica; the KV-event listeners plug in as Config.Listeners.
//
// # Inside
//
// The Service wires subsystems that each live in a package of their own and
// are handed what they need: partition (per-partition state: index, loads,
// sessions, the worker snapshot, the scheduling lock), admission (the queue
// and flow control of a busy partition), reservation (selection ids to
// bookings), health (ejection), engine (what engines report of themselves),
// decisionlog, readiness, textindex, randsrc and apierr (the error kinds).
// The decision itself is scheduler's; the data structures are index, loads,
// affinity, pending and kvhash. The lock order is on Service.
package selection
