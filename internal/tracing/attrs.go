package tracing

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/kvselect/kvselect/selection"
)

// Span names, shared by both fronts.
const (
	SpanRequest = "kvselect.request" // one routed request, from its headers to its response's end (ext_proc)
	SpanParse   = "kvselect.parse"   // identity: headers and body to a selection request
	SpanSelect  = "kvselect.select"  // the selection and its booking
)

// Booking lifecycle events on a request's span. The picker reports the
// output blocks a streamed answer added on its free event
// (kvselect.output_blocks); the REST API, where each output block is a call
// of its own, as an event per call.
const (
	EventPrefillComplete = "kvselect.prefill_complete"
	EventOutputBlocks    = "kvselect.output_blocks"
	EventFreed           = "kvselect.freed"
)

// SelectionAttributes describe a decision on its span: the partition, how
// many ranks were weighed, the chosen rank and its cost beside the
// runner-up's, the overlap per tier in blocks, the prefill the booking
// carries, the queue wait and, for a disaggregated request, the remote
// prefill.
func SelectionAttributes(resp *selection.SelectResponse) []attribute.KeyValue {
	d := &resp.Decision
	bs := max(uint64(resp.BlockSize), 1)
	a := make([]attribute.KeyValue, 0, 24) // the most appended below
	a = append(a,
		attribute.String("kvselect.model", resp.ModelName),
		attribute.String("kvselect.routing_group", resp.RoutingGroup),
		attribute.Int("kvselect.candidates", d.Candidates),
		attribute.Int64("kvselect.worker_id", int64(resp.WorkerID)),
		attribute.Int("kvselect.dp_rank", int(resp.DPRank)),
		attribute.String("kvselect.endpoint", resp.Endpoint),
		attribute.Float64("kvselect.cost", d.Cost),
		attribute.Int64("kvselect.overlap.gpu_blocks", int64(resp.Overlap.GPU/bs)),
		attribute.Int64("kvselect.overlap.cpu_blocks", int64(resp.Overlap.CPU/bs)),
		attribute.Int64("kvselect.overlap.disk_blocks", int64(resp.Overlap.Disk/bs)),
		attribute.Int("kvselect.isl_tokens", d.ISLTokens),
		attribute.Int("kvselect.cached_tokens", d.CachedTokens),
		attribute.Int("kvselect.best_cached_tokens", d.BestCachedTokens),
		attribute.Int64("kvselect.effective_prefill_tokens", int64(resp.EffectivePrefillTokens)),
		attribute.Float64("kvselect.queue_wait_ms", float64(d.QueueWait.Microseconds())/1000),
	)
	if resp.SelectionID != nil {
		a = append(a, attribute.String("kvselect.selection_id", *resp.SelectionID))
	}
	if r := d.RunnerUp; r != nil {
		a = append(a, attribute.Float64("kvselect.runner_up.cost", r.Cost),
			attribute.Int64("kvselect.runner_up.worker_id", int64(r.WorkerID)),
			attribute.Int("kvselect.runner_up.dp_rank", int(r.DPRank)))
	}
	if resp.Prefill.Set {
		pf := resp.Prefill.Selection
		a = append(a, attribute.Bool("kvselect.remote_prefill", pf != nil))
		if pf != nil {
			a = append(a, attribute.Int64("kvselect.prefill.worker_id", int64(pf.WorkerID)),
				attribute.String("kvselect.prefill.endpoint", pf.Endpoint))
		}
		if pd := resp.PrefillDecision; pd != nil {
			a = append(a, attribute.String("kvselect.prefill.reason", pd.Reason))
		}
	}
	return a
}
