package extproc

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
)

// onRequestHeaders decides, per mode, whether the pick waits for the body:
// FULL_DUPLEX_STREAMED defers the headers response until the body's end (the
// only mode where Envoy lets the processor read the body first); BUFFERED
// must answer the headers at once (Envoy holds the body back until the
// headers are answered, so waiting for it would deadlock) and picks on the
// body message; STREAMED and NONE route before any body reaches the
// processor, so they pick from the headers alone, as do requests without a
// body.
func (st *stream) onRequestHeaders(h *extprocv3.HttpHeaders) error {
	if st.headersIn {
		// One stream is one request: a second request would book twice.
		return status.Error(codes.InvalidArgument, "ext_proc: request headers received twice on one stream")
	}
	st.headersIn = true
	err := readHeaders(h.GetHeaders(), &st.id)
	st.startRequest()
	if err != nil {
		return st.immediate(typev3.StatusCode_BadRequest, err.Error())
	}
	if h.GetEndOfStream() {
		return st.pickAndRoute(false)
	}
	switch st.requestMode() {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		return st.send(headersResponse(nil))
	default:
		return st.pickAndRoute(false)
	}
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) error {
	switch st.requestMode() {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if st.picked {
			// Body after the decision (not expected from Envoy): pass it on.
			return st.send(streamedBody(true, b.GetBody(), b.GetEndOfStream()))
		}
		if err := st.appendBody(b.GetBody()); err != nil {
			return err
		}
		if !b.GetEndOfStream() {
			return nil
		}
		return st.pickAndRoute(true)
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		if st.picked {
			return st.send(bodyResponse(true, nil))
		}
		if err := st.appendBody(b.GetBody()); err != nil {
			return err
		}
		return st.pickAndRoute(true)
	default:
		return st.send(bodyResponse(true, nil))
	}
}

// onRequestTrailers: a client that sends request trailers ends its body with
// them; in FULL_DUPLEX_STREAMED that is the moment to pick.
func (st *stream) onRequestTrailers() error {
	if st.requestMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !st.picked {
		if err := st.pickAndRouteTrailers(); err != nil || st.closed {
			return err
		}
	}
	return st.send(requestTrailersResponse())
}

func (st *stream) appendBody(b []byte) error {
	if len(st.body)+len(b) > st.s.opts.MaxBodyBytes {
		return st.immediate(typev3.StatusCode_PayloadTooLarge,
			fmt.Sprintf("request body exceeds the picker's limit of %d bytes (--extproc-max-body-bytes)", st.s.opts.MaxBodyBytes))
	}
	st.body = append(st.body, b...)
	return nil
}

// pickAndRoute books the request and sends the routing decision in the shape
// the request mode needs. withBody: the body is complete (or as complete as
// the mode allows) and identifies the request.
func (st *stream) pickAndRoute(withBody bool) error {
	mut, md, err := st.pick(withBody)
	if err != nil || st.closed {
		return err
	}
	mode := st.requestMode()
	switch {
	case withBody && mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		mut.SetHeaders = append(mut.SetHeaders, setHeader("content-length", strconv.Itoa(len(st.body))))
		if err := st.sendWith(headersResponse(mut), md); err != nil {
			return err
		}
		return st.sendBodyChunks(true)
	case withBody:
		// BUFFERED: the decision rides on the body response, whose header
		// mutation Envoy still applies (the headers are held with the body).
		return st.sendWith(bodyResponse(false, mut), md)
	default:
		return st.sendWith(headersResponse(mut), md)
	}
}

// pickAndRouteTrailers is FULL_DUPLEX_STREAMED with request trailers: the
// body ends without end_of_stream, the trailers response follows.
func (st *stream) pickAndRouteTrailers() error {
	mut, md, err := st.pick(true)
	if err != nil || st.closed {
		return err
	}
	mut.SetHeaders = append(mut.SetHeaders, setHeader("content-length", strconv.Itoa(len(st.body))))
	if err := st.sendWith(headersResponse(mut), md); err != nil {
		return err
	}
	return st.sendBodyChunks(false)
}

// sendBodyChunks returns the buffered body to Envoy in ≤ BodyChunkBytes
// streamed responses; eos marks the last one end_of_stream.
func (st *stream) sendBodyChunks(eos bool) error {
	b := st.body
	for {
		n := min(len(b), BodyChunkBytes)
		last := n == len(b)
		if err := st.send(streamedBody(true, b[:n], eos && last)); err != nil {
			return err
		}
		b = b[n:]
		if last {
			return nil
		}
	}
}

// pick builds the selection request from headers and body, calls
// SelectAndReserve and returns the header mutation and dynamic metadata of
// the decision. Errors the client should see become an immediate response
// (st.closed); a returned error is a stream error.
func (st *stream) pick(withBody bool) (*extprocv3.HeaderMutation, *structpb.Struct, error) {
	defer st.s.metrics.observePick(time.Now())
	_, parse := st.startSpan(tracing.SpanParse)
	defer parse.End() // ended early on the way to the selection
	id := &st.id
	var pb parsedBody
	if withBody {
		var err error
		if pb, err = parseBody(st.body); err != nil {
			parse.SetStatus(otelcodes.Error, err.Error())
			return nil, nil, st.immediate(typev3.StatusCode_BadRequest, err.Error())
		}
	}
	req := &selection.SelectRequest{Fallbacks: st.s.opts.Fallbacks, Disaggregated: st.s.opts.Disaggregate}
	req.ModelName = firstNonEmpty(firstNonEmpty(id.model, pb.model), st.s.opts.DefaultModel)
	req.RoutingGroup = id.group
	if id.lora != "" {
		req.LoraName = &id.lora
	}
	if id.salt != "" {
		req.CacheSalt = &id.salt
	}
	// Identity precedence (README "ext_proc endpoint picker").
	switch {
	case id.hashPath:
		req.BlockHashes, req.SequenceHashes, req.ISLTokens = id.blockHashes, id.seqHashes, id.isl
	case id.tokens != nil:
		req.TokenIDs = id.tokens
	case pb.tokens != nil:
		req.TokenIDs = pb.tokens
	case pb.text != "":
		req.PromptText = pb.text
		// The body is re-sent only in FULL_DUPLEX_STREAMED (pickAndRoute).
		st.tokenize(&pb, req, st.requestMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	default:
		// Nothing identifies a prompt (a GET, an empty body): a minimal
		// text prompt books a one-token request, so the pick is still
		// load-aware and the booking is freed like any other.
		req.PromptText = firstNonEmpty(id.method+" "+id.path, "/")
	}
	req.ExpectedOutputTokens = id.expected
	if req.ExpectedOutputTokens == nil {
		req.ExpectedOutputTokens = pb.osl
	}
	if s := firstNonEmpty(id.session, pb.session); s != "" {
		req.SessionID = &s
	}
	st.sse = pb.stream
	if err := st.flowFields(req); err != nil {
		return nil, nil, st.immediate(typev3.StatusCode_BadRequest, err.Error())
	}
	req.RequestBytes = len(st.body)

	if st.s.opts.TestPickHeader && id.testPick != "" {
		// GIE conformance: the test header wins over the subset hint, as
		// in the reference picker the conformance suite was written for.
		if err := st.restrict(req, strings.Split(id.testPick, ","), HeaderTestPick); err != nil || st.closed {
			return nil, nil, err
		}
	} else if st.hasSubset {
		if err := st.restrict(req, st.subset, "subset hint"); err != nil || st.closed {
			return nil, nil, err
		}
	}

	fromRequestID := false
	switch {
	case id.selectionID != "":
		req.SelectionID = &id.selectionID
	case id.requestID != "":
		req.SelectionID, fromRequestID = &id.requestID, true
	}
	if parse.IsRecording() {
		parse.SetAttributes(attribute.String("kvselect.model", req.ModelName), attribute.Int("kvselect.body_bytes", len(st.body)),
			attribute.String("kvselect.identity", identitySource(req)))
	}
	parse.End()
	sctx, sel := st.startSpan(tracing.SpanSelect)
	defer sel.End()
	resp, err := st.s.svc.SelectAndReserve(sctx, req)
	if err != nil && fromRequestID && selection.KindOf(err) == selection.KindConflict {
		// x-request-id is not guaranteed unique (clients set it); a live
		// booking under it already exists, so this request gets its own id.
		req.SelectionID = nil
		resp, err = st.s.svc.SelectAndReserve(sctx, req)
	}
	if err != nil {
		sel.SetStatus(otelcodes.Error, err.Error())
		return nil, nil, st.immediateErr(err)
	}
	if sel.IsRecording() {
		sel.SetAttributes(tracing.SelectionAttributes(resp)...)
	}
	st.routed(resp)
	st.picked = true
	st.bk.booked(*resp.SelectionID, int(resp.BlockSize))
	st.s.metrics.routed.Add(1)
	st.primary = st.s.addrs.addr(resp.Endpoint)
	st.worker = resp.WorkerID
	st.fallbacks = resp.Fallbacks

	dest := st.destination()
	mut := &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{
			setHeader(HeaderDestination, dest),
			setHeader(HeaderWorkerID, strconv.FormatUint(resp.WorkerID, 10)),
			setHeader(HeaderDPRank, strconv.FormatUint(uint64(resp.DPRank), 10)),
			setHeader(HeaderDynamoWorker, strconv.FormatUint(resp.WorkerID, 10)),
			setHeader(HeaderDynamoDPRank, strconv.FormatUint(uint64(resp.DPRank), 10)),
			setHeader(HeaderEngineDPRank, strconv.FormatUint(uint64(resp.DPRank), 10)),
			setHeader(HeaderSelectionID, st.bk.id),
		},
		// Control headers never reach the worker (GIE strips the same).
		RemoveHeaders: []string{KeySubset, KeyServed, HeaderObjective, HeaderFairnessID, HeaderPriority},
	}
	st.prefillHeaders(mut, resp)
	mut.SetHeaders = st.propagate(mut.SetHeaders)
	if id.requestID == "" {
		mut.SetHeaders = append(mut.SetHeaders, setHeader(HeaderRequestID, st.bk.id))
	}
	if st.s.opts.TestPickHeader {
		mut.SetHeaders = append(mut.SetHeaders, setHeader(HeaderEchoSetHeader, HeaderTestServed+":"+st.primary))
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
	st.s.log.Debug("extproc: routed", "selection_id", st.bk.id, "model", resp.ModelName, "worker_id", resp.WorkerID,
		"dp_rank", resp.DPRank, "destination", dest)
	return mut, md, nil
}

// identitySource names what identified the prompt, for the parse span.
func identitySource(req *selection.SelectRequest) string {
	switch {
	case req.BlockHashes != nil || req.SequenceHashes != nil:
		return "hash_headers"
	case req.TokenIDs != nil:
		return "token_ids"
	default:
		return "text"
	}
}

// prefillHeaders names a remote prefill's worker to the decode worker; the
// same headers sent by the client are removed otherwise, since they tell the
// decode pod's sidecar where to send the prompt.
func (st *stream) prefillHeaders(mut *extprocv3.HeaderMutation, resp *selection.SelectResponse) {
	name := cmp.Or(st.s.opts.PrefillHeader, HeaderPrefiller)
	if pf := resp.Prefill.Selection; pf != nil {
		addr := st.s.addrs.addr(pf.Endpoint)
		mut.SetHeaders = append(mut.SetHeaders, setHeader(name, addr), setHeader(HeaderPrefillEndpoint, addr))
		st.s.log.Debug("extproc: remote prefill", "selection_id", st.bk.id, "prefill_worker_id", pf.WorkerID, "prefill", addr)
		return
	}
	mut.RemoveHeaders = append(mut.RemoveHeaders, name, HeaderPrefillEndpoint)
}

// restrict limits the candidates to the workers whose endpoint matches one
// of entries (ip or ip:port); none matching is protocol 004's 503.
func (st *stream) restrict(req *selection.SelectRequest, entries []string, what string) error {
	ts := parseTargets(entries)
	var allowed []uint64
	if len(ts) > 0 {
		allowed = st.s.addrs.allowedWorkers(st.s.svc.Inspect().Endpoints(req.PartitionKey), ts)
	}
	if len(allowed) == 0 {
		return st.immediate(typev3.StatusCode_ServiceUnavailable,
			fmt.Sprintf("no schedulable worker matches the %s %q", what, strings.Join(entries, ",")))
	}
	req.AllowedWorkerIDs = allowed
	return nil
}

// destination is the primary endpoint followed by the distinct fallback
// endpoints (ranks of one worker share its endpoint).
func (st *stream) destination() string {
	if len(st.fallbacks) == 0 {
		return st.primary
	}
	var sb strings.Builder
	sb.WriteString(st.primary)
	seen := []string{st.primary}
	for _, f := range st.fallbacks {
		a := st.s.addrs.addr(f.Endpoint)
		if containsString(seen, a) {
			continue
		}
		seen = append(seen, a)
		sb.WriteByte(',')
		sb.WriteString(a)
	}
	return sb.String()
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func containsString(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
