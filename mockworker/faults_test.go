package mockworker

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

const completionBody = `{"prompt":[1,2,3,4,5],"max_tokens":2}`

func getFaults(t *testing.T, url string) FaultStatus {
	t.Helper()
	resp, err := http.Get(url + "/admin/faults")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st FaultStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func status(t *testing.T, url, path, body string) int {
	t.Helper()
	resp := post(t, url+path, body)
	return resp.StatusCode
}

func healthStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A failing worker answers its generation endpoints 500 with vLLM's error
// envelope, keeps /health truthful (200) unless told otherwise, and the
// admin endpoint switches the faults at run time.
func TestFaultsFailRate(t *testing.T) {
	tests := []struct {
		name       string
		faults     Faults
		path, body string
		wantStatus int
		wantHealth int
	}{
		{"none", Faults{}, "/v1/completions", completionBody, 200, 200},
		{"all completions fail", Faults{FailRate: 1}, "/v1/completions", completionBody, 500, 200},
		{"all chats fail", Faults{FailRate: 1}, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, 500, 200},
		{"health fails on request", Faults{FailHealth: true}, "/v1/completions", completionBody, 200, 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, url := serve(t, Config{Faults: tt.faults})
			resp := post(t, url+tt.path, tt.body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if tt.wantStatus == 500 {
				m := decodeJSON(t, resp.Body)
				e, _ := m["error"].(map[string]any)
				if e["type"] != "InternalServerError" || e["code"] != float64(500) || !strings.Contains(e["message"].(string), "injected") {
					t.Fatalf("error body %v", m)
				}
			}
			if got := healthStatus(t, url); got != tt.wantHealth {
				t.Fatalf("/health %d, want %d", got, tt.wantHealth)
			}
			// Tokenize and models are never failed: only generation is.
			if got := status(t, url, "/tokenize", `{"prompt":"a b"}`); got != 200 {
				t.Fatalf("/tokenize %d under faults", got)
			}
		})
	}
}

// A partial fail rate fails that share of requests, and the same seed fails
// the same ones.
func TestFaultsFailRateSeeded(t *testing.T) {
	run := func(seed uint64) []int {
		_, url := serve(t, Config{Faults: Faults{FailRate: 0.3}, FaultSeed: seed})
		out := make([]int, 200)
		for i := range out {
			out[i] = status(t, url, "/v1/completions", completionBody)
		}
		return out
	}
	a, b, c := run(7), run(7), run(8)
	fails := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("request %d: %d then %d with the same seed", i, a[i], b[i])
		}
		if a[i] == 500 {
			fails++
		}
	}
	if fails < 40 || fails > 80 {
		t.Fatalf("%d of 200 failed at rate 0.3", fails)
	}
	if slices.Equal(a, c) {
		t.Fatal("seeds 7 and 8 failed the same requests")
	}
}

// Switching faults at run time through POST /admin/faults: fail, recover,
// hang (the request stays open until the client goes away), recover.
func TestFaultsAdminSwitch(t *testing.T) {
	w, url := serve(t, Config{})
	steps := []struct {
		name, set  string
		wantStatus int // 0: the request hangs
	}{
		{"healthy", `{}`, 200},
		{"failing", `{"fail_rate":1}`, 500},
		{"recovered", `{"fail_rate":0}`, 200},
		{"hanging", `{"hang":true}`, 0},
		{"unhung", `{"hang":false}`, 200},
	}
	for _, s := range steps {
		if got := status(t, url, "/admin/faults", s.set); got != 200 {
			t.Fatalf("%s: POST /admin/faults %s: %d", s.name, s.set, got)
		}
		if s.wantStatus != 0 {
			if got := status(t, url, "/v1/completions", completionBody); got != s.wantStatus {
				t.Fatalf("%s: status %d, want %d", s.name, got, s.wantStatus)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completionBody))
		req.Header.Set("Content-Type", "application/json")
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		eventually(t, "one hanging request", func() bool { return w.Faults().Hanging == 1 })
		if err := <-errc; err == nil {
			t.Fatalf("%s: the request was answered", s.name)
		}
		cancel()
		eventually(t, "no hanging request", func() bool { return w.Faults().Hanging == 0 })
	}
	if st := getFaults(t, url); st.Failed != 1 || st.Hang || st.FailRate != 0 {
		t.Fatalf("status %+v, want one failure and no faults in force", st)
	}
	for _, bad := range []string{`{"fail_rate":1.5}`, `{"fail_rate":-1}`, `{"hang_after":"soon"}`, `{"hang_after":"-1s"}`, `{"fail_rate":"x"}`} {
		if got := status(t, url, "/admin/faults", bad); got < 400 || got >= 500 {
			t.Errorf("POST /admin/faults %s: %d, want a 4xx", bad, got)
		}
	}
}

// hang_after turns the hang on later: requests are served until then.
func TestFaultsHangAfter(t *testing.T) {
	// The wall clock: the tests' default fake clock would never reach it.
	w, url := serve(t, Config{Clock: wallClock{}})
	if got := status(t, url, "/admin/faults", `{"hang_after":"150ms"}`); got != 200 {
		t.Fatalf("POST /admin/faults: %d", got)
	}
	if st := w.Faults(); st.Hang || st.HangAfter == "" {
		t.Fatalf("status %+v right after hang_after", st)
	}
	if got := status(t, url, "/v1/completions", completionBody); got != 200 {
		t.Fatalf("before the hang: %d", got)
	}
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completionBody))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("after hang_after the request was answered %d", resp.StatusCode)
	}
	if st := w.Faults(); !st.Hang {
		t.Fatalf("status %+v after hang_after fired", st)
	}
}

func TestFaultsConfigValidation(t *testing.T) {
	for _, f := range []Faults{{FailRate: 2}, {FailRate: -0.1}, {HangAfter: -time.Second}} {
		if _, err := New(Config{Faults: f}); err == nil {
			t.Errorf("New accepted faults %+v", f)
		}
	}
}
