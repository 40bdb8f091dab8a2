package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/mockworker"
)

// kvselect scrapes a real mock worker's /metrics over loopback and shows the
// figures in GET /workers; a worker whose /health fails is ejected by the
// active probe, and the counters move in /metrics.
func TestEngineMetricsAndHealthProbesEndToEnd(t *testing.T) {
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	engine := httptest.NewServer(w.Handler())
	defer engine.Close()
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer sick.Close()

	srv := runInBackground(t, withoutKVEvents, []string{"--engine-metrics-interval", "20ms", "--health-probe-interval", "10ms", "--eject-base", "1h", "--eject-max", "2h"})
	rest := "http://" + srv.addrs.REST.String()
	for id, ep := range map[int]string{1: engine.URL, 2: sick.URL} {
		res, err := http.Post(rest+"/workers", "application/json",
			strings.NewReader(fmt.Sprintf(`{"worker_id":%d,"model_name":"m","endpoint":%q,"block_size":4}`, id, ep)))
		if err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("register %d: %v %v", id, res, err)
		}
		res.Body.Close()
	}
	get := func(path string) string {
		t.Helper()
		res, err := http.Get(rest + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	type worker struct {
		WorkerID      uint64 `json:"worker_id"`
		EngineMetrics *struct {
			AgeMS   *int64   `json:"age_ms"`
			KVUsage *float64 `json:"kv_usage"`
			Stale   bool     `json:"stale"`
			Error   string   `json:"error"`
		} `json:"engine_metrics"`
		Health *struct {
			State string `json:"state"`
		} `json:"health"`
	}
	var ws []worker
	proctest.Eventually(t, "worker 1 scraped and worker 2 ejected", 20*time.Second, func() bool {
		if err := json.Unmarshal([]byte(get("/workers")), &ws); err != nil || len(ws) != 2 {
			return false
		}
		e := ws[0].EngineMetrics
		return e != nil && e.AgeMS != nil && e.KVUsage != nil && !e.Stale && ws[1].Health != nil && ws[1].Health.State == "ejected"
	})
	if e := ws[1].EngineMetrics; e == nil || !e.Stale || !strings.Contains(e.Error, "status 503") {
		t.Fatalf("worker 2's engine_metrics = %+v, want stale with the scrape error", e)
	}
	m := get("/metrics")
	for _, want := range []string{`kvselect_engine_metrics_scrapes_total{result="ok"}`, `kvselect_engine_metrics_scrapes_total{result="http_status"}`,
		"kvselect_worker_ejections_total 1", "kvselect_workers_ejected 1", `kvselect_health_probes_total{result="failure"}`,
		`kvselect_engine_metrics_workers{state="fresh"} 1`, "kvselect_engine_metrics_scrape_duration_seconds_count"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestFlagsOfAFeatureThatIsOffAreRefused: a flag that tunes scraping,
// probing, ejection or flow control while another flag turned it off would
// do nothing, so it stops the server; the switch alone, or a default, does not.
func TestFlagsOfAFeatureThatIsOffAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" = accepted
	}{
		{[]string{"--engine-metrics-interval", "0", "--engine-metrics-timeout", "1s"}, "--engine-metrics-timeout has no effect with --engine-metrics-interval 0"},
		{[]string{"--engine-metrics-interval", "0", "--engine-metrics-max-bytes", "2048"}, "--engine-metrics-max-bytes has no effect"},
		{[]string{"--engine-metrics-interval", "0", "--engine-metrics-stale-after", "5s"}, "--engine-metrics-stale-after has no effect"},
		{[]string{"--engine-metrics-interval", "0", "--engine-metrics-concurrency", "4"}, "--engine-metrics-concurrency has no effect"},
		{[]string{"--engine-metrics-interval", "0", "--health-probe-interval", "1s", "--engine-metrics-concurrency", "4"}, ""},
		{[]string{"--health-probe-timeout", "2s"}, "--health-probe-timeout has no effect with --health-probe-interval 0"},
		{[]string{"--health-probe-interval", "1s", "--health-probe-timeout", "2s"}, ""},
		{[]string{"--eject-after", "0", "--eject-base", "1s"}, "--eject-base has no effect with --eject-after 0"},
		{[]string{"--eject-after", "0", "--eject-window", "1m", "--eject-max", "1h"}, "--eject-window has no effect"},
		{[]string{"--eject-after", "0"}, ""},
		{[]string{"--flow-queue-ttl", "1m"}, "--flow-queue-ttl has no effect with --flow-control off"},
		{[]string{"--flow-control", "off", "--flow-max-bytes", "0"}, "--flow-max-bytes has no effect"},
		{[]string{"--flow-max-band-bytes", "1", "--flow-max-tenants", "5"}, "--flow-max-tenants has no effect"},
		{[]string{"--engine-metrics-interval", "0"}, ""},
	} {
		_, err := parseFlags(tc.args)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: %v", tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestEngineFlagValidation(t *testing.T) {
	for _, args := range [][]string{
		{"--engine-metrics-interval", "-1s"},
		{"--engine-metrics-timeout", "0s"},
		{"--kv-cache-util-threshold", "1.5"},
		{"--engine-request-weight", "-1"},
		{"--eject-after", "-2"},
		{"--eject-base", "10s", "--eject-max", "5s"},
		{"--queue-depth-threshold", "-7"},
		{"--engine-metrics-concurrency", "0"},
		{"--when-saturated", "drop"},
	} {
		var o options
		fs := newFlagSet(&o)
		if err := fs.Parse(args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if errs := o.engines.validate(nil); len(errs) == 0 {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestWhenSaturatedFlag(t *testing.T) {
	for _, tt := range []struct {
		args   []string
		reject bool
	}{{nil, false}, {[]string{"--when-saturated", "route"}, false}, {[]string{"--when-saturated", "reject"}, true}} {
		var o options
		fs := newFlagSet(&o)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		if errs := o.engines.validate(nil); len(errs) != 0 {
			t.Fatalf("%v: %v", tt.args, errs)
		}
		if got := o.engines.config().RejectSaturated; got != tt.reject {
			t.Errorf("%v: RejectSaturated = %v, want %v", tt.args, got, tt.reject)
		}
	}
}

// With no response path — a REST caller that books, sends the request to
// the engine itself and frees the booking without prefill_complete — the
// latency model still learns: kvselect scrapes the real mock engine's TTFT
// histogram and fits each interval's mean against the bookings it accounts
// for (selection/latency's engine.go).
func TestEngineHistogramsCalibrateWithoutResponsePath(t *testing.T) {
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, BlockSize: 4,
		PrefillPerToken: 200 * time.Microsecond, DecodePerToken: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	engine := httptest.NewServer(w.Handler())
	defer engine.Close()
	srv := runInBackground(t, withoutKVEvents, []string{"--engine-metrics-interval", "20ms", "--latency-min-observations", "4"})
	rest := "http://" + srv.addrs.REST.String()
	post := func(url, body string) []byte { t.Helper(); return postOK(t, url, body) }
	post(rest+"/workers", fmt.Sprintf(`{"worker_id":1,"model_name":"m","endpoint":%q,"block_size":4}`, engine.URL))
	type policy struct {
		LatencyModel struct {
			Pooled map[string]struct {
				TTFTObservations int    `json:"ttft_observations"`
				ITLObservations  int    `json:"itl_observations"`
				Source           string `json:"source"`
			} `json:"pooled"`
		} `json:"latency_model"`
	}
	var p policy
	sent := 0
	proctest.Eventually(t, "TTFT intervals fitted from the engine's histogram", 60*time.Second, func() bool {
		// One request: booked, sent to the engine, freed without a word
		// about its first token. Prompts of several lengths, so the fit
		// sees its uncached-token feature move.
		sent++
		ids := make([]string, 8+16*(sent%4))
		for i := range ids {
			ids[i] = fmt.Sprint(i + 1)
		}
		var booked struct {
			SelectionID string `json:"selection_id"`
		}
		if err := json.Unmarshal(post(rest+"/select_and_reserve", `{"model_name":"m","token_ids":[`+strings.Join(ids, ",")+`]}`), &booked); err != nil {
			t.Fatal(err)
		}
		post(engine.URL+"/v1/completions", `{"model":"m","prompt":[`+strings.Join(ids, ",")+`],"max_tokens":3}`)
		req, _ := http.NewRequest(http.MethodDelete, rest+"/reservations/"+booked.SelectionID, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		time.Sleep(25 * time.Millisecond) // a scrape between requests
		res, err = http.Get(rest + "/policy")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		c := p.LatencyModel.Pooled["m"]
		return c.Source == "pooled" && c.TTFTObservations >= 8 && c.ITLObservations >= 1
	})
	res, err := http.Get(rest + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if want := `kvselect_latency_engine_intervals_total{model="m",outcome="fitted"}`; !strings.Contains(string(b), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}
