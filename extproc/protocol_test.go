package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/metricstest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// Every processing mode a gateway may configure gets a routing decision in
// the shape that mode needs, carries the body through unchanged, and frees
// the booking when the response ends.
func TestProcessingModes(t *testing.T) {
	big := chatBody(strings.Repeat("long context. ", 10_000), true) // ~140 KB: three 62,000-byte chunks
	hello := chatBody(strings.Repeat("hello there ", 40), true)     // ~120 tokens; a headers-only pick books ~7
	cases := []struct {
		name      string
		modes     envoysim.Modes
		body      []byte
		wantChunk int // streamed body messages back (FULL_DUPLEX_STREAMED)
		wantCL    bool
		bodyPick  bool // the pick saw the body (ISL from the text, not the path)
		assumed   *extproc.BodyModes
	}{
		{"full duplex", envoysim.GIE, hello, 1, true, true, nil},
		{"full duplex large body re-chunked", envoysim.GIE, big, 3, true, true, nil},
		{"full duplex without protocol_config", envoysim.Modes{Request: envoysim.FullDuplexStreamed, Response: envoysim.FullDuplexStreamed, OmitProtocolConfig: true},
			hello, 1, true, true, nil},
		{"buffered without protocol_config, modes assumed", envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Streamed, OmitProtocolConfig: true},
			hello, 0, false, true, &extproc.BodyModes{Request: envoysim.Buffered, Response: envoysim.Streamed}},
		{"buffered", envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}, hello, 0, false, true, nil},
		{"buffered partial", envoysim.Modes{Request: envoysim.BufferedPartial, Response: envoysim.Streamed}, hello, 0, false, true, nil},
		{"streamed picks on headers", envoysim.Modes{Request: envoysim.Streamed, Response: envoysim.Streamed}, hello, 0, false, false, nil},
		{"headers-only body mode", envoysim.Modes{Request: envoysim.None, Response: envoysim.None}, hello, 0, false, false, nil},
		{"request without body", envoysim.GIE, nil, 0, false, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{opts: extproc.Options{DefaultModel: model, AssumedModes: tc.assumed}})
			x, d := h.start(t, &envoysim.Request{Modes: tc.modes, Body: tc.body, ChunkSize: 8 << 10,
				Headers: []envoysim.Header{{Key: "x-request-id", Value: "req-" + tc.name}}})
			if d.Immediate != nil {
				t.Fatalf("immediate response %d %s", d.Immediate.Status, d.Immediate.Body)
			}
			if d.Destination == "" || d.Destination != d.MetadataDestination || !d.ClearRouteCache {
				t.Fatalf("destination header %q, envoy.lb metadata %q, clear_route_cache %v", d.Destination, d.MetadataDestination, d.ClearRouteCache)
			}
			if !strings.HasPrefix(d.Endpoint, "10.0.0.") || !strings.HasSuffix(d.Endpoint, ":8000") {
				t.Fatalf("endpoint %q is not a worker's ip:port", d.Endpoint)
			}
			if d.SetHeaders[extproc.HeaderWorkerID] != d.Endpoint[len("10.0.0."):len("10.0.0.")+1] || d.SetHeaders[extproc.HeaderDPRank] != "0" ||
				d.SetHeaders[extproc.HeaderSelectionID] != "req-"+tc.name {
				t.Fatalf("worker headers %v", d.SetHeaders)
			}
			if !bytes.Equal(d.Body, tc.body) && !(tc.body == nil && len(d.Body) == 0) {
				t.Fatalf("forwarded body differs (%d bytes, want %d)", len(d.Body), len(tc.body))
			}
			if d.BodyMessages != tc.wantChunk {
				t.Fatalf("%d streamed body messages, want %d", d.BodyMessages, tc.wantChunk)
			}
			if cl, ok := d.SetHeaders["content-length"]; ok != tc.wantCL || (ok && cl != strconv.Itoa(len(tc.body))) {
				t.Fatalf("content-length %q set=%v, want set=%v", cl, ok, tc.wantCL)
			}
			for _, r := range x.Received() {
				if sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil && len(sr.GetBody()) > extproc.BodyChunkBytes {
					t.Fatalf("body chunk of %d bytes exceeds %d", len(sr.GetBody()), extproc.BodyChunkBytes)
				}
			}
			l := h.loads()
			var prefill uint64
			for _, r := range l {
				prefill += r.PotentialPrefillTokens
			}
			if tc.bodyPick != (prefill > 50) {
				t.Fatalf("booked prefill %d tokens: body identity used = %v, want %v", prefill, prefill > 50, tc.bodyPick)
			}
			if h.activeRequests() != 1 {
				t.Fatalf("%d active requests while the response runs, want 1", h.activeRequests())
			}
			chunks := sseChunks(3)
			got := finish(t, x, d.Endpoint, chunks)
			if tc.modes.Response != envoysim.None && string(got) != join(chunks) {
				t.Fatalf("response forwarded %q", got)
			}
			h.idle(t)
		})
	}
}

// Request trailers end a FULL_DUPLEX_STREAMED body: the pick happens then and
// the trailers get their response after the body.
func TestFullDuplexWithRequestTrailers(t *testing.T) {
	h := start(t, setup{})
	body := chatBody("with trailers", false)
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: body, Trailers: []envoysim.Header{{Key: "x-checksum", Value: "1"}}})
	if d.Immediate != nil || d.Endpoint == "" || !bytes.Equal(d.Body, body) {
		t.Fatalf("decision %+v", d)
	}
	x.Close()
	h.idle(t)
}

// Each identity source reaches selection with the input length it implies,
// and the documented precedence holds.
func TestIdentitySources(t *testing.T) {
	text400 := strings.Repeat("abcd", 100) // 400 bytes: 100 tokens estimated
	cases := []struct {
		name    string
		headers []envoysim.Header
		body    string
		wantISL uint64
	}{
		{"header hashes", []envoysim.Header{{Key: extproc.HeaderBlockHashes, Value: "11,22,-33"}, {Key: extproc.HeaderSequenceHashes, Value: "11,99,18446744073709551615"},
			{Key: extproc.HeaderISLTokens, Value: "13"}}, `{"model":"llama","prompt":[1,2,3,4,5,6,7,8]}`, 13},
		{"header token ids", []envoysim.Header{{Key: extproc.HeaderTokenIDs, Value: "1, 2,3,4,5,6"}}, `{"model":"llama","prompt":"` + text400 + `"}`, 6},
		{"completions prompt token ids", nil, `{"model":"llama","prompt":[1,2,3,4,5,6,7,8,9]}`, 9},
		{"completions batch of token arrays", nil, `{"model":"llama","prompt":[[1,2,3,4,5],[6,7]]}`, 5},
		{"prompt ids win over nvext token data", nil, `{"model":"llama","prompt":[1,2,3],"nvext":{"token_data":[1,2,3,4,5,6,7]}}`, 3},
		{"nvext token data", nil, `{"model":"llama","messages":[{"role":"user","content":"` + text400 + `"}],"nvext":{"token_data":[1,2,3,4,5,6,7]}}`, 7},
		{"completions prompt text", nil, `{"model":"llama","prompt":"` + text400 + `"}`, 100},
		{"completions batch of strings", nil, `{"model":"llama","prompt":["` + text400 + `","x"]}`, 100},
		{"chat messages", nil, `{"model":"llama","messages":[{"role":"user","content":"` + text400 + `"}]}`, 102}, // "user\n" + text + "\n"
		{"chat content parts", nil, `{"model":"llama","messages":[{"role":"user","content":[{"type":"text","text":"` + text400 + `"}]}]}`, 102},
		{"model from header", []envoysim.Header{{Key: extproc.HeaderModelName, Value: "llama"}}, `{"model":"other","prompt":[1,2]}`, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{})
			x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Headers: tc.headers, Body: []byte(tc.body)})
			if d.Immediate != nil {
				t.Fatalf("immediate %d %s", d.Immediate.Status, d.Immediate.Body)
			}
			var prefill uint64
			for _, l := range h.loads() {
				prefill += l.PotentialPrefillTokens
			}
			if prefill != tc.wantISL {
				t.Fatalf("booked %d prefill tokens, want %d", prefill, tc.wantISL)
			}
			x.Close()
			h.idle(t)
		})
	}
}

// Every error reaches the gateway as an immediate response with the REST
// front's {"error": ...} envelope and protocol 004's status codes.
func TestImmediateResponses(t *testing.T) {
	cases := []struct {
		name    string
		setup   setup
		req     envoysim.Request
		prebook bool
		status  int
		frag    string
	}{
		{"malformed body", setup{}, envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":`)}, false, 400, "invalid request body"},
		{"prompt of wrong type", setup{}, envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"llama","prompt":{"a":1}}`)}, false, 400, "prompt must be"},
		{"negative token id", setup{}, envoysim.Request{Modes: envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}, Body: []byte(`{"model":"llama","prompt":[1,-2]}`)}, false, 400, "token ids"},
		{"bad hash header", setup{}, envoysim.Request{Modes: envoysim.GIE, Headers: []envoysim.Header{{Key: extproc.HeaderBlockHashes, Value: "1,x"}}, Body: []byte(`{}`)}, false, 400, "x-kvselect-block-hashes"},
		{"hash path incomplete", setup{}, envoysim.Request{Modes: envoysim.GIE, Headers: []envoysim.Header{{Key: extproc.HeaderBlockHashes, Value: "1"}}, Body: []byte(`{"model":"llama"}`)}, false, 400, "sequence_hashes is required"},
		{"body too large", setup{opts: extproc.Options{MaxBodyBytes: 100}}, envoysim.Request{Modes: envoysim.GIE, Body: bytes.Repeat([]byte("x"), 101)}, false, 413, "exceeds"},
		{"no workers", setup{workers: []catalog.Record{}}, envoysim.Request{Modes: envoysim.GIE, Body: chatBody("hi", false)}, false, 503, "no schedulable workers"},
		{"unknown model", setup{}, envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"nope","prompt":"hi"}`)}, false, 503, "model=nope"},
		{"subset hint excludes all", setup{}, envoysim.Request{Modes: envoysim.GIE, Body: chatBody("hi", false), SubsetHint: []string{"10.9.9.9:8000"}}, false, 503, "subset hint"},
		{"empty subset hint", setup{}, envoysim.Request{Modes: envoysim.GIE, Body: chatBody("hi", false), SubsetHint: []string{}}, false, 503, "subset hint"},
		{"overloaded", setup{router: func(c *routerconfig.Config) { c.ActivePrefillTokensThreshold = routerconfig.Some(1) }},
			envoysim.Request{Modes: envoysim.GIE, Body: chatBody("hello world, a prompt", false)}, true, 429, "overloaded"},
		{"selection id in use", setup{}, envoysim.Request{Modes: envoysim.GIE, Headers: []envoysim.Header{{Key: extproc.HeaderSelectionID, Value: "dup"}}, Body: chatBody("hi", false)}, true, 409, "already reserved"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.setup)
			if tc.prebook {
				// Book every worker (overload), or the id "dup".
				for i := range 4 {
					req := &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("occupy "+strconv.Itoa(i)+strings.Repeat(" padding", 10), false)}
					if i == 0 {
						req.Headers = []envoysim.Header{{Key: extproc.HeaderSelectionID, Value: "dup"}}
					}
					x, d := h.start(t, req)
					if d.Immediate != nil {
						break // the overload case rejects once all are busy
					}
					defer x.Close()
				}
			}
			_, d := h.start(t, &tc.req)
			im := d.Immediate
			if im == nil {
				t.Fatalf("no immediate response; routed to %q", d.Destination)
			}
			var env struct {
				Error string `json:"error"`
			}
			if im.Status != tc.status || im.Headers["content-type"] != "application/json" || json.Unmarshal(im.Body, &env) != nil || !strings.Contains(env.Error, tc.frag) {
				t.Fatalf("immediate %d %v %s, want %d with error containing %q", im.Status, im.Headers, im.Body, tc.status, tc.frag)
			}
		})
	}
}

// A body over the limit is answered with a 413 and nothing else: the
// request is neither picked nor booked, in both modes that buffer the body
// (the immediate response once let the last chunk go on to a pick).
func TestOversizedBodyIsNotRouted(t *testing.T) {
	for _, modes := range []envoysim.Modes{envoysim.GIE, {Request: envoysim.Buffered, Response: envoysim.Buffered}} {
		t.Run(modes.Request.String(), func(t *testing.T) {
			h := start(t, setup{opts: extproc.Options{MaxBodyBytes: 100}})
			// The header names a model with workers: only the size refuses it.
			_, d := h.start(t, &envoysim.Request{Modes: modes, Headers: []envoysim.Header{{Key: extproc.HeaderModelName, Value: model}},
				Body: bytes.Repeat([]byte(" "), 101)})
			if d.Immediate == nil || d.Immediate.Status != 413 {
				t.Fatalf("decision %+v, want a 413 immediate response", d)
			}
			h.idle(t)
			wantSeries(t, h.srv, map[string]float64{
				"kvselect_extproc_routed_total":                          0,
				"kvselect_extproc_pick_duration_seconds_count":           0,
				"kvselect_extproc_immediate_responses_total{code=413}":   1,
				"kvselect_extproc_immediate_responses_total{code=other}": 0,
				"kvselect_extproc_bookings_freed_total{at=stream_end}":   0,
				"kvselect_extproc_stream_errors_total":                   0,
			})
		})
	}
}

// A client-chosen x-request-id that is already booked does not fail the
// request: the booking gets its own id.
func TestDuplicateRequestIDGetsItsOwnBooking(t *testing.T) {
	h := start(t, setup{})
	hdr := []envoysim.Header{{Key: "x-request-id", Value: "same"}}
	x1, d1 := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Headers: hdr, Body: chatBody("one", false)})
	x2, d2 := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Headers: hdr, Body: chatBody("two", false)})
	if d1.Immediate != nil || d2.Immediate != nil {
		t.Fatal("duplicate x-request-id was rejected")
	}
	if d1.SetHeaders[extproc.HeaderSelectionID] != "same" || d2.SetHeaders[extproc.HeaderSelectionID] == "same" {
		t.Fatalf("selection ids %q and %q", d1.SetHeaders[extproc.HeaderSelectionID], d2.SetHeaders[extproc.HeaderSelectionID])
	}
	if h.activeRequests() != 2 {
		t.Fatalf("%d active requests, want 2", h.activeRequests())
	}
	x1.Close()
	x2.Close()
	h.idle(t)
}

// The response lifecycle: the first body chunk completes the prefill, every
// block_size streamed tokens add an output block, the end frees.
func TestResponseLifecycleDrivesTheBooking(t *testing.T) {
	h := start(t, setup{})
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"llama","stream":true,"prompt":[1,2,3,4,5,6,7,8]}`)})
	w, _ := strconv.ParseUint(workerIDOf(d), 10, 64)
	if l := h.loads()[w]; l.PotentialPrefillTokens != 8 || l.PotentialDecodeBlocks != 2 {
		t.Fatalf("after the pick: %+v", l)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: sseHeaders()}, false); err != nil {
		t.Fatal(err)
	}
	chunks := sseChunks(10) // 10 tokens: 2 output blocks of 4
	for _, c := range chunks[:9] {
		if _, err := x.ResponseBody(c, false); err != nil {
			t.Fatal(err)
		}
	}
	// FULL_DUPLEX_STREAMED does not wait for the processor: poll.
	eventually(t, "prefill complete and 2 output blocks after 9 tokens", func() bool {
		l := h.loads()[w]
		return l.PotentialPrefillTokens == 0 && l.PotentialDecodeBlocks == 4 && l.ActiveRequests == 1
	})
	// usage.completion_tokens overrides the event count.
	if _, err := x.ResponseBody([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":16}}\n\n"), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "usage of 16 tokens to make 4 output blocks", func() bool { return h.loads()[w].PotentialDecodeBlocks == 6 })
	if _, err := x.ResponseBody(chunks[10], true); err != nil {
		t.Fatal(err)
	}
	if h.activeRequests() != 0 {
		t.Fatal("the end of the response did not free the booking")
	}
	x.Close()
	h.idle(t)
}

// gRPC backends end with trailers; a response without body ends at headers.
func TestResponseTrailersAndBodilessResponsesFree(t *testing.T) {
	h := start(t, setup{})
	x, _ := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("grpc", false)})
	if _, err := x.ResponseHeaders(envoysim.Response{}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := x.ResponseBody([]byte("partial"), false); err != nil {
		t.Fatal(err)
	}
	if err := x.ResponseTrailers([]envoysim.Header{{Key: "grpc-status", Value: "0"}}); err != nil {
		t.Fatal(err)
	}
	if h.activeRequests() != 0 {
		t.Fatal("trailers did not free the booking")
	}
	x.Close()

	x, _ = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("204", false)})
	if _, err := x.ResponseHeaders(envoysim.Response{Status: 204}, true); err != nil {
		t.Fatal(err)
	}
	if h.activeRequests() != 0 {
		t.Fatal("a body-less response did not free the booking")
	}
	x.Close()
	h.idle(t)
}

// The subset hint restricts the pick, as a list or a comma string, matching
// ip:port exactly and a bare ip on any port.
func TestSubsetHint(t *testing.T) {
	ws := append(fourWorkers(), worker(5, "10.0.0.1:8001"), worker(6, "[fd00::6]:8000"))
	h := start(t, setup{workers: ws})
	comma := "10.0.0.9:8000, 10.0.0.1:8001"
	cases := []struct {
		name   string
		req    envoysim.Request
		accept []string
	}{
		{"list with port", envoysim.Request{SubsetHint: []string{"10.0.0.1:8001"}}, []string{"10.0.0.1:8001"}},
		{"comma string", envoysim.Request{SubsetHintString: &comma}, []string{"10.0.0.1:8001"}},
		{"bare ip matches every port", envoysim.Request{SubsetHint: []string{"10.0.0.1"}}, []string{"10.0.0.1:8000", "10.0.0.1:8001"}},
		{"ipv6", envoysim.Request{SubsetHint: []string{"[fd00::6]:8000"}}, []string{"[fd00::6]:8000"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 8 {
				req := tc.req
				req.Modes = envoysim.GIE
				req.Body = chatBody("subset "+strconv.Itoa(i), false)
				x, d := h.start(t, &req)
				if d.Immediate != nil {
					t.Fatalf("immediate %d %s", d.Immediate.Status, d.Immediate.Body)
				}
				if !contains(tc.accept, d.Endpoint) {
					t.Fatalf("picked %s outside the subset %v", d.Endpoint, tc.accept)
				}
				if contains(d.RemovedHeaders, envoysim.KeySubset) == false {
					t.Fatalf("subset header not stripped: removed %v", d.RemovedHeaders)
				}
				x.Close()
			}
		})
	}
	h.idle(t)
}

// Fallbacks follow the primary in cost order; when the gateway reports that
// a fallback served the request, the booking moves there.
func TestFallbacksAndServedEndpointMovesTheBooking(t *testing.T) {
	h := start(t, setup{opts: extproc.Options{Fallbacks: 2}})
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"llama","prompt":[1,2,3,4,5,6,7,8]}`)})
	if len(d.Fallbacks) != 2 || contains(d.Fallbacks, d.Endpoint) || d.Fallbacks[0] == d.Fallbacks[1] {
		t.Fatalf("destination %q: want a primary and two distinct fallbacks", d.Destination)
	}
	if d.MetadataDestination != d.Destination {
		t.Fatalf("metadata %q != header %q", d.MetadataDestination, d.Destination)
	}
	primary, _ := strconv.ParseUint(workerIDOf(d), 10, 64)
	fb := d.Fallbacks[1]
	fbID, _ := strconv.ParseUint(fb[len("10.0.0."):len("10.0.0.")+1], 10, 64)
	if _, err := x.ResponseHeaders(envoysim.Response{Served: fb}, false); err != nil {
		t.Fatal(err)
	}
	l := h.loads()
	if l[primary].ActiveRequests != 0 || l[fbID].ActiveRequests != 1 || l[fbID].PotentialPrefillTokens != 8 {
		t.Fatalf("booking did not move from %d to %d: %+v", primary, fbID, l)
	}
	if n := metricstest.Series(t, h.srv)["kvselect_extproc_rebooked_total"]; n != 1 {
		t.Fatalf("kvselect_extproc_rebooked_total = %v, want 1", n)
	}
	if _, err := x.ResponseBody([]byte("{}"), true); err != nil {
		t.Fatal(err)
	}
	x.Close()
	h.idle(t)
}

// A served address that several ranks share (a data-parallel worker's) does
// not say which rank carries the request: the booking stays where selection
// put it, and no move is counted.
func TestServedAddressOfADataParallelWorkerLeavesTheBooking(t *testing.T) {
	dp := worker(1, "10.0.0.1:8000")
	dp.DataParallelSize = ptr(uint32(2))
	ws := append([]catalog.Record{dp}, fourWorkers()[1:]...)
	h := start(t, setup{workers: ws})
	// The subset hint puts the booking on worker 2, with no fallbacks.
	x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, SubsetHint: []string{"10.0.0.2:8000"},
		Body: []byte(`{"model":"llama","stream":true,"prompt":[1,2,3,4,5,6,7,8]}`)})
	if d.Immediate != nil || d.Destination != "10.0.0.2:8000" {
		t.Fatalf("decision %q (immediate %+v), want 10.0.0.2:8000 alone", d.Destination, d.Immediate)
	}
	before := h.svc.Inspect().Loads(nil, nil)
	if l := h.loads()[2]; l.ActiveRequests != 1 || l.PotentialPrefillTokens != 8 {
		t.Fatalf("worker 2 after the pick: %+v", l)
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Served: "10.0.0.1:8000", Headers: sseHeaders()}, false); err != nil {
		t.Fatal(err)
	}
	if after := h.svc.Inspect().Loads(nil, nil); !reflect.DeepEqual(after, before) {
		t.Fatalf("loads changed when the served address named two ranks:\nbefore %+v\nafter  %+v", before, after)
	}
	if n := metricstest.Series(t, h.srv)["kvselect_extproc_rebooked_total"]; n != 0 {
		t.Fatalf("kvselect_extproc_rebooked_total = %v, want 0", n)
	}
	// The booking is still the stream's: the response's end frees it.
	for i, c := range sseChunks(2) {
		if _, err := x.ResponseBody(c, i == 2); err != nil {
			t.Fatal(err)
		}
	}
	if h.activeRequests() != 0 {
		t.Fatal("the response end did not free the booking that stayed")
	}
	if n := metricstest.Series(t, h.srv)["kvselect_extproc_bookings_freed_total{at=response_end}"]; n != 1 {
		t.Fatalf("freed at response end %v, want 1", n)
	}
	x.Close()
	h.idle(t)
}

// The GIE conformance hook: off by default; on, the header restricts the pick
// (winning over the subset hint) and responses report the served endpoint.
func TestTestPickHeader(t *testing.T) {
	pick := []envoysim.Header{{Key: extproc.HeaderTestPick, Value: "10.0.0.3"}}
	off := start(t, setup{})
	seen := map[string]bool{}
	for i := range 12 {
		x, d := off.start(t, &envoysim.Request{Modes: envoysim.GIE, Headers: pick, Body: chatBody("off "+strconv.Itoa(i)+strings.Repeat(" pad", 20), false)})
		seen[d.Endpoint] = true
		if _, ok := d.SetHeaders[extproc.HeaderEchoSetHeader]; ok {
			t.Fatal("conformance echo header set with the hook off")
		}
		defer x.Close()
	}
	if len(seen) < 2 {
		t.Fatalf("with the hook off the header must be ignored; every pick went to %v", seen)
	}

	on := start(t, setup{opts: extproc.Options{TestPickHeader: true}})
	for i := range 6 {
		x, d := on.start(t, &envoysim.Request{Modes: envoysim.GIE, Headers: pick, SubsetHint: []string{"10.0.0.1:8000"}, Body: chatBody("on "+strconv.Itoa(i), false)})
		if d.Endpoint != "10.0.0.3:8000" {
			t.Fatalf("picked %q, want the test-selected 10.0.0.3:8000", d.Endpoint)
		}
		if d.SetHeaders[extproc.HeaderEchoSetHeader] != extproc.HeaderTestServed+":10.0.0.3:8000" {
			t.Fatalf("echo header %q", d.SetHeaders[extproc.HeaderEchoSetHeader])
		}
		res, err := x.ResponseHeaders(envoysim.Response{Served: "10.0.0.3:8000"}, false)
		if err != nil {
			t.Fatal(err)
		}
		if res.SetHeaders[extproc.HeaderTestServed] != "10.0.0.3:8000" {
			t.Fatalf("served header %q", res.SetHeaders[extproc.HeaderTestServed])
		}
		x.Close()
	}
	x, _ := on.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("no lb metadata", false)})
	res, err := x.ResponseHeaders(envoysim.Response{NoLBMetadata: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.SetHeaders[extproc.HeaderTestServed] != "fail: missing envoy lb metadata" {
		t.Fatalf("served header without metadata: %q", res.SetHeaders[extproc.HeaderTestServed])
	}
	x.Close()
	on.idle(t)
}

// In the modes with one response per message, the picker never sends more
// (envoysim fails on any extra or out-of-order message); a received message
// log shows the exact sequence.
func TestBufferedModeMessageSequence(t *testing.T) {
	h := start(t, setup{})
	x, _ := h.start(t, &envoysim.Request{Modes: envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}, Body: chatBody("seq", false)})
	finish(t, x, "", [][]byte{[]byte(`{"choices":[]}`)})
	var kinds []string
	for _, r := range x.Received() {
		switch r.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			kinds = append(kinds, "request_headers")
		case *extprocv3.ProcessingResponse_RequestBody:
			kinds = append(kinds, "request_body")
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			kinds = append(kinds, "response_headers")
		case *extprocv3.ProcessingResponse_ResponseBody:
			kinds = append(kinds, "response_body")
		default:
			kinds = append(kinds, "other")
		}
	}
	if got := strings.Join(kinds, ","); got != "request_headers,request_body,response_headers,response_body" {
		t.Fatalf("message sequence %s", got)
	}
	h.idle(t)
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// A stream carries one request: a second request-headers message is a
// stream error, and the first request's booking is still freed.
func TestSecondRequestOnAStreamIsRejected(t *testing.T) {
	h := start(t, setup{opts: extproc.Options{DefaultModel: model}})
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/models")}}}, EndOfStream: true}}}
	if err := st.Send(hdrs); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetRequestHeaders() == nil {
		t.Fatalf("first request: %v %v", r, err)
	}
	if h.activeRequests() != 1 {
		t.Fatal("the first request was not booked")
	}
	_ = st.Send(hdrs)
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("second request headers: %v, want InvalidArgument", err)
	}
	h.idle(t)
}

// Session affinity comes from the session header (or nvext's session id): a
// session's requests stay on the worker its first request got.
func TestSessionHeaderKeepsTheSessionOnItsWorker(t *testing.T) {
	h := start(t, setup{router: func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) }})
	first := ""
	for i := range 8 {
		req := &envoysim.Request{Modes: envoysim.GIE, Body: chatBody("turn "+strconv.Itoa(i)+strings.Repeat(" x", i*50), false),
			Headers: []envoysim.Header{{Key: extproc.HeaderSessionID, Value: "conversation-1"}}}
		if i%2 == 1 {
			// The same session named in Dynamo's nvext instead of the header.
			req.Headers = nil
			req.Body = []byte(`{"model":"llama","prompt":"turn ` + strconv.Itoa(i) + `","nvext":{"session_control":{"session_id":"conversation-1"}}}`)
		}
		x, d := h.start(t, req)
		if first == "" {
			first = d.Endpoint
		}
		if d.Endpoint != first {
			t.Fatalf("request %d of the session went to %s, its first to %s", i, d.Endpoint, first)
		}
		x.Close()
		h.idle(t)
	}
}

// The picker hands each response status to the passive health checks: five
// 5xx answers from one worker eject it, and the picks go elsewhere.
func TestServerErrorsEjectTheWorker(t *testing.T) {
	h := start(t, setup{})
	var bad uint64
	for i := range 5 {
		req := &envoysim.Request{Modes: envoysim.GIE, Body: chatBody(fmt.Sprint("fail ", i), false)}
		if bad != 0 {
			req.SubsetHint = []string{fmt.Sprintf("10.0.0.%d:8000", bad)}
		}
		x, d := h.start(t, req)
		w, _ := strconv.ParseUint(workerIDOf(d), 10, 64)
		bad = w
		if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Status: 503}, true); err != nil {
			t.Fatal(err)
		}
		x.Close()
	}
	eventually(t, "the worker ejected", func() bool {
		return h.svc.Inspect().WorkerHealth(bad) != nil && h.svc.Inspect().WorkerHealth(bad).State == selection.HealthEjected
	})
	for i := range 20 {
		x, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: chatBody(fmt.Sprint("after ", i), false)})
		if w, _ := strconv.ParseUint(workerIDOf(d), 10, 64); w == bad {
			t.Fatalf("request %d routed to ejected worker %d", i, bad)
		}
		if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Status: 200}, true); err != nil {
			t.Fatal(err)
		}
		x.Close()
	}
	h.idle(t)
}
