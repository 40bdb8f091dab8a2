package httpadmin

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestStatusPageAssets(t *testing.T) {
	srv := httptest.NewServer(New(newService(t, nil), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/ui/", "text/html", `<script src="app.js"`},
		{"/ui/app.js", "javascript", "api/status"},
		{"/ui/style.css", "text/css", "font"},
	} {
		res, body := get("GET", tc.path)
		if res.StatusCode != http.StatusOK || !strings.Contains(res.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: %d %s, %d bytes", tc.path, res.StatusCode, res.Header.Get("Content-Type"), len(body))
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q", tc.path, csp)
		}
	}
	// The page is the only path that keeps its trailing slash; everything
	// else non-canonical is still a 404.
	for _, tc := range []struct {
		method, path string
		status       int
	}{{"GET", "/ui/nope.js", 404}, {"GET", "/loads/", 404}, {"GET", "/ui", 200 /* redirected to /ui/ */}, {"POST", "/ui/", 405}} {
		if res, body := get(tc.method, tc.path); res.StatusCode != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, res.StatusCode, body, tc.status)
		}
	}
}

func TestStatusDocument(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.addWorker(2)
	a.do("POST", "/select_and_reserve", map[string]any{"model_name": "model", "token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "selection_id": "s-1"}).want(t, 200, "")
	a.do("POST", "/select", map[string]any{"model_name": "model", "token_ids": []int{1, 2, 3, 4}}).want(t, 200, "")

	r := a.do("GET", "/ui/api/status", nil).want(t, 200, "")
	if n := len(r.at("workers").([]any)); n != 2 {
		t.Errorf("%d workers, want 2", n)
	}
	ds := r.at("decisions").([]any)
	if len(ds) != 2 || r.at("decisions", 1, "selection_id") != "s-1" || r.at("decisions", 0, "op") != "select" {
		t.Errorf("decisions %v, want the select then s-1, newest first", ds)
	}
	if r.num("decisions", 1, "candidates") != 2 || r.at("decisions", 1, "runner_up") == nil || r.num("decisions", 1, "isl_tokens") != 8 {
		t.Errorf("decision s-1: %v", r.at("decisions", 1))
	}
	if r.num("routing", 0, "decisions") != 2 || r.num("routing", 0, "prompt_tokens") != 12 {
		t.Errorf("routing %v, want 2 decisions over 12 prompt tokens", r.at("routing"))
	}
	// The select's 4 tokens are the prefix s-1 booked: some rank had them.
	if r.num("decisions", 0, "best_cached_tokens") != 4 || r.num("routing", 0, "best_cached_tokens") < r.num("routing", 0, "cached_tokens") {
		t.Errorf("best cached: decision %v, routing %v", r.at("decisions", 0), r.at("routing"))
	}
	if r.at("replica_sync") != false || r.at("collector") != nil || len(r.at("peers").([]any)) != 0 {
		t.Errorf("replica sync %v, collector %v, peers %v: want off, null, []", r.at("replica_sync"), r.at("collector"), r.at("peers"))
	}
	if r := a.do("GET", "/ui/api/status?decisions=1", nil).want(t, 200, ""); len(r.at("decisions").([]any)) != 1 {
		t.Errorf("decisions=1 gave %v", r.at("decisions"))
	}
	a.do("GET", "/ui/api/status?decisions=-1", nil).want(t, http.StatusBadRequest, "decisions")
}

// TestStatusPageNeedsTheReadScope: with authentication on, the page's data
// is behind the read scope like every other GET; its static files, which
// carry none, load without a token so that a browser can ask for one.
func TestStatusPageNeedsTheReadScope(t *testing.T) {
	srv := startTokenServer(t, "read-token-0123456789abcdef read name=ops\nselect-token-0123456789abcd select name=ray\n")
	for p, wants := range map[string]map[string]int{
		"/ui/":           {"": 200, "read-token-0123456789abcdef": 200},
		"/ui/app.js":     {"": 200},
		"/ui/api/status": {"": 401, "select-token-0123456789abcd": 403, "read-token-0123456789abcdef": 200},
	} {
		for token, want := range wants {
			req, _ := http.NewRequest("GET", srv.URL+p, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != want {
				t.Errorf("GET %s with %q: %d, want %d", p, token, res.StatusCode, want)
			}
		}
	}
}
