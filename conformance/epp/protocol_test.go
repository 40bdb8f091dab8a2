package epp

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvselect/kvselect/envoysim"
)

// Proposal 004: the pick goes out as the destination header and as envoy.lb
// dynamic metadata with the same value (a proxy may read either), an ip:port
// of the pool, with clear_route_cache so that Envoy routes again;
// FULL_DUPLEX_STREAMED bodies come back intact in ≤ 62,000-byte chunks with
// content-length fixed.
func TestDestinationHeaderAndMetadataAgree(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 3)
	body := p.chat(strings.Repeat("a long shared document. ", 8000)) // ~190 KB
	x, d := s.routed(t, &envoysim.Request{Modes: envoysim.GIE, Body: body})
	defer x.Close()
	if d.Destination == "" || d.Destination != d.MetadataDestination {
		t.Fatalf("header %q and envoy.lb metadata %q must be equal and set", d.Destination, d.MetadataDestination)
	}
	if !p.has(d.Endpoint) {
		t.Fatalf("destination %q is not an endpoint of the pool %v", d.Endpoint, p.addrs)
	}
	if want := fallbacksConfigured(); len(d.Fallbacks) != min(want, len(p.addrs)-1) {
		t.Fatalf("%d fallbacks, server configured for %d", len(d.Fallbacks), want)
	}
	if !d.ClearRouteCache {
		t.Fatal("clear_route_cache not set")
	}
	if !bytes.Equal(d.Body, body) || d.SetHeaders["content-length"] != strconv.Itoa(len(body)) {
		t.Fatalf("forwarded body %d bytes with content-length %q, want the %d sent", len(d.Body), d.SetHeaders["content-length"], len(body))
	}
	if d.BodyMessages < 4 {
		t.Fatalf("%d body messages for %d bytes", d.BodyMessages, len(body))
	}
	for _, r := range x.Received() {
		if b := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); len(b) > bodyChunkLimit {
			t.Fatalf("a %d-byte body chunk exceeds %d", len(b), bodyChunkLimit)
		}
	}
	if d.SetHeaders[hdrWorkerID] == "" || d.SetHeaders[hdrDPRank] == "" {
		t.Fatalf("worker id / dp rank headers missing: %v", d.SetHeaders)
	}
}

// Proposal 004 (since v0.4): ordered fallbacks follow the primary in the same
// comma-separated value, all distinct pool endpoints (server started with
// --extproc-fallbacks > 0).
func TestFallbackEndpoints(t *testing.T) {
	s := need(t)
	n := fallbacksConfigured()
	if n == 0 {
		t.Skip("server runs without fallbacks (" + envFallbacks + " unset)")
	}
	p := s.newPool(t, n+2)
	x, d := s.routed(t, &envoysim.Request{Modes: envoysim.GIE, Body: p.chat("fallbacks")})
	defer x.Close()
	seen := map[string]bool{d.Endpoint: true}
	for _, f := range d.Fallbacks {
		if seen[f] || !p.has(f) {
			t.Fatalf("destination %q: fallbacks must be distinct pool endpoints", d.Destination)
		}
		seen[f] = true
	}
	if len(d.Fallbacks) != n {
		t.Fatalf("%d fallbacks, want %d", len(d.Fallbacks), n)
	}
}

// Proposal 004: the subset hint (envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset) restricts the pick (a list or, as
// header-to-metadata filters write it, a comma string; ip:port aware); an
// empty or disjoint hint means 503.
func TestSubsetHint(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 4)
	comma := p.addrs[1] + "," + p.addrs[3]
	ipOnly := strings.Split(p.addrs[2], ":")[0]
	for name, tc := range map[string]struct {
		req    envoysim.Request
		accept []string
	}{
		"list":            {envoysim.Request{SubsetHint: []string{p.addrs[1]}}, []string{p.addrs[1]}},
		"comma":           {envoysim.Request{SubsetHintString: &comma}, []string{p.addrs[1], p.addrs[3]}},
		"ip without port": {envoysim.Request{SubsetHint: []string{ipOnly}}, []string{p.addrs[2]}},
	} {
		t.Run(name, func(t *testing.T) {
			for i := range 6 {
				req := tc.req
				req.Modes, req.Body = envoysim.GIE, p.chat(name+strconv.Itoa(i))
				x, d := s.routed(t, &req)
				x.Close()
				if !contains(tc.accept, d.Endpoint) {
					t.Fatalf("picked %s outside the subset %v", d.Endpoint, tc.accept)
				}
			}
		})
	}
	for name, req := range map[string]envoysim.Request{
		"empty list":    {SubsetHint: []string{}},
		"no pool match": {SubsetHint: []string{"192.0.2.1:8000"}},
		"port mismatch": {SubsetHint: []string{strings.Replace(p.addrs[0], ":8000", ":9999", 1)}},
	} {
		t.Run(name, func(t *testing.T) {
			req.Modes, req.Body = envoysim.GIE, p.chat(name)
			_, d := s.start(t, &req)
			wantImmediate(t, d, 503)
		})
	}
	p.idle(t)
}

// Proposal 004: a request the picker does not route gets an immediate
// response (503 no endpoint, 429 dropped), here with a JSON {"error": ...}
// body: 400 bad body, 413 over the body limit, 503 no worker, 429 overloaded.
func TestImmediateResponses(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 2)
	cases := map[string]struct {
		req    envoysim.Request
		status int
	}{
		"malformed json":      {envoysim.Request{Body: []byte(`{"model":`)}, 400},
		"prompt of bad type":  {envoysim.Request{Body: []byte(`{"model":"` + p.model + `","prompt":{}}`)}, 400},
		"bad identity header": {envoysim.Request{Headers: []envoysim.Header{{Key: "x-kvselect-token-ids", Value: "1,two"}}, Body: p.chat("x")}, 400},
		"unknown model":       {envoysim.Request{Body: []byte(`{"model":"no-such-model-` + s.run + `","prompt":"x"}`)}, 503},
	}
	if lim, _ := strconv.Atoi(os.Getenv("KVSELECT_EXTPROC_MAX_BODY")); lim > 0 {
		cases["body over the limit"] = struct {
			req    envoysim.Request
			status int
		}{envoysim.Request{Body: bytes.Repeat([]byte(" "), lim+1)}, 413}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.req.Modes = envoysim.GIE
			_, d := s.start(t, &tc.req)
			wantImmediate(t, d, tc.status)
		})
	}
	p.idle(t)
}

func TestOverloadIs429(t *testing.T) {
	s := need(t)
	if os.Getenv(envBusy) == "" {
		t.Skip("server runs without a busy threshold (" + envBusy + " unset)")
	}
	p := s.newPool(t, 2)
	long := strings.Repeat("occupy the worker with prefill. ", 50)
	var open []*envoysim.Exchange
	defer func() {
		for _, x := range open {
			x.Close()
		}
	}()
	for i := range 2 {
		x, _ := s.routed(t, &envoysim.Request{Modes: envoysim.GIE, Body: p.chat(long + strconv.Itoa(i))})
		open = append(open, x)
	}
	_, d := s.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: p.chat(long + "third")})
	wantImmediate(t, d, 429)
}

func wantImmediate(t *testing.T, d *envoysim.Decision, status int) {
	t.Helper()
	im := d.Immediate
	if im == nil {
		t.Fatalf("routed to %q, want an immediate %d", d.Destination, status)
	}
	var env struct {
		Error string `json:"error"`
	}
	if im.Status != status || json.Unmarshal(im.Body, &env) != nil || env.Error == "" || !strings.HasPrefix(im.Headers["content-type"], "application/json") {
		t.Fatalf("immediate %d %v %s, want %d with a JSON error", im.Status, im.Headers, im.Body, status)
	}
}

// Every body mode a gateway may configure in Envoy's ext_proc filter gets an
// answer in its shape (envoysim fails on any message Envoy would reject; in
// BUFFERED mode Envoy holds the body until the headers are answered), and
// headers-only requests are picked at the headers.
func TestProcessingModes(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 2)
	for name, tc := range map[string]struct {
		modes envoysim.Modes
		body  []byte
	}{
		"full duplex":                  {envoysim.GIE, p.chat("fd")},
		"full duplex, no protocol cfg": {envoysim.Modes{Request: envoysim.FullDuplexStreamed, Response: envoysim.FullDuplexStreamed, OmitProtocolConfig: true}, p.chat("fd0")},
		"buffered":                     {envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}, p.chat("buf")},
		"streamed":                     {envoysim.Modes{Request: envoysim.Streamed, Response: envoysim.Streamed}, p.chat("str")},
		"headers only":                 {envoysim.Modes{Request: envoysim.None, Response: envoysim.None}, p.chat("none")},
		"no body (GET)":                {envoysim.GIE, nil},
	} {
		t.Run(name, func(t *testing.T) {
			req := &envoysim.Request{Modes: tc.modes, Body: tc.body, Headers: []envoysim.Header{{Key: hdrModel, Value: p.model}}}
			x, d := s.routed(t, req)
			if !p.has(d.Endpoint) || d.Destination != d.MetadataDestination {
				t.Fatalf("decision %+v", d)
			}
			if tc.body != nil && !bytes.Equal(d.Body, tc.body) {
				t.Fatalf("body changed in transit")
			}
			chunks := sse(3)
			got := respond(t, x, d.Endpoint, chunks)
			if tc.modes.Response != envoysim.None && !bytes.Equal(got, bytes.Join(chunks, nil)) {
				t.Fatalf("response forwarded %q", got)
			}
		})
	}
	p.idle(t)
}

// Dynamo's reservation lifecycle over the response path: the booking lives
// while the response streams, the first chunk completes the prefill, output
// blocks grow with streamed tokens, the end frees it; a served fallback (the
// endpoint the gateway reports as served, proposal 004 v1.0) takes the
// booking along.
func TestResponseLifecycle(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 3)
	x, d := s.routed(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"` + p.model + `","stream":true,"prompt":[1,2,3,4,5,6,7,8]}`)})
	served := p.addrs[0]
	if served == d.Endpoint {
		served = p.addrs[1]
	}
	if l := p.loads(t)[d.Endpoint]; l.ActiveRequests != 1 || l.Prefill != 8 {
		t.Fatalf("picked %s: load %+v, want the 8-token booking", d.Endpoint, l)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: served, Headers: sseHeaders}, false); err != nil {
		t.Fatal(err)
	}
	if l := p.loads(t); l[served].ActiveRequests != 1 || l[d.Endpoint].ActiveRequests != 0 {
		t.Fatalf("served by %s: loads %+v, want the booking moved there", served, l)
	}
	chunks := sse(9) // 9 tokens over block size 4: 2 output blocks
	for _, c := range chunks[:9] {
		if _, err := x.ResponseBody(c, false); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "prefill complete and two output blocks", func() bool {
		l := p.loads(t)[served]
		return l.Prefill == 0 && l.Decode == 4 && l.ActiveRequests == 1
	})
	if _, err := x.ResponseBody(chunks[9], true); err != nil {
		t.Fatal(err)
	}
	if p.active(t) != 0 {
		t.Fatal("the response ended but the booking is still live")
	}
	x.Close()
	p.idle(t)
}

// Envoy ends every ext_proc stream with a half-close followed at once by a
// reset, and a client that goes away looks the same, so the picker must
// track completion itself: whatever way a stream ends — close or reset,
// before or after the pick, mid-response — no booking survives it.
func TestNoBookingOutlivesItsStream(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 3)
	for i := range 60 {
		x, d := s.routed(t, &envoysim.Request{Modes: envoysim.GIE, Body: p.chat("end " + strconv.Itoa(i)),
			Headers: []envoysim.Header{{Key: hdrSelectionID, Value: "epp-" + s.run + "-" + strconv.Itoa(i)}}})
		switch i % 5 {
		case 0:
			x.Abort()
		case 1:
			x.Close()
		case 2:
			_, _ = x.ResponseHeaders(envoysim.Response{Served: d.Endpoint}, false)
			x.Abort()
		case 3:
			_, _ = x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: sseHeaders}, false)
			_, _ = x.ResponseBody(sse(1)[0], false)
			x.Close()
		case 4:
			respond(t, x, d.Endpoint, sse(2))
		}
	}
	p.idle(t)
	for i := range 60 {
		st, _, _ := s.restRaw("DELETE", "/reservations/epp-"+s.run+"-"+strconv.Itoa(i), nil)
		if st != 404 {
			t.Fatalf("reservation %d still exists after its stream ended (DELETE %d)", i, st)
		}
	}
}

// The standard gRPC health service (proposal 004's health checking) reports
// SERVING for the server and the ext_proc service.
func TestHealth(t *testing.T) {
	s := need(t)
	hc := healthpb.NewHealthClient(s.conn)
	for _, name := range []string{"", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, r, err)
		}
	}
}

// GIE's conformance suite steers its picker with the
// test-epp-endpoint-selection header (it wins over the subset hint) and reads
// x-conformance-test-served-endpoint back, the hooks of its lwepp picker;
// kvselect has them only with --extproc-test-pick-header.
func TestConformancePickHeader(t *testing.T) {
	s := need(t)
	p := s.newPool(t, 3)
	pick := p.addrs[2]
	on := os.Getenv(envTestPick) == "1"
	seen := map[string]bool{}
	for i := range 12 {
		x, d := s.routed(t, &envoysim.Request{Modes: envoysim.GIE, Body: p.chat("pick " + strconv.Itoa(i) + strings.Repeat(" pad", 30)),
			Headers: []envoysim.Header{{Key: hdrTestPick, Value: pick}}, SubsetHint: []string{p.addrs[0]}})
		seen[d.Endpoint] = true
		res, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint}, true)
		if err != nil {
			t.Fatal(err)
		}
		x.Close()
		if on {
			if d.Endpoint != pick || res.SetHeaders[hdrTestServed] != pick {
				t.Fatalf("hook on: picked %s (served header %q), want %s", d.Endpoint, res.SetHeaders[hdrTestServed], pick)
			}
		} else if _, ok := res.SetHeaders[hdrTestServed]; ok || d.Endpoint != p.addrs[0] {
			t.Fatalf("hook off: the header must be ignored and the subset hint obeyed (picked %s)", d.Endpoint)
		}
	}
	p.idle(t)
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
