package extproc

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	json "github.com/goccy/go-json"
)

// headersResponse answers the request headers; a mutation carries the
// routing decision and asks Envoy to recompute the route.
func headersResponse(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: mut != nil}}}}
}

// responseHeadersResponse answers the response headers; mut is nil but with
// the conformance hooks on.
func responseHeadersResponse(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut}}}}
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

// requestTrailersResponse and responseTrailersResponse pass trailers on
// unchanged.
func requestTrailersResponse() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}}
}

func responseTrailersResponse() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}}
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

// streamedBody is a FULL_DUPLEX_STREAMED body chunk for Envoy to forward: a
// request (request=true) or response body, eos on the last one.
func streamedBody(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	return new(streamedMsg).set(request, b, eos)
}

// set makes m the streamed body chunk b (streamedBody) and returns it. A
// stream reuses one for its response chunks: grpc encodes a message before
// Send returns, so it is free again for the next chunk.
func (m *streamedMsg) set(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	*m = streamedMsg{}
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

// immediateResponse is a local reply that ends the exchange: {"error": msg}
// as JSON, the REST front's envelope, and a details string naming the status
// for Envoy's access log.
func immediateResponse(code typev3.StatusCode, msg string) *extprocv3.ProcessingResponse {
	body, err := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	if err != nil {
		body = []byte(`{"error":"internal error"}`)
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}},
			Body:    body,
			Details: "kvselect_" + strings.ReplaceAll(strings.ToLower(code.String()), " ", "_"),
		}}}
}

// setHeader sets k to v, replacing any value the request already has.
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
