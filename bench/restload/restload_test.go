package restload

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/report/reporttest"
)

func TestRestInProcess(t *testing.T) {
	for _, prompt := range []string{"tokens", "hashes"} {
		t.Run(prompt, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "rest.json")
			var stdout, stderr bytes.Buffer
			c := Defaults()
			c.Clients, c.Workers, c.Duration, c.Warmup, c.Prompt, c.Blocks, c.JSON, c.SVG = 4, 8, time.Second, 200*time.Millisecond, prompt, 8, out, out+".svg"
			_, err := Run(context.Background(), c, &stdout, &stderr)
			if err != nil {
				t.Fatalf("run: %v\n%s", err, stderr.String())
			}
			for _, want := range []string{"in-process", "select_and_reserve", "delete", "requests/s", "pairs/s", "p99 µs", "GOMAXPROCS", "prompt " + prompt} {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), "req/s") {
				t.Errorf("no progress line on stderr:\n%s", stderr.String())
			}
			reporttest.CheckSVG(t, out+".svg", "select_and_reserve")
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var v struct {
				Server        string  `json:"server"`
				Prompt        string  `json:"prompt"`
				GOMAXPROCS    int     `json:"gomaxprocs"`
				Requests      int     `json:"requests"`
				RequestsPerS  float64 `json:"requests_per_sec"`
				Pairs         int     `json:"pairs"`
				PairsPerSec   float64 `json:"pairs_per_sec"`
				SeededPrompts int     `json:"seeded_prompts"`
			}
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			var raw map[string]map[string]any
			_ = json.Unmarshal(b, &raw)
			for _, kind := range []string{"select_and_reserve", "delete"} {
				for _, k := range []string{"requests", "per_sec", "p50_ns", "p90_ns", "p99_ns", "max_ns", "errors", "errors_by_status"} {
					if _, ok := raw[kind][k]; !ok {
						t.Errorf("json %s lacks %s: %s", kind, k, b)
					}
				}
			}
			sel := raw["select_and_reserve"]
			if v.Server != "in-process" || v.Prompt != prompt || v.GOMAXPROCS < 1 || v.SeededPrompts == 0 ||
				v.Pairs == 0 || v.Requests != 2*v.Pairs || v.PairsPerSec <= 0 || v.RequestsPerS <= v.PairsPerSec ||
				sel["errors"].(float64) != 0 || !(sel["p50_ns"].(float64) > 0 && sel["p50_ns"].(float64) <= sel["p99_ns"].(float64) && sel["p99_ns"].(float64) <= sel["max_ns"].(float64)) {
				t.Fatalf("json = %s", b)
			}
		})
	}
}

// A server that answers 429 to every selection: the run counts the failures
// by status and aborts well before its duration.
func TestRestAbortsOnErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/workers" {
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"lifecycle":"schedulable"}`))
			return
		}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":"all workers are busy"}`))
	}))
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	c := Defaults()
	c.URL, c.Clients, c.Workers, c.Duration, c.Warmup = srv.URL, 2, 2, 30*time.Second, 0
	_, err := Run(context.Background(), c, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "failed") || !strings.Contains(err.Error(), "429") {
		t.Fatalf("err = %v\n%s", err, stderr.String())
	}
}

func TestRestRejectsBadSettings(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"prompt":       func(c *Config) { c.Prompt = "words" },
		"no clients":   func(c *Config) { c.Clients = 0 },
		"no duration":  func(c *Config) { c.Duration = 0 },
		"off loopback": func(c *Config) { c.URL = "http://192.0.2.1:8080" },
		"https":        func(c *Config) { c.URL = "https://localhost:8080" },
		"auth mode":    func(c *Config) { c.Auth = []string{"bogus"} },
		"auth and url": func(c *Config) { c.URL, c.Auth = "http://127.0.0.1:1", []string{"token"} },
	} {
		c := Defaults()
		change(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

// -auth measures every server setup in one run: each serves its pairs
// without an error (so the token reaches the server, and TLS works), the TLS
// modes time a handshake, and the comparison table names every mode.
func TestRestAuthModes(t *testing.T) {
	out := filepath.Join(t.TempDir(), "rest-auth.json")
	var stdout, stderr bytes.Buffer
	c := Defaults()
	c.Auth, c.Rounds, c.Clients, c.Workers, c.Duration, c.Warmup, c.Blocks, c.JSON = AuthModes, 1, 2, 4, 400*time.Millisecond, 100*time.Millisecond, 4, out
	_, err := Run(context.Background(), c, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "REST authentication and TLS cost") {
		t.Errorf("no comparison table:\n%s", stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var results []struct {
		Auth      string `json:"auth"`
		Pairs     int    `json:"pairs"`
		Handshake int64  `json:"tls_handshake_p50_ns"`
		CPU       int64  `json:"cpu_per_request_ns"`
	}
	if err := json.Unmarshal(b, &results); err != nil {
		t.Fatal(err)
	}
	var modes []string
	for _, r := range results {
		modes = append(modes, r.Auth)
		if r.Pairs == 0 || r.CPU <= 0 {
			t.Errorf("%s: %d pairs, %d ns CPU per request", r.Auth, r.Pairs, r.CPU)
		}
		if tls := strings.HasPrefix(r.Auth, "tls"); tls != (r.Handshake > 0) {
			t.Errorf("%s: handshake %d ns", r.Auth, r.Handshake)
		}
	}
	if got := strings.Join(modes, ","); got != "off,token,tls,tls+token" {
		t.Errorf("modes %s", got)
	}
	// An unknown mode is refused.
	c.Auth = []string{"bogus"}
	if _, err := Run(context.Background(), c, &stdout, &stderr); err == nil {
		t.Error("-auth bogus accepted")
	}
}
