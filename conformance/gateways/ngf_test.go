package gateways

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/ngf"
	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/internal/proctest"
)

// epp.js turns every answer of the shim that is not a 200 naming an endpoint
// into an error-log line and an internal redirect with
// $inference_workload_endpoint unset; NGINX's proxy_pass to "http://" then
// answers the client 500. So the picker's immediate responses and its absence
// reach the client as NGINX's own 500 page, never as the picker's status, and
// the shim's status and body are only in NGINX's error log, in this line.
const ngfRefusal = "js: could not get specific inference endpoint from EndpointPicker; status: "

// TestNGFRoutesToThePickedWorker: every request through NGINX is served by the
// worker kvselect's decision names (its routing record, and the worker's own
// x-kvselect-worker-id response header), and a streamed completion arrives
// event by event, whole, ending in [DONE].
func TestNGFRoutesToThePickedWorker(t *testing.T) {
	dir := needNGF(t)
	k := newKvselect(t, nil)
	const decode = 20 * time.Millisecond
	k.start()
	startMockWorkers(t, k, 2, decode)
	k.schedulable(2)
	g := startGateway(t, dir, k.extproc())

	served := map[string]int{}
	for i := range 6 {
		stream := i%2 == 1
		n := len(k.decisions())
		if !stream {
			a := post(t, g.url, completion(prompt(i, 40), 4, false))
			d := k.decisionAfter(n)
			wantServedBy(t, a, d)
			served[a.header.Get("X-Kvselect-Worker-Id")]++
			continue
		}
		const tokens = 20
		events, gap := streamThrough(t, g.url, completion(prompt(i, 40), tokens, true))
		d := k.decisionAfter(n)
		if events.workerID != strconv.FormatUint(d.workerID, 10) {
			t.Fatalf("stream %d: kvselect routed to worker %d (%s), worker %q served", i, d.workerID, d.destination, events.workerID)
		}
		if len(events.texts) != tokens || events.finish != "length" || !events.done {
			t.Fatalf("stream %d: %d text events (want %d), finish %q, [DONE] %v", i, len(events.texts), tokens, events.finish, events.done)
		}
		// The worker spends decode on every token: a proxy that buffered
		// the stream would deliver the first event with the last.
		if gap < tokens/2*decode {
			t.Fatalf("stream %d: first to last event %v apart, want at least %v: NGINX buffered the stream", i, gap, tokens/2*decode)
		}
		served[events.workerID]++
	}
	t.Logf("requests served per worker: %v", served)
}

// TestNGFOverTLS: NGF's shim dials the picker over TLS by default (without
// verifying its certificate, cmd/gateway/endpoint_picker.go), a handshake
// per request; kvselect serving --extproc-secure-serving routes through it
// as in plaintext, and a shim speaking plaintext to it gets no decision
// (NGINX's 500).
func TestNGFOverTLS(t *testing.T) {
	dir := needNGF(t)
	k := newKvselect(t, []string{"--extproc-secure-serving"})
	k.start()
	startMockWorkers(t, k, 2, time.Millisecond)
	k.schedulable(2)
	g := startGatewayWith(t, ngf.Config{ShimDir: dir, ExtProc: k.extproc(), TLS: true})
	for i := range 4 {
		n := len(k.decisions())
		a := post(t, g.url, completion(prompt(100+i, 40), 4, false))
		wantServedBy(t, a, k.decisionAfter(n))
	}
	g.ngf.Stop() // NGF fixes the shim's port: one shim at a time
	plain := startGateway(t, dir, k.extproc())
	if a := post(t, plain.url, completion(prompt(200, 40), 4, false)); a.status != http.StatusInternalServerError {
		t.Fatalf("a plaintext shim against the TLS picker: %d %s, want NGINX's 500", a.status, a.body)
	}
}

func wantServedBy(t *testing.T, a answer, d decision) {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("answer %d: %s", a.status, a.body)
	}
	if got := a.header.Get("X-Kvselect-Worker-Id"); got != strconv.FormatUint(d.workerID, 10) {
		t.Fatalf("kvselect routed to worker %d (%s), worker %q served", d.workerID, d.destination, got)
	}
}

type sseEvents struct {
	workerID string
	texts    []string
	finish   string
	done     bool
}

// streamThrough sends a streamed completion and reads its SSE events as they
// arrive; gap is the time between the first and the last event.
func streamThrough(t *testing.T, url string, body []byte) (sseEvents, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream answered %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ev := sseEvents{workerID: resp.Header.Get("X-Kvselect-Worker-Id")}
	var first, last time.Time
	sc := bufio.NewScanner(resp.Body)
	id := ""
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if ev.done {
			t.Fatalf("event after [DONE]: %q", line)
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		last = now
		if data == "[DONE]" {
			ev.done = true
			continue
		}
		var chunk struct {
			ID      string `json:"id"`
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if id == "" {
			id = chunk.ID
		} else if chunk.ID != id {
			t.Fatalf("events of two completions in one stream: %q and %q", id, chunk.ID)
		}
		for _, c := range chunk.Choices {
			ev.texts = append(ev.texts, c.Text)
			if c.FinishReason != nil {
				ev.finish = *c.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return ev, last.Sub(first)
}

// TestNGFImmediateResponses: kvselect's immediate responses (400 for a body it
// cannot parse, 503 when no worker serves the model, 429 when every worker is
// busy) reach the shim with their status and JSON body, and the client gets
// what NGF's epp.js makes of them: NGINX's 500, no worker reached.
func TestNGFImmediateResponses(t *testing.T) {
	dir := needNGF(t)
	// Busy above 10 in-flight prefill tokens: two REST bookings fill both
	// workers (bookings made through NGF end with the decision).
	k := newKvselect(t, nil, "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD=10")
	k.start()
	startMockWorkers(t, k, 2, 0)
	k.schedulable(2)
	g := startGateway(t, dir, k.extproc())

	refused := func(t *testing.T, body []byte, status int, bodyPrefix string) {
		t.Helper()
		before := strings.Count(g.errorLog(t), ngfRefusal)
		a := post(t, g.url, body)
		if a.status != http.StatusInternalServerError || !strings.HasPrefix(a.header.Get("Server"), "nginx") ||
			a.header.Get("X-Kvselect-Worker-Id") != "" {
			t.Fatalf("client got %d (server %q, worker %q): %s; want NGINX's 500 and no worker",
				a.status, a.header.Get("Server"), a.header.Get("X-Kvselect-Worker-Id"), a.body)
		}
		var lines []string
		for line := range strings.SplitSeq(g.errorLog(t), "\n") {
			if _, rest, ok := strings.Cut(line, ngfRefusal); ok {
				lines = append(lines, rest)
			}
		}
		if len(lines) != before+1 {
			t.Fatalf("%d new refusals in NGINX's error log, want 1", len(lines)-before)
		}
		want := strconv.Itoa(status) + "; body: " + bodyPrefix
		if !strings.HasPrefix(lines[before], want) {
			t.Fatalf("NGINX logged the shim's answer as %q, want it to start %q", lines[before], want)
		}
	}

	t.Run("bad-body-400", func(t *testing.T) {
		refused(t, []byte(`{"model": "`+model+`", "prompt": [1, 2`), http.StatusBadRequest, `{"error":"invalid request body`)
	})
	t.Run("no-workers-503", func(t *testing.T) {
		body, _ := json.Marshal(map[string]any{"model": "a-model-nobody-serves", "prompt": prompt(1, 20)})
		refused(t, body, http.StatusServiceUnavailable, `{"error":"no schedulable workers`)
	})
	t.Run("busy-429", func(t *testing.T) {
		for i := range 2 {
			var r struct {
				WorkerID uint64 `json:"worker_id"`
			}
			if code := k.do(http.MethodPost, "/select_and_reserve", map[string]any{"model_name": model, "token_ids": prompt(100+i, 64)}, &r); code != http.StatusOK {
				t.Fatalf("select_and_reserve: %d", code)
			}
		}
		refused(t, completion(prompt(3, 64), 2, false), http.StatusTooManyRequests, `{"error":`)
	})
}

// TestNGFPrefixRoutesBack: a prefix warmed on one engine (a request sent to
// it directly) is indexed from its KV events, and a prompt extending it,
// sent through NGINX, is served by that engine from its cache — for each
// engine family.
func TestNGFPrefixRoutesBack(t *testing.T) {
	dir := needNGF(t)
	t.Run("mock-worker", func(t *testing.T) {
		k := newKvselect(t, nil)
		k.start()
		engines := startMockWorkers(t, k, 3, 0)
		k.schedulable(3)
		routesBack(t, k, startGateway(t, dir, k.extproc()), engines, true)
	})
	t.Run("llm-d-inference-sim", func(t *testing.T) {
		bin := peerproc.SimBinary(t)
		k := newKvselect(t, nil)
		k.start() // the simulators dial its collector
		var engines []engine
		var records []map[string]any
		for i := range 3 {
			logs := &peerproc.LogBuffer{}
			s, err := peerproc.StartSim(context.Background(), peerproc.Sim{Binary: bin, Model: model, Port: proctest.FreePort(t),
				ReplayPort: proctest.FreePort(t), ZMQEndpoint: k.collector, BlockSize: blockSize, Log: logs})
			if err != nil {
				t.Fatalf("%v\n%s", err, proctest.Tail(logs.String(), 3000))
			}
			t.Cleanup(func() {
				s.Stop()
				if t.Failed() {
					t.Logf("simulator %d log:\n%s", i+1, proctest.Tail(logs.String(), 2000))
				}
			})
			e := engine{id: uint64(i + 1), hostPort: s.HostPort(), replay: s.ReplayEndpoint()}
			engines = append(engines, e)
			records = append(records, e.record())
		}
		k.writeWorkers(records)
		k.schedulable(3)
		// The simulator names no worker in its answers: its cached_tokens
		// and kvselect's destination are the evidence.
		routesBack(t, k, startGateway(t, dir, k.extproc()), engines, false)
	})
}

func routesBack(t *testing.T, k *kvselect, g *gateway, engines []engine, namesItself bool) {
	t.Helper()
	const blocks = 6
	for i, e := range engines {
		prefix := prompt(50+i, blocks*blockSize)
		if a := post(t, "http://"+e.hostPort, completion(prefix, 2, false)); a.status != http.StatusOK {
			t.Fatalf("warming engine %d: %d %s", e.id, a.status, a.body)
		}
		// The simulators flush their event batches on a one-second timer.
		proctest.Eventually(t, fmt.Sprintf("engine %d's prefix indexed", e.id), 15*time.Second, func() bool { return k.overlaps(prefix)[e.id] == blocks })

		n := len(k.decisions())
		a := post(t, g.url, completion(append(prefix, prompt(90+i, 20)...), 2, false))
		d := k.decisionAfter(n)
		if d.workerID != e.id || d.destination != e.hostPort {
			t.Fatalf("a prompt extending engine %d's prefix was routed to worker %d (%s)", e.id, d.workerID, d.destination)
		}
		if a.status != http.StatusOK {
			t.Fatalf("answer %d: %s", a.status, a.body)
		}
		if namesItself {
			wantServedBy(t, a, d)
		}
		var out struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(a.body), &out); err != nil {
			t.Fatalf("answer %s: %v", a.body, err)
		}
		if out.Usage.Details.Cached != blocks*blockSize {
			t.Fatalf("engine %d served %d cached prompt tokens through NGINX, want %d", e.id, out.Usage.Details.Cached, blocks*blockSize)
		}
	}
}

// TestNGFPickerDownAndBack: with kvselect gone the shim cannot open its
// ext_proc stream (502 to epp.js) and the client gets NGINX's 500 — NGF's
// example configuration has no fallback endpoint — and once kvselect is
// back on its port, routing resumes with no change to the gateway.
func TestNGFPickerDownAndBack(t *testing.T) {
	dir := needNGF(t)
	k := newKvselect(t, nil)
	k.start()
	startMockWorkers(t, k, 2, 0)
	k.schedulable(2)
	g := startGateway(t, dir, k.extproc())

	wantServedBy(t, post(t, g.url, completion(prompt(1, 40), 2, false)), k.decisionAfter(0))

	k.kill()
	before := strings.Count(g.errorLog(t), ngfRefusal+"502; body: error opening ext_proc stream")
	if a := post(t, g.url, completion(prompt(2, 40), 2, false)); a.status != http.StatusInternalServerError || a.header.Get("X-Kvselect-Worker-Id") != "" {
		t.Fatalf("with kvselect down the client got %d (worker %q): %s; want NGINX's 500", a.status, a.header.Get("X-Kvselect-Worker-Id"), a.body)
	}
	if got := strings.Count(g.errorLog(t), ngfRefusal+"502; body: error opening ext_proc stream"); got != before+1 {
		t.Fatalf("NGINX's error log has %d new \"502 error opening ext_proc stream\" refusals, want 1", got-before)
	}

	k.start()
	k.schedulable(2)
	for i := range 4 {
		n := len(k.decisions())
		wantServedBy(t, post(t, g.url, completion(prompt(10+i, 40), 2, false)), k.decisionAfter(n))
	}
}

// TestNGFInFlightBookings: NGF never sends the response phase, and with
// --booking-end auto (the default, named here so the test says what it
// relies on) kvselect keeps each booking until the request's estimated end,
// so /loads counts the long requests in flight through NGF, and none once
// they are over.
func TestNGFInFlightBookings(t *testing.T) {
	dir := needNGF(t)
	k := newKvselect(t, []string{"--booking-end", "auto"})
	const decode = 20 * time.Millisecond
	k.start()
	startMockWorkers(t, k, 2, decode)
	k.schedulable(2)
	g := startGateway(t, dir, k.extproc())

	const inFlight, tokens = 4, 100 // two seconds each
	var wg sync.WaitGroup
	errs := make(chan error, inFlight)
	for i := range inFlight {
		wg.Go(func() {
			a, err := tryPost(g.url, completion(prompt(i, 40), tokens, true))
			if err == nil && a.status != http.StatusOK {
				err = fmt.Errorf("stream %d answered %d: %s", i, a.status, a.body)
			}
			errs <- err
		})
	}
	proctest.Eventually(t, fmt.Sprintf("/loads counting %d requests in flight", inFlight), tokens*decode, func() bool { return k.activeRequests() == inFlight })
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	proctest.Eventually(t, "/loads counting no request in flight", 15*time.Second, func() bool { return k.activeRequests() == 0 })

	// What the engines' KV events told of requests NGF never showed: each
	// one's first token (its prompt's last block stored), then its output
	// a block at a time (40 prompt tokens: the first output block is full
	// after 8 tokens, then every 16). Which of the later blocks arrive
	// before the engine counts end a booking is timing; the first of each
	// is not.
	m, err := promtext.Scrape(t.Context(), http.DefaultClient, k.rest()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Sum("kvselect_booking_first_token_error_seconds_count"); n != inFlight {
		t.Errorf("%v first tokens seen, want %d", n, inFlight)
	}
	if n := m.Sum("kvselect_booking_decode_blocks_seen_total"); n < inFlight {
		t.Errorf("%v output blocks seen, want at least one per request (%d)", n, inFlight)
	}
}

// TestNGFReadsTheDestinationFromTheHeadersResponse pins the shim's one place
// for the decision: the request-headers response. kvselect told to assume
// the BUFFERED body mode answers the headers at once and routes on the body
// response, which the shim ignores: it answers epp.js 200 without an
// endpoint, and the client gets NGINX's 500 (docs/gateways.md: keep the
// default full_duplex_streamed behind NGF).
func TestNGFReadsTheDestinationFromTheHeadersResponse(t *testing.T) {
	dir := needNGF(t)
	k := newKvselect(t, []string{"--extproc-assume-request-body-mode", "buffered"})
	k.start()
	startMockWorkers(t, k, 1, 0)
	k.schedulable(1)
	g := startGateway(t, dir, k.extproc())

	n := len(k.decisions())
	a := post(t, g.url, completion(prompt(1, 40), 2, false))
	k.decisionAfter(n) // kvselect did route, on the body response
	if a.status != http.StatusInternalServerError || a.header.Get("X-Kvselect-Worker-Id") != "" {
		t.Fatalf("client got %d (worker %q): %s; want NGINX's 500", a.status, a.header.Get("X-Kvselect-Worker-Id"), a.body)
	}
	if log := g.errorLog(t); !strings.Contains(log, ngfRefusal+"200; body: \n") {
		t.Fatalf("NGINX's error log has no \"status: 200\" refusal with an empty body:\n%s", proctest.Tail(log, 2000))
	}
}
