package vtcodec

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// messages covers what the picker and envoysim exchange: every oneof branch
// they use, header mutations, dynamic metadata, and a body above grpc's
// pooling threshold.
func messages() map[string]proto.Message {
	big := bytes.Repeat([]byte("x"), 70_000)
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	lb := &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStructValue(&structpb.Struct{
		Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint": structpb.NewStringValue("10.0.0.1:8000")}})}}
	return map[string]proto.Message{
		"request headers with protocol config and subset hint": &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/completions")}}}}},
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb.subset_hint": {
				Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-subset": structpb.NewListValue(&structpb.ListValue{
					Values: []*structpb.Value{structpb.NewStringValue("10.0.0.1:8000"), structpb.NewStringValue("10.0.0.2")}})}}}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
				ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		},
		"request body": &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(`{"prompt":[1,2,3]}`), EndOfStream: true}}},
		"large response body": &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: big}}},
		"routing decision": &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders:    []*corev3.HeaderValueOption{set("x-gateway-destination-endpoint", "10.0.0.1:8000"), set("x-worker-instance-id", "7")},
					RemoveHeaders: []string{"x-gateway-destination-endpoint-subset"}}}}},
			DynamicMetadata: lb,
		},
		"streamed echo": &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte("data: {}\n\n"), EndOfStream: true}}}}}}},
		"large streamed body": requestBodyEcho(big[:62000]),
		"immediate response": &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
			ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable},
				Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("content-type", "application/json")}},
				Body:    []byte(`{"error":"no worker"}`), Details: "kvselect_serviceunavailable"}}},
		"empty": &extprocv3.ProcessingResponse{},
		"not an Envoy message (protobuf-go path)": &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING},
	}
}

// TestSameEncodingAsProtobufGo: the codec sends what grpc's default codec
// sends. The fields may come in another order — protobuf-go writes oneof
// fields after the others, vtproto's strict marshal strictly by number; both
// are valid protobuf — so the check is the same length, the same bytes as a
// multiset, and a decode equal to the original.
func TestSameEncodingAsProtobufGo(t *testing.T) {
	for name, m := range messages() {
		t.Run(name, func(t *testing.T) {
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			data, err := Codec{}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got := data.Materialize()
			data.Free()
			if !bytes.Equal(sorted(got), sorted(want)) {
				t.Fatalf("encoding differs from protobuf-go's beyond field order:\n got %x\nwant %x", got, want)
			}
			back := m.ProtoReflect().New().Interface()
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(got)}, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, m) {
				t.Fatalf("round trip: got %v, want %v", back, m)
			}
		})
	}
}

// TestReusedBuffersCarryNothingOver: NewCodec's buffers are lent again
// without being cleared, so each message must overwrite all of what it
// takes. Echoed body chunks of falling sizes, each marshalled into the
// buffer the one before gave back, decode to exactly their own body.
func TestReusedBuffersCarryNothingOver(t *testing.T) {
	if !Fast() {
		t.Skip("built without -tags vtprotobuf: protobuf-go encodes into buffers of its own, none are lent")
	}
	c := NewCodec()
	var reused bool
	var last *byte
	for i, n := range []int{20_000, 19_999, 18_500, 17_000, 16_385, 4_000, 1_100} {
		body := bytes.Repeat([]byte{byte('a' + i)}, n)
		m := requestBodyEcho(body)
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) != 1 {
			t.Fatalf("%d bytes: %d buffers, want 1", n, len(data))
		}
		got := data[0].ReadOnlyData()
		reused = reused || &got[0] == last
		last = &got[0]
		if !bytes.Equal(got, want) {
			t.Fatalf("%d-byte body: the encoding differs from protobuf-go's", n)
		}
		data.Free()
	}
	if !reused {
		t.Fatal("no message reused the buffer the one before gave back; the test checks nothing")
	}
}

// requestBodyEcho is the picker's echo of one request body chunk
// (FULL_DUPLEX_STREAMED).
func requestBodyEcho(body []byte) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body}}}}}}}
}

func sorted(b []byte) []byte {
	c := slices.Clone(b)
	slices.Sort(c)
	return c
}

// TestMultiKeyMapRoundTrip: with several map keys the order on the wire is
// unspecified (as with protobuf-go without Deterministic); the message must
// still decode equal.
func TestMultiKeyMapRoundTrip(t *testing.T) {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, k := range strings.Fields("a b c d e f g h") {
		md.Fields[k] = structpb.NewStringValue(k + k)
	}
	m := &extprocv3.ProcessingResponse{DynamicMetadata: md}
	data, err := Codec{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back := &extprocv3.ProcessingResponse{}
	if err := (Codec{}).Unmarshal(data, back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, m) {
		t.Fatalf("round trip: got %v, want %v", back, m)
	}
}

func TestErrors(t *testing.T) {
	if _, err := (Codec{}).Marshal("not a message"); err == nil || !strings.Contains(err.Error(), "not a protobuf message") {
		t.Fatalf("Marshal(string) = %v, want a clear error", err)
	}
	if err := (Codec{}).Unmarshal(nil, new(int)); err == nil || !strings.Contains(err.Error(), "not a protobuf message") {
		t.Fatalf("Unmarshal into *int = %v, want a clear error", err)
	}
	bad := mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0xff, 0xff})} // field 1, length beyond the data
	if err := (Codec{}).Unmarshal(bad, &extprocv3.ProcessingRequest{}); err == nil || !strings.Contains(err.Error(), "ProcessingRequest") {
		t.Fatalf("Unmarshal(truncated) = %v, want an error naming the message", err)
	}
	if (Codec{}).Name() != "proto" {
		t.Fatalf("Name() = %q, want proto (grpc's content-subtype)", Codec{}.Name())
	}
}

func BenchmarkMarshalEcho(b *testing.B) {
	m := messages()["streamed echo"]
	b.ReportAllocs()
	for b.Loop() {
		d, err := Codec{}.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		d.Free()
	}
}

// BenchmarkMarshalLongChunk is one chunk of a long body echoed back (the
// picker's BodyChunkBytes, 62,000 bytes) through grpc's default pool, which
// lends a 1 MiB buffer cleared whole, and through NewCodec's own, which
// lends a 64 KiB one as it was left.
func BenchmarkMarshalLongChunk(b *testing.B) {
	m := requestBodyEcho(bytes.Repeat([]byte("1234, "), 62_000/6))
	for _, c := range []struct {
		name  string
		codec Codec
	}{{"grpc-pool", Codec{}}, {"own-pool", NewCodec()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(proto.Size(m)))
			b.ReportAllocs()
			for b.Loop() {
				d, err := c.codec.Marshal(m)
				if err != nil {
					b.Fatal(err)
				}
				d.Free()
			}
		})
	}
}
