package extproc

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	json "github.com/goccy/go-json"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/selection"
)

// freeTimeout bounds the deferred free; it runs on a context detached from
// the (usually cancelled) stream context.
const freeTimeout = 5 * time.Second

// stream is one HTTP request's state, owned by its stream goroutine.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	// Processing modes from the first message's protocol_config; without
	// it (Envoy before protocol_config existed) Options.AssumedModes, by
	// default FULL_DUPLEX_STREAMED, the GIE reference configuration.
	modesKnown bool
	modes      BodyModes

	id        identity
	subset    []string
	hasSubset bool
	body      []byte
	headersIn bool // request headers seen (once per stream)
	picked    bool // routing decision sent

	// The booking.
	selID     string
	booked    bool // a live booking to free
	primary   string
	fallbacks []selection.RankEndpoint
	partKey   selection.PartitionKey

	// Response progress.
	sse         bool
	prefillDone bool
	counter     tokenCounter

	closed bool // an immediate response ended the exchange
}

func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	if pc := req.GetProtocolConfig(); pc != nil && !st.modesKnown {
		st.modesKnown, st.modes = true, BodyModes{Request: pc.GetRequestBodyMode(), Response: pc.GetResponseBodyMode()}
	}
	if !st.picked {
		if e, ok := subsetHint(req.GetMetadataContext()); ok {
			st.subset, st.hasSubset = e, true
		}
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.onResponseHeaders(r.ResponseHeaders, req.GetMetadataContext())
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.complete()
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

// bodyModes are the modes in effect: announced, else assumed.
func (st *stream) bodyModes() BodyModes {
	switch {
	case st.modesKnown:
		return st.modes
	case st.s.opts.AssumedModes != nil:
		return *st.s.opts.AssumedModes
	}
	return BodyModes{Request: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, Response: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
}

func (st *stream) requestMode() filterv3.ProcessingMode_BodySendMode  { return st.bodyModes().Request }
func (st *stream) responseMode() filterv3.ProcessingMode_BodySendMode { return st.bodyModes().Response }

// onRequestHeaders decides, per mode, whether the pick waits for the body:
// FULL_DUPLEX_STREAMED defers the headers response until the body's end (the
// only mode where Envoy lets the processor read the body first); BUFFERED
// must answer the headers at once (Envoy holds the body until then, spec §2.3)
// and picks on the body message; STREAMED and NONE route before any body
// reaches the processor, so they pick from the headers alone, as do
// requests without a body.
func (st *stream) onRequestHeaders(h *extprocv3.HttpHeaders) error {
	if st.headersIn {
		// One stream is one request: a second request would book twice.
		return status.Error(codes.InvalidArgument, "ext_proc: request headers received twice on one stream")
	}
	st.headersIn = true
	if err := readHeaders(h.GetHeaders(), &st.id); err != nil {
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
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}})
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
	id := &st.id
	var pb parsedBody
	if withBody {
		var err error
		if pb, err = parseBody(st.body); err != nil {
			return nil, nil, st.immediate(typev3.StatusCode_BadRequest, err.Error())
		}
	}
	req := &selection.SelectRequest{Fallbacks: st.s.opts.Fallbacks}
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
	st.partKey = req.PartitionKey

	if st.s.opts.TestPickHeader && id.testPick != "" {
		// GIE conformance: the header wins over the subset hint (spec §4.3).
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
	resp, err := st.s.svc.SelectAndReserve(st.ctx, req)
	if err != nil && fromRequestID && selection.KindOf(err) == selection.KindConflict {
		// x-request-id is not guaranteed unique (clients set it); a live
		// booking under it already exists, so this request gets its own id.
		req.SelectionID = nil
		resp, err = st.s.svc.SelectAndReserve(st.ctx, req)
	}
	if err != nil {
		return nil, nil, st.immediateErr(err)
	}
	st.picked, st.booked = true, true
	st.s.metrics.routed.Add(1)
	st.selID = *resp.SelectionID
	st.primary = st.s.addrs.addr(resp.Endpoint)
	st.fallbacks = resp.Fallbacks
	st.partKey = selection.PartitionKey{ModelName: resp.ModelName, RoutingGroup: resp.RoutingGroup}

	dest := st.destination()
	mut := &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{
			setHeader(HeaderDestination, dest),
			setHeader(HeaderWorkerID, strconv.FormatUint(resp.WorkerID, 10)),
			setHeader(HeaderDPRank, strconv.FormatUint(uint64(resp.DPRank), 10)),
			setHeader(HeaderDynamoWorker, strconv.FormatUint(resp.WorkerID, 10)),
			setHeader(HeaderDynamoDPRank, strconv.FormatUint(uint64(resp.DPRank), 10)),
			setHeader(HeaderEngineDPRank, strconv.FormatUint(uint64(resp.DPRank), 10)),
			setHeader(HeaderSelectionID, st.selID),
		},
		// Control headers never reach the worker (GIE strips the same).
		RemoveHeaders: []string{KeySubset, KeyServed},
	}
	if id.requestID == "" {
		mut.SetHeaders = append(mut.SetHeaders, setHeader(HeaderRequestID, st.selID))
	}
	if st.s.opts.TestPickHeader {
		mut.SetHeaders = append(mut.SetHeaders, setHeader(HeaderEchoSetHeader, HeaderTestServed+":"+st.primary))
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
	st.s.log.Debug("extproc: routed", "selection_id", st.selID, "model", resp.ModelName, "worker_id", resp.WorkerID,
		"dp_rank", resp.DPRank, "destination", dest)
	return mut, md, nil
}

// restrict limits the candidates to the workers whose endpoint matches one
// of entries (ip or ip:port); none matching is protocol 004's 503.
func (st *stream) restrict(req *selection.SelectRequest, entries []string, what string) error {
	ts := parseTargets(entries)
	var allowed []uint64
	if len(ts) > 0 {
		allowed = st.s.addrs.allowedWorkers(st.s.svc.Endpoints(req.PartitionKey), ts)
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

// onResponseHeaders attributes the booking to the endpoint that served the
// response (protocol 004 v1.0 served metadata) and notes whether the
// response streams.
func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders, md *corev3.Metadata) error {
	served := servedEndpoint(md)
	if served != "" && st.booked && served != st.primary {
		st.rebook(served)
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == "content-type" && strings.HasPrefix(strings.ToLower(headerValue(hv)), "text/event-stream") {
			st.sse = true
		}
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
		st.complete()
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut}}}})
}

// rebook attributes the booking to the rank behind the served endpoint; the
// core chooses it (the fallbacks sent first) and refuses an address that
// names no single rank, in which case the booking stays.
func (st *stream) rebook(served string) {
	preferred := make([]selection.WorkerRank, len(st.fallbacks))
	for i, f := range st.fallbacks {
		preferred[i] = selection.WorkerRank{WorkerID: f.WorkerID, DPRank: f.DPRank}
	}
	if _, err := st.s.svc.RebookServed(st.ctx, st.selID, served, preferred); err != nil {
		st.s.log.Debug("extproc: served endpoint not attributed; booking stays", "selection_id", st.selID, "served", served, "err", err)
		return
	}
	st.primary = served
	st.s.metrics.rebooked.Add(1)
}

// onResponseBody: the first chunk means the prefill is done (TTFT); streamed
// output grows the booking by one output block per block_size tokens; the
// end of the body frees it.
func (st *stream) onResponseBody(b *extprocv3.HttpBody) error {
	body, eos := b.GetBody(), b.GetEndOfStream()
	if st.booked && !st.prefillDone && (len(body) > 0 || eos) {
		st.prefillDone = true
		if err := st.s.svc.PrefillComplete(st.ctx, st.selID); err != nil {
			st.lost(err)
		}
	}
	if st.booked && st.sse && len(body) > 0 {
		st.counter.feed(body)
		st.outputBlocks()
	}
	if eos {
		// Freed before the last chunk goes back, so a gateway that has seen
		// the response end never sees its booking.
		st.complete()
	}
	if st.responseMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Echo at once: SSE is never buffered.
		return st.send(streamedBody(false, body, eos))
	}
	return st.send(bodyResponse(false, nil))
}

// outputBlocks tells the core how many output tokens have streamed; it adds
// the output blocks they complete.
func (st *stream) outputBlocks() {
	n, err := st.s.svc.OutputTokens(st.ctx, st.selID, st.counter.tokens())
	if err != nil {
		st.lost(err)
		return
	}
	st.s.metrics.outputBlocks.Add(uint64(n))
}

// lost handles a booking that vanished under the stream (expired, its
// worker removed): nothing is left to update or free.
func (st *stream) lost(err error) {
	if selection.KindOf(err) == selection.KindNotFound {
		st.booked = false
		st.s.metrics.lost.Add(1)
		return
	}
	st.s.log.Warn("extproc: booking update failed", "selection_id", st.selID, "err", err)
}

// complete frees the booking at the response's end.
func (st *stream) complete() {
	if !st.booked {
		return
	}
	st.booked = false
	st.freed(st.s.svc.Free(context.WithoutCancel(st.ctx), st.selID), &st.s.metrics.freedAtEnd)
}

// cleanup runs when the stream ends, however it ends: a booking whose
// response never completed is freed here, on a context detached from the
// stream's (which is cancelled by then).
func (st *stream) cleanup() {
	if !st.booked {
		return
	}
	st.booked = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), freeTimeout)
	defer cancel()
	st.freed(st.s.svc.Free(ctx, st.selID), &st.s.metrics.freedAtStreamEnd)
}

// freed accounts for the result of a Free: counted under at, lost when the
// booking was already gone, logged when it failed otherwise.
func (st *stream) freed(err error, at *atomic.Uint64) {
	switch {
	case err == nil:
		at.Add(1)
	case selection.KindOf(err) == selection.KindNotFound:
		st.s.metrics.lost.Add(1)
	default:
		st.s.log.Warn("extproc: free failed", "selection_id", st.selID, "err", err)
	}
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error { return st.srv.Send(r) }

func (st *stream) sendWith(r *extprocv3.ProcessingResponse, md *structpb.Struct) error {
	r.DynamicMetadata = md
	return st.srv.Send(r)
}

// immediateErr answers a selection error with its mapped status.
func (st *stream) immediateErr(err error) error {
	code := statusOf(err)
	if code >= 500 && selection.KindOf(err) == selection.KindInternal {
		st.s.log.Warn("extproc: selection failed", "err", err)
	}
	return st.immediate(code, err.Error())
}

// immediate ends the exchange with a local reply: {"error": msg} as JSON,
// the REST front's envelope.
func (st *stream) immediate(code typev3.StatusCode, msg string) error {
	st.closed = true
	st.s.metrics.immediateResponse(code)
	body, err := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	if err != nil {
		body = []byte(`{"error":"internal error"}`)
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}},
			Body:    body,
			Details: "kvselect_" + strings.ReplaceAll(strings.ToLower(code.String()), " ", "_"),
		}}})
}

// headersResponse answers the request headers; a mutation carries the
// routing decision and asks Envoy to recompute the route.
func headersResponse(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: mut != nil}}}}
}

// bodyResponse is a request (request=true) or response body reply; a
// mutation makes it the BUFFERED-mode routing decision.
func bodyResponse(request bool, mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	c := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: mut != nil}
	if request || mut != nil {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: c}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: c}}}
}

// streamedMsg holds every level of a streamed body response, so one
// allocation builds the message (it is sent once per response chunk).
type streamedMsg struct {
	resp extprocv3.ProcessingResponse
	req  extprocv3.ProcessingResponse_RequestBody
	res  extprocv3.ProcessingResponse_ResponseBody
	body extprocv3.BodyResponse
	cr   extprocv3.CommonResponse
	mut  extprocv3.BodyMutation
	sr   extprocv3.BodyMutation_StreamedResponse
	sbr  extprocv3.StreamedBodyResponse
}

func streamedBody(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	m := &streamedMsg{}
	m.sbr.Body, m.sbr.EndOfStream = b, eos
	m.sr.StreamedResponse = &m.sbr
	m.mut.Mutation = &m.sr
	m.cr.BodyMutation = &m.mut
	m.body.Response = &m.cr
	if request {
		m.req.RequestBody = &m.body
		m.resp.Response = &m.req
	} else {
		m.res.ResponseBody = &m.body
		m.resp.Response = &m.res
	}
	return &m.resp
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
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
