package extproc

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvselect/kvselect/selection"
)

// onResponseHeaders attributes the booking to the endpoint that served the
// response (protocol 004 v1.0 served metadata) and notes whether the
// response streams.
func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders, md *corev3.Metadata) error {
	served := servedEndpoint(md)
	if served != "" && st.bk.live && served != st.primary {
		st.rebook(served)
	}
	status := ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case "content-type":
			if strings.HasPrefix(strings.ToLower(headerValue(hv)), "text/event-stream") {
				st.sse = true
			}
		case ":status":
			status = headerValue(hv)
		}
	}
	st.statusSeen(status)
	if served == "" || served == st.primary {
		// A served endpoint the booking could not follow names no single
		// worker: its outcome is not attributed.
		st.reportOutcome(status)
	}
	var mut *extprocv3.HeaderMutation
	if st.s.opts.TestPickHeader {
		v := served
		switch {
		case md.GetFilterMetadata()[MetadataLB] == nil:
			v = "fail: missing envoy lb metadata"
		case served == "":
			v = "fail: missing destination endpoint served metadata"
		}
		mut = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderTestServed, v)}}
	}
	if h.GetEndOfStream() {
		// A response without a body ends here.
		st.responseEnd()
	}
	return st.send(responseHeadersResponse(mut))
}

// rebook attributes the booking to the rank behind the served endpoint; the
// core chooses it (the fallbacks sent first) and refuses an address that
// names no single rank, in which case the booking stays.
func (st *stream) rebook(served string) {
	preferred := make([]selection.WorkerRank, len(st.fallbacks))
	for i, f := range st.fallbacks {
		preferred[i] = selection.WorkerRank{WorkerID: f.WorkerID, DPRank: f.DPRank}
	}
	resp, err := st.s.svc.RebookServed(st.ctx, st.bk.id, served, preferred)
	if err != nil {
		st.s.log.Debug("extproc: served endpoint not attributed; booking stays", "selection_id", st.bk.id, "served", served, "err", err)
		return
	}
	st.primary = served
	st.worker = resp.WorkerID
	st.s.metrics.rebooked.Add(1)
}

// reportOutcome hands the response status of the worker that served the
// request to the passive health checks, once per stream: a 5xx is a failure
// (Envoy answers 503 itself when it cannot reach the worker), anything else a
// success. A status that does not parse says nothing and is not reported.
func (st *stream) reportOutcome(status string) {
	if st.outcome || !st.picked {
		return
	}
	code, err := strconv.Atoi(status)
	if err != nil || code < 100 || code > 599 {
		return
	}
	st.outcome = true
	o := selection.Outcome{OK: code < 500, Source: "extproc"}
	if !o.OK {
		o.Detail = "status " + status
		st.s.metrics.outcomeFailures.Add(1)
	} else {
		st.s.metrics.outcomeOK.Add(1)
	}
	tr, err := st.s.svc.ReportOutcome(st.worker, o)
	if err != nil {
		return // the worker left meanwhile
	}
	if tr == selection.HealthEjection {
		st.s.log.Warn("extproc: worker ejected by the passive health check", "worker_id", st.worker, "last", o.Detail)
	}
}

// onResponseBody: the first chunk means the prefill is done (TTFT); streamed
// output grows the booking by one output block per block_size tokens; the
// end of the body frees it.
func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	body, eos := b.GetBody(), b.GetEndOfStream()
	if len(body) > 0 || eos {
		st.bk.prefillComplete(st.ctx, st.sse)
	}
	// A routed request whose metrics are still open (its booking, if
	// still live, is one of those).
	if st.ex.mm != nil && !st.ex.finished && st.sse && len(body) > 0 {
		st.counter.feed(body)
		st.bk.outputTokens(st.ctx, st.counter.tokens())
	}
	st.responseChunk(body)
	if eos {
		// Freed before the last chunk goes back, so a gateway that has seen
		// the response end never sees its booking.
		st.responseEnd()
	}
	if st.responseMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Echo at once: SSE is never buffered.
		return st.send(st.echo.set(false, st.restoreModel(body), eos))
	}
	return st.send(bodyResponse(false, nil))
}

// onResponseTrailers: trailers (gRPC backends) end the response.
func (st *stream) onResponseTrailers() error {
	st.responseEnd()
	return st.send(responseTrailersResponse())
}
