package vtcodec

import (
	"bytes"
	"testing"
	"unsafe"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

func requestBody(response bool, body []byte, eos bool) *extprocv3.ProcessingRequest {
	hb := &extprocv3.HttpBody{Body: body, EndOfStream: eos}
	if response {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}}
}

func streamedResponse(response bool, body []byte, eos, eosNoMessage bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body: body, EndOfStream: eos, EndOfStreamWithoutMessage: eosNoMessage}}}}}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
}

// TestBodyChunksTakeTheFastPath: every body-chunk shape the picker and Envoy
// exchange is read by bodies.go, equal to protobuf-go's decoding, into a
// message that held something else before (the picker reuses one per
// stream); other shapes are left to protobuf-go.
func TestBodyChunksTakeTheFastPath(t *testing.T) {
	big := bytes.Repeat([]byte("y"), 70_000)
	fast := []proto.Message{
		requestBody(true, []byte("data: {}\n\n"), false), requestBody(true, nil, true), requestBody(false, big, true),
		streamedResponse(true, []byte("data: [DONE]\n\n"), true, false), streamedResponse(false, big[:62000], false, false),
		streamedResponse(true, nil, false, true),
	}
	for i, m := range fast {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		var got proto.Message
		switch m.(type) {
		case *extprocv3.ProcessingRequest:
			r := &extprocv3.ProcessingRequest{MetadataContext: messages()["request headers with protocol config and subset hint"].(*extprocv3.ProcessingRequest).MetadataContext}
			ok, got = decodeBodyRequest(b, r), r
		case *extprocv3.ProcessingResponse:
			r := &extprocv3.ProcessingResponse{DynamicMetadata: messages()["routing decision"].(*extprocv3.ProcessingResponse).DynamicMetadata}
			ok, got = decodeBodyResponse(b, r), r
		}
		if !ok {
			t.Fatalf("message %d (%v) not taken by the fast path", i, m)
		}
		if !proto.Equal(got, m) {
			t.Fatalf("message %d: fast path %v, want %v", i, got, m)
		}
	}
	for name, m := range messages() {
		b, _ := proto.Marshal(m)
		if r, ok := m.(*extprocv3.ProcessingRequest); ok && decodeBodyRequest(b, proto.Clone(r).(*extprocv3.ProcessingRequest)) && r.GetRequestBody() == nil && r.GetResponseBody() == nil {
			t.Errorf("%s: taken by the body-chunk path", name)
		}
		if r, ok := m.(*extprocv3.ProcessingResponse); ok && r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse() == nil &&
			r.GetResponseBody() == nil && decodeBodyResponse(b, &extprocv3.ProcessingResponse{}) {
			t.Errorf("%s: taken by the streamed-body path", name)
		}
	}
}

// FuzzBodyDecoders: whatever bytes the fast readers accept decode exactly as
// protobuf-go decodes them, and the codec never answers differently from
// protobuf-go.
func FuzzBodyDecoders(f *testing.F) {
	for _, m := range []proto.Message{requestBody(true, []byte("x"), true), requestBody(false, nil, false),
		streamedResponse(true, []byte("data"), true, false), streamedResponse(false, nil, false, true), messages()["routing decision"]} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, pair := range []struct{ fast, want proto.Message }{
			{&extprocv3.ProcessingRequest{}, &extprocv3.ProcessingRequest{}},
			{&extprocv3.ProcessingResponse{}, &extprocv3.ProcessingResponse{}},
		} {
			var took bool
			switch m := pair.fast.(type) {
			case *extprocv3.ProcessingRequest:
				took = decodeBodyRequest(b, m)
			case *extprocv3.ProcessingResponse:
				took = decodeBodyResponse(b, m)
			}
			wantErr := proto.Unmarshal(b, pair.want)
			if took && wantErr != nil {
				t.Fatalf("fast path took %x, protobuf-go rejects it: %v", b, wantErr)
			}
			if took && !proto.Equal(pair.fast, pair.want) {
				t.Fatalf("fast path %v, protobuf-go %v for %x", pair.fast, pair.want, b)
			}
			// Through the codec: the same error-or-message as protobuf-go.
			got := pair.fast.ProtoReflect().New().Interface()
			err := Codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
			if (err == nil) != (wantErr == nil) || (err == nil && !proto.Equal(got, pair.want)) {
				t.Fatalf("codec %v / %v, protobuf-go %v / %v for %x", got, err, pair.want, wantErr, b)
			}
		}
	})
}

func BenchmarkUnmarshalEcho(b *testing.B) {
	data, _ := proto.Marshal(streamedResponse(true, []byte("data: {\"choices\":[{\"delta\":{\"content\":\"t\"}}]}\n\n"), false, false))
	b.ReportAllocs()
	for b.Loop() {
		if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &extprocv3.ProcessingResponse{}); err != nil {
			b.Fatal(err)
		}
	}
}

// A stream's one message decoded into over and over reuses its body's array
// for the next chunk, request or response, and each decode still equals
// protobuf-go's.
func TestBodyDecodeReusesTheMessagesArray(t *testing.T) {
	big := bytes.Repeat([]byte("a"), 16<<10)
	chunks := []*extprocv3.ProcessingRequest{
		requestBody(false, big, false),
		requestBody(false, []byte("tail of the request"), true),
		requestBody(true, []byte("data: {}\n\n"), false),
		requestBody(true, nil, true),
		requestBody(true, []byte("data: [DONE]\n\n"), true),
	}
	m := &extprocv3.ProcessingRequest{}
	var first *byte
	for i, want := range chunks {
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !decodeBodyRequest(b, m) {
			t.Fatalf("chunk %d not taken by the fast path", i)
		}
		if !proto.Equal(m, want) {
			t.Fatalf("chunk %d: decoded %v, want %v", i, m, want)
		}
		body := m.GetRequestBody().GetBody()
		if body == nil {
			body = m.GetResponseBody().GetBody()
		}
		if i == 0 {
			first = unsafe.SliceData(body)
		} else if len(body) > 0 && unsafe.SliceData(body) != first {
			t.Fatalf("chunk %d got a new array", i)
		}
	}
	if testing.AllocsPerRun(100, func() {
		b, _ := proto.Marshal(chunks[2])
		decodeBodyRequest(b, m)
	}) > 2 { // the wire bytes and the message's one allocation
		t.Fatal("decoding a chunk into a message that held a larger one allocated its body")
	}
}
