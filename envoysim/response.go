package envoysim

import (
	"errors"
	"io"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Response is the worker's response head as the gateway reports it.
type Response struct {
	Status  int // default 200
	Headers []Header
	// Served is the endpoint that served the request, reported as protocol
	// 004's envoy.lb / x-gateway-destination-endpoint-served metadata; empty
	// sends no served key (NoLBMetadata drops the envoy.lb namespace too).
	Served       string
	NoLBMetadata bool
}

// HeadersResult is the processor's answer to the response headers.
type HeadersResult struct {
	SetHeaders     map[string]string
	RemovedHeaders []string
	// RejectedHeaders: as Decision.RejectedHeaders.
	RejectedHeaders []string
	Immediate       *Immediate
	// ProcessorClosed is set when the processor had ended the stream with
	// an OK status instead of answering: Envoy then stops calling it and
	// the rest of the response passes through untouched (a processor may
	// answer any message by closing the stream; llm-d's endpoint picker
	// does so after routing requests whose parser skips the response).
	ProcessorClosed bool
}

// ResponseHeaders sends the response headers (endOfStream: the response has
// no body) and returns the processor's headers response. It waits for that
// response in every mode: GIE's picker and kvselect answer response headers
// at once.
func (x *Exchange) ResponseHeaders(resp Response, endOfStream bool) (*HeadersResult, error) {
	if x.processorDone {
		return &HeadersResult{SetHeaders: map[string]string{}, ProcessorClosed: true}, nil
	}
	st := resp.Status
	if st == 0 {
		st = 200
	}
	hs := append([]Header{{":status", strconv.Itoa(st)}}, resp.Headers...)
	var md *corev3.Metadata
	if !resp.NoLBMetadata {
		f := map[string]*structpb.Value{}
		if resp.Served != "" {
			f[KeyServed] = structpb.NewStringValue(resp.Served)
		}
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataLB: {Fields: f}}}
	}
	err := x.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs), EndOfStream: endOfStream}},
		MetadataContext: md,
	})
	var r *extprocv3.ProcessingResponse
	if err == nil {
		r, err = x.next()
	}
	if err != nil {
		if x.endedOK(err) {
			return &HeadersResult{SetHeaders: map[string]string{}, ProcessorClosed: true}, nil
		}
		return nil, err
	}
	out := &HeadersResult{SetHeaders: map[string]string{}}
	switch v := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		out.Immediate = immediateOf(v.ImmediateResponse)
		return out, nil
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		d := &Decision{SetHeaders: out.SetHeaders}
		applyMutation(d, v.ResponseHeaders.GetResponse())
		out.RemovedHeaders, out.RejectedHeaders = d.RemovedHeaders, d.RejectedHeaders
		return out, nil
	}
	return nil, protoErr("expected a response headers response, got %T", r.GetResponse())
}

// ResponseBody sends one response body chunk and returns what Envoy
// forwards downstream as a result. FULL_DUPLEX_STREAMED: the chunk is sent
// without waiting and the streamed responses that already arrived are
// returned (at endOfStream it waits for the processor's end_of_stream).
// STREAMED: one response per chunk. BUFFERED: chunks are collected and sent
// as one message at endOfStream. NONE: the processor never sees the body.
func (x *Exchange) ResponseBody(chunk []byte, endOfStream bool) ([]byte, error) {
	if x.processorDone {
		return chunk, nil
	}
	out, err := x.responseBody(chunk, endOfStream)
	if err != nil && x.endedOK(err) {
		// What the processor already streamed back went downstream; the
		// rest passes through. With BUFFERED the chunks held so far were
		// never answered: Envoy forwards them.
		if x.modes.Response == Buffered || x.modes.Response == BufferedPartial {
			return append(out, x.respBuf...), nil
		}
		return append(out, chunk...), nil
	}
	return out, err
}

func (x *Exchange) responseBody(chunk []byte, endOfStream bool) ([]byte, error) {
	switch x.modes.Response {
	case FullDuplexStreamed:
		if err := x.sendResponseBody(chunk, endOfStream); err != nil {
			return nil, err
		}
		return x.drainResponse(endOfStream)
	case Streamed:
		if err := x.sendResponseBody(chunk, endOfStream); err != nil {
			return nil, err
		}
		return x.expectResponseBody(chunk)
	case Buffered, BufferedPartial:
		x.respBuf = append(x.respBuf, chunk...)
		if !endOfStream {
			return nil, nil
		}
		if err := x.sendResponseBody(x.respBuf, true); err != nil {
			return nil, err
		}
		return x.expectResponseBody(x.respBuf)
	default:
		return chunk, nil
	}
}

// bodyMsg holds every level of a response-body message: one allocation per
// chunk.
type bodyMsg struct {
	req  extprocv3.ProcessingRequest
	one  extprocv3.ProcessingRequest_ResponseBody
	body extprocv3.HttpBody
}

func (x *Exchange) sendResponseBody(b []byte, eos bool) error {
	m := &bodyMsg{}
	m.body.Body, m.body.EndOfStream = b, eos
	m.one.ResponseBody = &m.body
	m.req.Request = &m.one
	return x.send(&m.req)
}

// drainResponse collects streamed response bodies: whatever is queued, or,
// with wait, everything up to end_of_stream.
func (x *Exchange) drainResponse(wait bool) ([]byte, error) {
	var out []byte
	for !x.respEOS {
		var r *extprocv3.ProcessingResponse
		var err error
		if wait {
			r, err = x.next()
		} else {
			var ok bool
			r, ok, err = x.poll()
			if !ok && err == nil {
				return out, nil
			}
		}
		if err != nil {
			return out, err
		}
		switch v := r.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ResponseBody:
			sr := v.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return out, protoErr("FULL_DUPLEX_STREAMED response body response without a streamed_response")
			}
			out = append(out, sr.GetBody()...)
			x.respEOS = sr.GetEndOfStream()
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			return out, protoErr("immediate response after the response started")
		default:
			return out, protoErr("unexpected %T while streaming the response body", v)
		}
	}
	return out, nil
}

func (x *Exchange) expectResponseBody(sent []byte) ([]byte, error) {
	r, err := x.next()
	if err != nil {
		return nil, err
	}
	v, ok := r.GetResponse().(*extprocv3.ProcessingResponse_ResponseBody)
	if !ok {
		return nil, protoErr("expected a response body response, got %T", r.GetResponse())
	}
	switch m := v.ResponseBody.GetResponse().GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_StreamedResponse:
		return nil, protoErr("streamed_response outside FULL_DUPLEX_STREAMED")
	case *extprocv3.BodyMutation_Body:
		return m.Body, nil
	case *extprocv3.BodyMutation_ClearBody:
		return nil, nil
	}
	return sent, nil
}

// ResponseTrailers sends the response trailers (gRPC backends) and waits for
// the trailers response. In FULL_DUPLEX_STREAMED, body responses still in
// flight are collected first.
func (x *Exchange) ResponseTrailers(trailers []Header) error {
	if x.processorDone {
		return nil
	}
	if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: headerMap(trailers)}}}); err != nil {
		if x.endedOK(err) {
			return nil
		}
		return err
	}
	for {
		r, err := x.next()
		if err != nil {
			if x.endedOK(err) {
				return nil
			}
			return err
		}
		switch v := r.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			return nil
		case *extprocv3.ProcessingResponse_ResponseBody:
			if x.modes.Response != FullDuplexStreamed {
				return protoErr("unexpected response body response before the trailers response")
			}
		default:
			return protoErr("expected a response trailers response, got %T", v)
		}
	}
}

// ProcessorClosed tells whether the processor ended the stream with an OK
// status during the response: from then on the response passes through
// untouched, as Envoy lets it.
func (x *Exchange) ProcessorClosed() bool { return x.processorDone }

// endedOK tells whether err comes from the processor having ended the stream
// with an OK status and nothing left unread (a graceful close), waiting for
// the stream's final status when a send found the stream already ended. It
// marks the exchange so that the rest of the response passes through.
func (x *Exchange) endedOK(err error) bool {
	if !errors.Is(err, io.EOF) {
		return false
	}
	for {
		x.mu.Lock()
		queued, recvErr := len(x.queue), x.recvErr
		x.mu.Unlock()
		if queued > 0 {
			return false
		}
		if recvErr != nil {
			if errors.Is(recvErr, io.EOF) {
				x.processorDone = true
				return true
			}
			return false
		}
		select {
		case <-x.notify:
		case <-x.ctx.Done():
			return false
		}
	}
}
