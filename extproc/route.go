package extproc

import (
	"cmp"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvselect/kvselect/selection"
)

// pickAndRoute books the request and sends the routing decision in the shape
// the request mode needs. withBody: the body is complete (or as complete as
// the mode allows) and identifies the request.
func (st *stream) pickAndRoute(withBody bool) error {
	defer st.releaseBody()
	mut, md, err := st.pick(withBody)
	if err != nil {
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
		return st.sendWith(st.bufferedBody(bodyResponse(false, mut), mut), md)
	default:
		return st.sendWith(headersResponse(mut), md)
	}
}

// pickAndRouteTrailers is FULL_DUPLEX_STREAMED with request trailers: the
// body ends without end_of_stream, the trailers response follows.
func (st *stream) pickAndRouteTrailers() error {
	defer st.releaseBody()
	mut, md, err := st.pick(true)
	if err != nil {
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

// routing is the decision as Envoy applies it: the header mutation of the
// request to the worker (the destination, the chosen rank under each name
// engines and Dynamo read, the booking's id, a remote prefill's worker, the
// trace context) and the envoy.lb metadata naming the destination.
func (st *stream) routing(resp *selection.SelectResponse) (*extprocv3.HeaderMutation, *structpb.Struct) {
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
		RemoveHeaders: []string{KeySubset, KeyServed, HeaderObjective, HeaderFairnessID, HeaderPriority,
			HeaderObjectiveLegacy, HeaderFairnessIDLegacy,
			HeaderSLOTTFT, HeaderSLOTPOT, HeaderSLOTTFTLegacy, HeaderSLOTPOTLegacy, HeaderModelRewrite, HeaderModelRewriteLegacy},
	}
	st.prefillHeaders(mut, resp)
	mut.SetHeaders = st.propagate(mut.SetHeaders)
	if st.id.requestID == "" {
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
	return mut, md
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

func containsString(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
