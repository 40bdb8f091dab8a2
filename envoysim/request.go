package envoysim

import (
	"errors"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// request runs the request half in the request's body mode.
func (x *Exchange) request(req *Request) (*Decision, error) {
	method, path, auth := req.Method, req.Path, req.Authority
	if method == "" {
		method = "POST"
		if req.Body == nil {
			method = "GET"
		}
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	if auth == "" {
		auth = "gateway"
	}
	hs := append([]Header{{":method", method}, {":path", path}, {":authority", auth}, {":scheme", "http"}}, req.Headers...)
	if req.Body != nil && !hasHeader(req.Headers, "content-length") {
		hs = append(hs, Header{"content-length", strconv.Itoa(len(req.Body))})
	}
	md := subsetMetadata(req)
	noBody := req.Body == nil && len(req.Trailers) == 0
	d := &Decision{SetHeaders: map[string]string{}}

	err := x.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs), EndOfStream: noBody}},
		MetadataContext: md,
	})
	if err != nil {
		return nil, err
	}
	if noBody {
		return d, x.expectHeaders(d)
	}
	chunk := req.ChunkSize
	if chunk <= 0 {
		chunk = DefaultChunkSize
	}
	switch x.modes.Request {
	case FullDuplexStreamed:
		return d, x.fullDuplexRequest(req, md, chunk, d)
	case Buffered, BufferedPartial:
		if err := x.expectHeaders(d); err != nil || d.Immediate != nil {
			return d, err
		}
		if err := x.sendBody(req.Body, len(req.Trailers) == 0, md); err != nil {
			return d, err
		}
		if err := x.expectBody(d, req.Body); err != nil || d.Immediate != nil {
			return d, err
		}
		return d, x.requestTrailers(req, md, d)
	case Streamed:
		if err := x.expectHeaders(d); err != nil || d.Immediate != nil {
			return d, err
		}
		forwarded := make([]byte, 0, len(req.Body))
		for off := 0; off < len(req.Body) || off == 0; off += chunk {
			end := min(off+chunk, len(req.Body))
			last := end == len(req.Body)
			if err := x.sendBody(req.Body[off:end], last && len(req.Trailers) == 0, md); err != nil {
				return d, err
			}
			part := &Decision{SetHeaders: d.SetHeaders}
			if err := x.expectBody(part, req.Body[off:end]); err != nil || part.Immediate != nil {
				d.Immediate = part.Immediate
				return d, err
			}
			forwarded = append(forwarded, part.Body...)
			if last {
				break
			}
		}
		d.Body = forwarded
		return d, x.requestTrailers(req, md, d)
	default: // NONE: the body bypasses the processor
		if err := x.expectHeaders(d); err != nil || d.Immediate != nil {
			return d, err
		}
		d.Body = req.Body
		return d, x.requestTrailers(req, md, d)
	}
}

// fullDuplexRequest sends headers, every body chunk and the trailers without
// waiting (Envoy streams them as they arrive), then reads the processor's
// answer: the headers response first, then streamed body chunks up to
// end_of_stream (or the trailers response when there are trailers).
func (x *Exchange) fullDuplexRequest(req *Request, md *corev3.Metadata, chunk int, d *Decision) error {
	// The processor may answer (an immediate response) and end the stream
	// while the body is still being sent: grpc-go's Send then reports io.EOF
	// and the answer waits in the receive queue. Envoy stops forwarding the
	// request in that case; so does the client, and reads the answer.
	peerEnded := false
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(req.Body))
		last := end == len(req.Body)
		if err := x.sendBody(req.Body[off:end], last && len(req.Trailers) == 0, md); err != nil {
			if !errors.Is(err, io.EOF) {
				return err
			}
			peerEnded = true
			break
		}
		if last {
			break
		}
	}
	if len(req.Trailers) > 0 && !peerEnded {
		if err := x.sendTrailers(req.Trailers, md); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	if err := x.expectHeaders(d); err != nil || d.Immediate != nil {
		return err
	}
	d.Body = []byte{}
	for {
		r, err := x.answer(d)
		if err != nil || r == nil {
			return err
		}
		switch v := r.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestBody:
			c := v.RequestBody.GetResponse()
			sr := c.GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return protoErr("FULL_DUPLEX_STREAMED request body response without a streamed_response")
			}
			applyMutation(d, c)
			applyMetadata(d, r)
			d.Body = append(d.Body, sr.GetBody()...)
			d.BodyMessages++
			if sr.GetEndOfStream() {
				return nil
			}
		case *extprocv3.ProcessingResponse_RequestTrailers:
			if len(req.Trailers) == 0 {
				return protoErr("request trailers response without request trailers")
			}
			applyMetadata(d, r)
			return nil
		default:
			return protoErr("unexpected %T while streaming the request body back", v)
		}
	}
}

func (x *Exchange) sendBody(b []byte, eos bool, md *corev3.Metadata) error {
	return x.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}},
		MetadataContext: md,
	})
}

func (x *Exchange) sendTrailers(trailers []Header, md *corev3.Metadata) error {
	return x.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: headerMap(trailers)}},
		MetadataContext: md,
	})
}

func (x *Exchange) requestTrailers(req *Request, md *corev3.Metadata, d *Decision) error {
	if len(req.Trailers) == 0 {
		return nil
	}
	if err := x.sendTrailers(req.Trailers, md); err != nil {
		return err
	}
	r, err := x.answer(d)
	if err != nil || r == nil {
		return err
	}
	if _, ok := r.GetResponse().(*extprocv3.ProcessingResponse_RequestTrailers); ok {
		applyMetadata(d, r)
		return nil
	}
	return protoErr("expected a request trailers response, got %T", r.GetResponse())
}

// answer reads the processor's next response; an immediate response ends the
// exchange: it goes to d and answer returns nil.
func (x *Exchange) answer(d *Decision) (*extprocv3.ProcessingResponse, error) {
	r, err := x.next()
	if err != nil {
		return nil, err
	}
	if v, ok := r.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		applyMetadata(d, r)
		d.Immediate = immediateOf(v.ImmediateResponse)
		return nil, nil
	}
	return r, nil
}

// expectHeaders reads the request headers response (or an immediate one).
func (x *Exchange) expectHeaders(d *Decision) error {
	r, err := x.answer(d)
	if err != nil || r == nil {
		return err
	}
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		c := v.RequestHeaders.GetResponse()
		if c.GetBodyMutation() != nil {
			return protoErr("request headers response carries a body mutation")
		}
		applyMutation(d, c)
		applyMetadata(d, r)
		return nil
	}
	return protoErr("expected a request headers response, got %T", r.GetResponse())
}

// expectBody reads a non-streamed request body response; sent is the body
// that was sent (forwarded unless the processor replaced it).
func (x *Exchange) expectBody(d *Decision, sent []byte) error {
	r, err := x.answer(d)
	if err != nil || r == nil {
		return err
	}
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestBody:
		c := v.RequestBody.GetResponse()
		if c.GetBodyMutation().GetStreamedResponse() != nil {
			return protoErr("streamed_response outside FULL_DUPLEX_STREAMED")
		}
		applyMutation(d, c)
		applyMetadata(d, r)
		d.Body = sent
		switch m := c.GetBodyMutation().GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			d.Body = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			d.Body = nil
		}
		return nil
	}
	return protoErr("expected a request body response, got %T", r.GetResponse())
}

// refusedSet tells a header Envoy's default header mutation rules
// (config.common.mutation_rules.v3.HeaderMutationRules with no field set, the
// ext_proc filter's default) do not let a processor set: the ones that steer
// routing and later filters (host, :authority, :scheme, :method) and Envoy's
// own x-envoy-* headers. Envoy ignores such a mutation and counts it in
// rejected_header_mutations; with disallow_is_error it fails the request
// with a 500. Removals are refused for every ":" header and host as well.
func refusedSet(k string) bool {
	switch k {
	case "host", ":authority", ":scheme", ":method":
		return true
	}
	return strings.HasPrefix(k, "x-envoy-")
}

// applyMutation folds a CommonResponse's header mutation into d; mutations
// Envoy's default rules refuse go to d.RejectedHeaders instead.
func applyMutation(d *Decision, c *extprocv3.CommonResponse) {
	if c == nil {
		return
	}
	if c.GetClearRouteCache() {
		d.ClearRouteCache = true
	}
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		v := string(h.GetHeader().GetRawValue())
		if v == "" {
			v = h.GetHeader().GetValue()
		}
		k := strings.ToLower(h.GetHeader().GetKey())
		if refusedSet(k) {
			d.RejectedHeaders = append(d.RejectedHeaders, k)
			continue
		}
		d.SetHeaders[k] = v
	}
	for _, k := range c.GetHeaderMutation().GetRemoveHeaders() {
		k = strings.ToLower(k)
		if refusedSet(k) || strings.HasPrefix(k, ":") {
			d.RejectedHeaders = append(d.RejectedHeaders, k)
			continue
		}
		d.RemovedHeaders = append(d.RemovedHeaders, k)
	}
	if dest, ok := d.SetHeaders[KeyDestination]; ok {
		d.Destination = dest
		parts := strings.Split(dest, ",")
		d.Endpoint = strings.TrimSpace(parts[0])
		d.Fallbacks = d.Fallbacks[:0]
		for _, p := range parts[1:] {
			d.Fallbacks = append(d.Fallbacks, strings.TrimSpace(p))
		}
	}
}

// applyMetadata folds a response's envoy.lb dynamic metadata into d. Envoy
// applies dynamic_metadata from every response the processor sends, not only
// the headers response, and merges a namespace's fields into what earlier
// responses set.
func applyMetadata(d *Decision, r *extprocv3.ProcessingResponse) {
	lb := r.GetDynamicMetadata().GetFields()[MetadataLB].GetStructValue()
	if lb == nil {
		return
	}
	if d.LBMetadata == nil {
		d.LBMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for k, v := range lb.GetFields() {
		d.LBMetadata.Fields[k] = v
	}
	if v := lb.GetFields()[KeyDestination]; v != nil {
		d.MetadataDestination = v.GetStringValue()
	}
	if v := lb.GetFields()[KeyScores].GetStructValue(); v != nil {
		d.EndpointScores = make(map[string]float64, len(v.GetFields()))
		for ep, s := range v.GetFields() {
			d.EndpointScores[ep] = s.GetNumberValue()
		}
	}
}

func immediateOf(ir *extprocv3.ImmediateResponse) *Immediate {
	im := &Immediate{Status: int(ir.GetStatus().GetCode()), Body: ir.GetBody(), Details: ir.GetDetails(), Headers: map[string]string{}}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		v := string(h.GetHeader().GetRawValue())
		if v == "" {
			v = h.GetHeader().GetValue()
		}
		im.Headers[strings.ToLower(h.GetHeader().GetKey())] = v
	}
	return im
}

func hasHeader(hs []Header, k string) bool {
	for _, h := range hs {
		if strings.EqualFold(h.Key, k) {
			return true
		}
	}
	return false
}
