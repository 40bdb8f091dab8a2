package rest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// GET /health is pure liveness: 200 {"status":"ok"} whatever the catalog holds.
func TestHealthIsLiveness(t *testing.T) {
	s := conformance(t)
	s.get(t, "/health").wantOK(t)
}

// An unknown route is a JSON 404 {"error":"route not found"}, not the framework's plain text.
func TestUnknownRouteReturns404Envelope(t *testing.T) {
	s := conformance(t)
	for _, c := range []struct{ method, path string }{
		{"GET", "/no-such-route"},
		{"POST", "/select/extra"},
		{"GET", "/loads/extra"},
		{"POST", "/register"},
	} {
		t.Run(c.method+c.path, func(t *testing.T) {
			r := s.do(t, c.method, c.path, obj{})
			if got := r.wantError(t, http.StatusNotFound); got != "route not found" {
				t.Fatalf(`want {"error":"route not found"}: %v`, r)
			}
		})
	}
}

// A known path with the wrong method is a JSON 405 {"error":"method not allowed"}.
func TestWrongMethodReturns405Envelope(t *testing.T) {
	s := conformance(t)
	for _, c := range []struct{ method, path string }{
		{"GET", "/select"},
		{"GET", "/select_and_reserve"},
		{"GET", "/reservations"},
		{"GET", "/reservations/x/prefill_complete"},
		{"PUT", "/workers"},
		{"PUT", "/workers/1"},
		{"DELETE", "/health"},
		{"POST", "/ready"},
		{"POST", "/loads"},
		{"GET", "/potential_loads"},
		{"GET", "/overlap_scores"},
		{"POST", "/dump"},
		{"POST", "/replica_sync/peers"},
		{"GET", "/replica_sync/register_peer"},
	} {
		t.Run(c.method+c.path, func(t *testing.T) {
			r := s.do(t, c.method, c.path, nil)
			if got := r.wantError(t, http.StatusMethodNotAllowed); got != "method not allowed" {
				t.Fatalf(`want {"error":"method not allowed"}: %v`, r)
			}
		})
	}
}

// JSON routes require Content-Type: application/json (415 otherwise, axum's rule).
func TestMissingContentTypeReturns415(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	body := []byte(fmt.Sprintf(`{"model_name":%q,"token_ids":[1,2,3,4]}`, model))
	for _, c := range []struct {
		name, path, contentType string
	}{
		{"select/none", "/select", ""},
		{"select/text-plain", "/select", "text/plain"},
		{"select_and_reserve/form", "/select_and_reserve", "application/x-www-form-urlencoded"},
		{"reservations/none", "/reservations", ""},
		{"workers/none", "/workers", ""},
		{"output_block/none", "/reservations/conf-none/output_block", ""},
		{"register_peer/none", "/replica_sync/register_peer", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.do(t, "POST", c.path, rawBody{c.contentType, body}).
				wantError(t, http.StatusUnsupportedMediaType, "Content-Type")
		})
	}
	t.Run("charset parameter accepted", func(t *testing.T) {
		r := s.do(t, "POST", "/select", rawBody{"application/json; charset=utf-8", body})
		if r.status == http.StatusUnsupportedMediaType {
			t.Fatalf("application/json with a charset parameter must be accepted: %v", r)
		}
	})
}

// Syntactically broken JSON, an empty body included, is a 400 with axum's parse text.
func TestMalformedJSONReturns400(t *testing.T) {
	s := conformance(t)
	for _, c := range []struct{ name, path, body string }{
		{"truncated", "/select", `{"model_name":`},
		{"empty", "/select", ``},
		{"garbage", "/select_and_reserve", `not json`},
		{"trailing comma", "/reservations", `{"selection_id":"x",}`},
		{"workers", "/workers", `{`},
		{"overlap_scores", "/overlap_scores", `[1,`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.do(t, "POST", c.path, rawBody{"application/json", []byte(c.body)}).
				wantError(t, http.StatusBadRequest, "Failed to parse the request body as JSON")
		})
	}
}

// Well-formed JSON of the wrong shape (a missing required field, a wrong type, a negative
// u64, a hash beyond i64, an invalid enum or router_config_override value) is a 422 with
// axum's deserialize text; unknown fields are never rejected (no request type denies them).
func TestWrongShapeReturns422(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	for _, c := range []struct {
		name, path string
		body       string
		mentions   string
	}{
		{"reservation without selection_id", "/reservations",
			fmt.Sprintf(`{"model_name":%q,"worker_id":1}`, model), "selection_id"},
		{"worker without worker_id", "/workers", fmt.Sprintf(`{"model_name":%q}`, model), "worker_id"},
		{"negative worker_id", "/workers", `{"worker_id":-1}`, ""},
		{"string worker_id", "/workers", `{"worker_id":"7"}`, ""},
		{"array body", "/select", `[]`, ""},
		{"negative token id", "/select", fmt.Sprintf(`{"model_name":%q,"token_ids":[-1]}`, model), ""},
		{"block hash beyond i64", "/select",
			fmt.Sprintf(`{"model_name":%q,"block_hashes":[9223372036854775808],"sequence_hashes":[1],"isl_tokens":4}`, model), ""},
		{"bad input_trigger", "/select",
			fmt.Sprintf(`{"model_name":%q,"token_ids":[1,2,3,4],"session_context":{"session_id":"s","input_trigger":"bogus"}}`, model), ""},
		{"session_context without session_id", "/select",
			fmt.Sprintf(`{"model_name":%q,"token_ids":[1,2,3,4],"session_context":{}}`, model), ""},
		{"negative router_temperature", "/select_and_reserve",
			fmt.Sprintf(`{"model_name":%q,"token_ids":[1,2,3,4],"router_config_override":{"router_temperature":-1}}`, model), ""},
		{"shared_cache_multiplier above 1", "/potential_loads",
			fmt.Sprintf(`{"model_name":%q,"token_ids":[1,2,3,4],"router_config_override":{"shared_cache_multiplier":2}}`, model), ""},
		{"peer endpoint not a string", "/replica_sync/register_peer", `{"endpoint":5}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := s.do(t, "POST", c.path, rawBody{"application/json", []byte(c.body)}).
				wantError(t, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body into the target type")
			if c.mentions != "" && !strings.Contains(msg, c.mentions) {
				t.Fatalf("422 text %q does not mention %q", msg, c.mentions)
			}
		})
	}
	t.Run("unknown fields ignored", func(t *testing.T) {
		// A partition without workers: the body must get past decoding to /select's 503.
		r := s.post(t, "/select", obj{"model_name": model, "token_ids": tokens(1, 4), "tenant_id": "x", "no_such_field": []int{1}})
		r.wantError(t, http.StatusServiceUnavailable, "no schedulable workers")
	})
}

// Every route limits request bodies to 8 MiB (Dynamo's REQUEST_BODY_LIMIT_BYTES).
func TestOversizedBodyReturns413(t *testing.T) {
	s := conformance(t)
	model := s.model(t)
	// Valid JSON padded through an unknown field, so only the size can make it fail.
	padded := func(size int) []byte {
		head := fmt.Sprintf(`{"model_name":%q,"pad":"`, model)
		tail := `"}`
		return append(append([]byte(head), bytes.Repeat([]byte("a"), size-len(head)-len(tail))...), tail...)
	}
	for _, path := range []string{"/select", "/workers", "/reservations"} {
		t.Run("9MiB"+path, func(t *testing.T) {
			s.postOversized(t, path, padded(9<<20)).wantError(t, http.StatusRequestEntityTooLarge)
		})
	}
	t.Run("just under 8MiB is accepted", func(t *testing.T) {
		r := s.do(t, "POST", "/select", rawBody{"application/json", padded(bodyLimit - 4096)})
		// No worker in this partition: decoding succeeded iff the service got to /select's 503.
		r.wantError(t, http.StatusServiceUnavailable, "no schedulable workers")
	})
}

// {worker_id} is a u64 path parameter; a non-numeric one is the framework's 400
// (plain text, not necessarily the JSON envelope).
func TestNonNumericWorkerIDReturns400(t *testing.T) {
	s := conformance(t)
	for _, c := range []struct {
		method string
		body   any
	}{{"DELETE", nil}, {"PATCH", obj{"endpoint": "http://x:1"}}} {
		for _, id := range []string{"abc", "-1", "18446744073709551616"} {
			t.Run(c.method+"/"+id, func(t *testing.T) {
				s.do(t, c.method, "/workers/"+id, c.body).want(t, http.StatusBadRequest)
			})
		}
	}
}

// postOversized POSTs a body larger than the limit so that the answer is read whatever the
// server does: it asks for `Expect: 100-continue`, so a server that rejects on Content-Length
// answers before any body byte is sent; a server that reads up to the limit gets the body
// (after its 100 Continue, or after a pause if it ignores Expect) written concurrently with
// reading the answer, so an early 413 is not lost to a failed write as it can be with
// net/http's client.
func (s *server) postOversized(t *testing.T, path string, body []byte) *reply {
	t.Helper()
	u, err := url.Parse(s.base)
	if err != nil || u.Scheme != "http" {
		return s.doWith(t, s.expect, "POST", path, rawBody{"application/json", body}, http.Header{"Expect": {"100-continue"}})
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	conn, err := net.DialTimeout("tcp", host, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", host, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	fullPath := strings.TrimRight(u.Path, "/") + path
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n", fullPath, u.Host, len(body)); err != nil {
		t.Fatalf("write request head: %v", err)
	}
	type answer struct {
		status int
		header http.Header
		body   []byte
		err    error
	}
	answers := make(chan answer, 1)
	br := bufio.NewReader(conn)
	go func() {
		for {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			data, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header, data, err}
			if resp.StatusCode != http.StatusContinue {
				return
			}
		}
	}()
	var once sync.Once
	sendBody := func() { once.Do(func() { go conn.Write(body) }) } // errors: the server may stop reading
	timer := time.NewTimer(2 * time.Second)
	defer timer.Stop()
	for {
		select {
		case a := <-answers:
			if a.err != nil {
				t.Fatalf("POST %s with a %d-byte body: no answer: %v", path, len(body), a.err)
			}
			if a.status == http.StatusContinue {
				sendBody()
				continue
			}
			return &reply{method: "POST", path: path, status: a.status, header: a.header, body: a.body}
		case <-timer.C:
			sendBody()
		}
	}
}
