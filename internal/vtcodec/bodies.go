package vtcodec

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Field numbers of the body-chunk messages (envoy/service/ext_proc/v3/
// external_processor.proto).
const (
	reqRequestBody   = 4 // ProcessingRequest.request_body (HttpBody)
	reqResponseBody  = 5 // ProcessingRequest.response_body (HttpBody)
	respRequestBody  = 3 // ProcessingResponse.request_body (BodyResponse)
	respResponseBody = 4 // ProcessingResponse.response_body (BodyResponse)

	httpBodyBody = 1 // HttpBody.body
	httpBodyEOS  = 2 // HttpBody.end_of_stream

	bodyResponseResponse = 1 // BodyResponse.response (CommonResponse)
	commonBodyMutation   = 3 // CommonResponse.body_mutation (BodyMutation)
	mutationStreamed     = 3 // BodyMutation.streamed_response (StreamedBodyResponse)
	streamedBody         = 1 // StreamedBodyResponse.body
	streamedEOS          = 2 // StreamedBodyResponse.end_of_stream
	streamedEOSNoMessage = 3 // StreamedBodyResponse.end_of_stream_without_message
)

// Most messages of a streamed request are body chunks: Envoy's
// ProcessingRequest{response_body: HttpBody{body, end_of_stream}} and, in
// FULL_DUPLEX_STREAMED, the processor's ProcessingResponse{response_body:
// BodyResponse{response: CommonResponse{body_mutation: BodyMutation{
// streamed_response: StreamedBodyResponse{...}}}}}. protobuf-go decodes them
// through reflection with an allocation per level; the two functions below
// read exactly these shapes with protowire and build each message in one
// allocation. Anything else — another field, an unknown one, a repeated
// top-level field — makes them return false and protobuf-go decodes the
// message. FuzzBodyDecoders holds them to protobuf-go's result.

// bodyFields reads a message made only of a bytes field (last wins, as in
// protobuf) and up to two bool fields.
func bodyFields(b []byte, bytesNum, bool1, bool2 protowire.Number) (body []byte, v1, v2, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, false, false
		}
		b = b[n:]
		switch {
		case num == bytesNum && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, false, false, false
			}
			body, b = v, b[n:]
		case (num == bool1 || num == bool2) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false, false, false
			}
			if num == bool1 {
				v1 = v != 0
			} else {
				v2 = v != 0
			}
			b = b[n:]
		default:
			return nil, false, false, false
		}
	}
	return body, v1, v2, true
}

// only reads a message made of exactly one embedded-message field want and
// returns its bytes.
func only(b []byte, want ...protowire.Number) (num protowire.Number, inner []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || typ != protowire.BytesType {
		return 0, nil, false
	}
	inner, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		return 0, nil, false
	}
	for _, w := range want {
		if num == w {
			return num, inner, true
		}
	}
	return 0, nil, false
}

// bodyRequest is a body-chunk ProcessingRequest in one allocation.
type bodyRequest struct {
	req  extprocv3.ProcessingRequest_RequestBody
	resp extprocv3.ProcessingRequest_ResponseBody
	body extprocv3.HttpBody
}

// decodeBodyRequest decodes a body-chunk ProcessingRequest into m. A body
// chunk m already holds lends its array to the new one: a processor decodes
// a stream's messages into one value over and over (extproc's Process loop),
// and reading a 1M-token prompt's 350 chunks of 16 KiB then allocates one
// array, not 350. Nothing may keep a decoded body past the next decode into
// the same message.
func decodeBodyRequest(b []byte, m *extprocv3.ProcessingRequest) bool {
	num, inner, ok := only(b, reqRequestBody, reqResponseBody)
	if !ok {
		return false
	}
	body, eos, _, ok := bodyFields(inner, httpBodyBody, httpBodyEOS, 0)
	if !ok {
		return false
	}
	var spare []byte
	switch r := m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		spare = r.RequestBody.GetBody()
	case *extprocv3.ProcessingRequest_ResponseBody:
		spare = r.ResponseBody.GetBody()
	}
	if spare == nil {
		spare = []byte{} // a present body field decodes non-nil, as protobuf-go's does
	}
	w := &bodyRequest{}
	w.body.Body, w.body.EndOfStream = append(spare[:0], body...), eos
	proto.Reset(m)
	if num == reqRequestBody {
		w.req.RequestBody = &w.body
		m.Request = &w.req
	} else {
		w.resp.ResponseBody = &w.body
		m.Request = &w.resp
	}
	return true
}

// bodyResponse is a streamed body ProcessingResponse in one allocation.
type bodyResponse struct {
	req      extprocv3.ProcessingResponse_RequestBody
	resp     extprocv3.ProcessingResponse_ResponseBody
	body     extprocv3.BodyResponse
	common   extprocv3.CommonResponse
	mutation extprocv3.BodyMutation
	oneof    extprocv3.BodyMutation_StreamedResponse
	streamed extprocv3.StreamedBodyResponse
}

// decodeBodyResponse decodes a FULL_DUPLEX_STREAMED body ProcessingResponse
// into m.
func decodeBodyResponse(b []byte, m *extprocv3.ProcessingResponse) bool {
	num, b, ok := only(b, respRequestBody, respResponseBody)
	if !ok {
		return false
	}
	for _, level := range []protowire.Number{bodyResponseResponse, commonBodyMutation, mutationStreamed} {
		if _, b, ok = only(b, level); !ok {
			return false
		}
	}
	body, eos, eosNoMessage, ok := bodyFields(b, streamedBody, streamedEOS, streamedEOSNoMessage)
	if !ok {
		return false
	}
	w := &bodyResponse{}
	w.streamed.Body, w.streamed.EndOfStream, w.streamed.EndOfStreamWithoutMessage = append([]byte{}, body...), eos, eosNoMessage
	w.oneof.StreamedResponse = &w.streamed
	w.mutation.Mutation = &w.oneof
	w.common.BodyMutation = &w.mutation
	w.body.Response = &w.common
	proto.Reset(m)
	if num == respRequestBody {
		w.req.RequestBody = &w.body
		m.Response = &w.req
	} else {
		w.resp.ResponseBody = &w.body
		m.Response = &w.resp
	}
	return true
}
