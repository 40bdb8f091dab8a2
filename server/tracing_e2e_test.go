package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/internal/tracing/otlptest"
)

// TestTracesReachAnOTLPReceiver: with OTEL_EXPORTER_OTLP_ENDPOINT set, a
// request through the picker and one through the REST API each arrive at a
// real OTLP receiver as a span tree under the caller's trace, with the
// decision on the selection span and the booking's lifecycle as events.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	rcv := otlptest.Start(t)
	env := func(k string) (string, bool) {
		switch k {
		case "OTEL_EXPORTER_OTLP_ENDPOINT":
			return "http://" + rcv.GRPC, true
		case "OTEL_EXPORTER_OTLP_PROTOCOL":
			return "grpc", true
		}
		return withoutKVEvents(k)
	}
	b := runInBackground(t, env, nil)
	for i := 1; i <= 2; i++ {
		res, err := http.Post(b.rest()+"/workers", "application/json",
			strings.NewReader(fmt.Sprintf(`{"worker_id":%d,"model_name":"m","endpoint":"http://10.0.0.%d:8000","block_size":4}`, i, i)))
		if err != nil || res.StatusCode/100 != 2 {
			t.Fatalf("register: %v %v", res, err)
		}
		res.Body.Close()
	}
	if !strings.Contains(b.logs.String(), "tracing on") {
		t.Errorf("no log line says tracing is on:\n%s", b.logs.String())
	}

	// Through the picker, under the gateway's trace.
	const gatewayTrace, gatewaySpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	conn := dialPicker(t, b.addrs.ExtProc.String(), insecure.NewCredentials())
	x, d, err := envoysim.New(conn).Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE,
		Body:    []byte(`{"model":"m","stream":true,"prompt":[1,2,3,4,5,6,7,8]}`),
		Headers: []envoysim.Header{{Key: "traceparent", Value: "00-" + gatewayTrace + "-" + gatewaySpan + "-01"}}})
	if err != nil || d.Immediate != nil {
		t.Fatalf("pick: %v %+v", err, d)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := x.ResponseBody([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"), true); err != nil {
		t.Fatal(err)
	}
	x.Close()

	// Through the REST API, under a Ray driver's trace.
	const rayTrace, raySpan = "1af7651916cd43dd8448eb211c80319d", "c7ad6b7169203332"
	call := func(method, path, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, b.rest()+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+rayTrace+"-"+raySpan+"-01")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, msg)
		}
	}
	call("POST", "/select_and_reserve", `{"model_name":"m","token_ids":[1,2,3,4],"selection_id":"ray-1"}`)
	call("POST", "/reservations/ray-1/prefill_complete", ``)
	call("DELETE", "/reservations/ray-1", ``)

	spans := rcv.Wait(t, 20*time.Second, "the picker's and the REST API's spans", func(s []otlptest.Span) bool {
		n := 0
		for _, sp := range s {
			if sp.TraceID == gatewayTrace || sp.TraceID == rayTrace {
				n++
			}
		}
		return n >= 3+5 // request, parse, select; three REST routes, parse, select
	})
	inTrace := func(trace string) map[string]otlptest.Span {
		var own []otlptest.Span
		for _, sp := range spans {
			if sp.TraceID == trace {
				own = append(own, sp)
			}
		}
		return otlptest.ByName(own)
	}

	gw := inTrace(gatewayTrace)
	root := gw[tracing.SpanRequest]
	if root.ParentSpanID != gatewaySpan || root.Service != "kvselect" {
		t.Errorf("picker request span under %q in service %q, want under the gateway's %s in kvselect", root.ParentSpanID, root.Service, gatewaySpan)
	}
	sel := gw[tracing.SpanSelect]
	if sel.ParentSpanID != root.SpanID || gw[tracing.SpanParse].ParentSpanID != root.SpanID {
		t.Errorf("parse/select spans not children of the request span: %+v", gw)
	}
	if sel.Attributes["kvselect.candidates"] != "2" || sel.Attributes["kvselect.worker_id"] != d.SetHeaders["x-kvselect-worker-id"] {
		t.Errorf("select span attributes %v, want 2 candidates and worker %s", sel.Attributes, d.SetHeaders["x-kvselect-worker-id"])
	}
	if got := strings.Join(root.Events, ","); !strings.Contains(got, tracing.EventPrefillComplete) || !strings.HasSuffix(got, tracing.EventFreed) {
		t.Errorf("request span events %s, want the prefill completion and the free", got)
	}
	if want := "00-" + gatewayTrace + "-" + root.SpanID + "-01"; d.SetHeaders["traceparent"] != want {
		t.Errorf("traceparent to the worker %q, want %q", d.SetHeaders["traceparent"], want)
	}

	ray := inTrace(rayTrace)
	route := ray["POST /select_and_reserve"]
	if route.ParentSpanID != raySpan || route.Attributes["http.response.status_code"] != "200" {
		t.Errorf("REST route span %+v, want under %s with status 200", route, raySpan)
	}
	if s := ray[tracing.SpanSelect]; s.ParentSpanID != route.SpanID || s.Attributes["kvselect.selection_id"] != "ray-1" {
		t.Errorf("REST select span %+v, want a child of the route carrying selection ray-1", s)
	}
	if ev := ray["DELETE /reservations/{reservation_id}"].Events; len(ev) != 1 || ev[0] != tracing.EventFreed {
		t.Errorf("free span events %v, want %s", ev, tracing.EventFreed)
	}
}
