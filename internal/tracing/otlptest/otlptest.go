// Package otlptest is an in-process OTLP trace receiver for tests and
// benchmarks: a real gRPC TraceService and a real HTTP /v1/traces endpoint
// on loopback, which keep (or, for benchmarks, only count) the spans they
// receive.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is a received span, flattened for assertions.
type Span struct {
	Name            string
	TraceID, SpanID string
	ParentSpanID    string
	Kind            tracepb.Span_SpanKind
	Attributes      map[string]string
	Events          []string
	StatusCode      tracepb.Status_StatusCode
	Service         string // the resource's service.name
	ScopeName       string
	Start, End      time.Time
}

// Receiver keeps every span it is sent.
type Receiver struct {
	collectorpb.UnimplementedTraceServiceServer

	// GRPC is host:port of the gRPC endpoint; HTTP the base URL of the
	// HTTP one (spans are posted to HTTP + "/v1/traces").
	GRPC, HTTP string

	// CountOnly keeps no span, only the count (a benchmark's sink).
	CountOnly bool

	mu    sync.Mutex
	spans []Span
	count int
}

// Start runs both endpoints on loopback until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r, stop, err := Listen("127.0.0.1:0", "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return r
}

// Listen runs both endpoints on the given addresses until stop is called.
func Listen(grpcAddr, httpAddr string, countOnly bool) (r *Receiver, stop func(), err error) {
	r = &Receiver{CountOnly: countOnly}
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return nil, nil, err
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		gl.Close()
		return nil, nil, err
	}
	g := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(g, r)
	go func() { _ = g.Serve(gl) }()
	r.GRPC = gl.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	r.HTTP = "http://" + hl.Addr().String()
	return r, func() { g.Stop(); _ = hs.Close() }, nil
}

// Count is how many spans were received.
func (r *Receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Export implements the OTLP gRPC TraceService.
func (r *Receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.add(req)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	b, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg)
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *collectorpb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.CountOnly {
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				r.count += len(ss.GetSpans())
			}
		}
		return
	}
	for _, rs := range req.GetResourceSpans() {
		service := value(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{
					Name: sp.GetName(), TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()), Kind: sp.GetKind(),
					Attributes: make(map[string]string), StatusCode: sp.GetStatus().GetCode(), Service: service,
					ScopeName: ss.GetScope().GetName(),
					Start:     time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano())),
				}
				for _, a := range sp.GetAttributes() {
					s.Attributes[a.GetKey()] = text(a.GetValue())
				}
				for _, e := range sp.GetEvents() {
					s.Events = append(s.Events, e.GetName())
				}
				r.spans = append(r.spans, s)
				r.count++
			}
		}
	}
}

// Spans returns what was received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait polls until cond holds over the received spans, or fails the test
// after limit.
func (r *Receiver) Wait(t testing.TB, limit time.Duration, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		spans := r.Spans()
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("OTLP receiver: %s not seen within %v; received %d spans: %+v", what, limit, len(spans), spans)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func value(attrs []*commonpb.KeyValue, key string) string {
	for _, a := range attrs {
		if a.GetKey() == key {
			return text(a.GetValue())
		}
	}
	return ""
}

func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconvInt(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	case *commonpb.AnyValue_DoubleValue:
		return strconvFloat(x.DoubleValue)
	}
	return v.String()
}

func strconvInt(v int64) string     { return strconv.FormatInt(v, 10) }
func strconvFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// ByName indexes spans by name (the last of a name wins).
func ByName(spans []Span) map[string]Span {
	out := make(map[string]Span, len(spans))
	for _, s := range spans {
		out[s.Name] = s
	}
	return out
}
