package vsepp

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/bench/floorpicker/floortest"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// TestVsEPPHarness runs the comparison on the start of the conversation
// trace (the first 20 seconds, 65 requests, replayed 4x faster; or the first
// 40) for kvselect and llm-d's endpoint picker, each with fresh engines of
// each family (llm-d-inference-sim, kvselect-mockworker) and with token-id or
// text prompts, and checks the harness itself: every picker routes every
// request to one of the engines, every engine response comes back through the
// picker byte for byte (the harness counts any difference as an error), each
// figure of the report is produced, kvselect holds no booking afterwards, and
// with text prompts and a generous tokenize budget kvselect routes every
// prompt on the engine's ids. It asserts no speed.
func TestVsEPPHarness(t *testing.T) {
	bins := fleettest.Binaries(t)
	for _, tc := range []struct {
		family   fleet.Family
		prompts  string
		requests int
		pickers  []string
	}{
		{fleet.FamilySim, PromptsTokens, 65, []string{pickerKvselect, pickerEPP}},
		// The floor beside them: the report's lines above the floor.
		{fleet.FamilyMock, PromptsTokens, 40, []string{pickerKvselect, pickerEPP, PickerFloor}},
		{fleet.FamilySim, PromptsText, 40, []string{pickerKvselect, pickerEPP}},
		// The EPP renders text through an engine, which the mock cannot do.
		{fleet.FamilyMock, PromptsText, 40, []string{pickerKvselect}},
	} {
		t.Run(string(tc.family)+"/"+tc.prompts, func(t *testing.T) {
			c := Defaults()
			c.Binaries = bins
			if tc.family == fleet.FamilySim {
				c.Sim = peerproc.SimBinary(t)
			}
			if slices.Contains(tc.pickers, pickerEPP) {
				c.EPP = peerproc.EPPBinary(t)
			}
			c.Family, c.Prompts, c.Requests, c.Pickers = tc.family, tc.prompts, tc.requests, tc.pickers
			if slices.Contains(tc.pickers, PickerFloor) {
				c.FloorPicker = floortest.Command()
			}
			vsHarness(t, c, tc.requests, tc.pickers, tc.prompts == PromptsText)
		})
	}
}

func vsHarness(t *testing.T, c Config, requests int, pickers []string, text bool) {
	t.Helper()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	c.Trace, c.Compress, c.Workers, c.Idle, c.Saturate, c.SaturateStreams = fleettest.Trace, 4, 2, time.Second, time.Second, 8
	c.Pin, c.Quiet, c.Out = false, true, out
	if text {
		// A generous tokenize budget: on a busy machine the default 20 ms
		// can pass, and the prompt then routes on the text index. Only
		// text runs tokenize; elsewhere kvselect refuses the flag.
		c.KVSelectArgs = []string{"--tokenize-timeout", "10s"}
	}
	_, err := Run(context.Background(), c, &stdout, &stderr)
	if err != nil {
		t.Fatalf("vs-epp: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(out, "vs-epp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Runs) != len(pickers) {
		t.Fatalf("vs-epp.json: %v %s", err, b)
	}
	for i, r := range rep.Runs {
		routed := 0
		for _, n := range r.PerEngine {
			routed += n
		}
		switch {
		case r.Picker != pickers[i]:
			t.Errorf("run %d is %s, want %s", i, r.Picker, pickers[i])
		case r.Errors != 0 || r.SaturationErrors != 0:
			t.Errorf("%s: %d errors (%s), %d in the saturating loop (%s)", r.Picker, r.Errors, r.ErrorSample, r.SaturationErrors, r.SaturationError)
		case routed != requests:
			t.Errorf("%s routed %d of %d requests: %v", r.Picker, routed, requests, r.PerEngine)
		case r.Decision.P50 <= 0 || r.TTFTP50Ms <= 0 || r.TTFTP90Ms < r.TTFTP50Ms:
			t.Errorf("%s: decision %+v, TTFT %.1f / %.1f ms", r.Picker, r.Decision, r.TTFTP50Ms, r.TTFTP90Ms)
		case r.Histogram.Count < float64(requests):
			t.Errorf("%s: the picker's %s counted %.0f decisions", r.Picker, r.Histogram.Name, r.Histogram.Count)
		case r.CPUPerRequestGrossUs <= 0 || r.MaxRPS <= 0:
			t.Errorf("%s: CPU per request %.0f µs, saturating loop %.0f req/s", r.Picker, r.CPUPerRequestGrossUs, r.MaxRPS)
		// Every trace request starts with the same block: after the first
		// request an engine holds it, so some prompt tokens are hits.
		case !(r.HitRate > 0 && r.HitRate < 1):
			t.Errorf("%s: hit rate %v from the engines' counters", r.Picker, r.HitRate)
		}
		if IsKvselect(r.Picker) {
			if r.LeakedBookings == nil || *r.LeakedBookings != 0 || r.Histogram.Name != "kvselect_extproc_pick_duration_seconds" {
				t.Errorf("kvselect run: %+v", r)
			}
			// The best-cached candidate had at least what the chosen one had.
			if r.IndexBestHitRate < r.IndexHitRate || r.IndexBestHitRate > 1 || r.IndexHitRate < 0 {
				t.Errorf("kvselect's index hit rate %v chosen, %v best-cached", r.IndexHitRate, r.IndexBestHitRate)
			}
			if text && (r.TokenizeFallbacks == nil || *r.TokenizeFallbacks != 0) {
				t.Errorf("kvselect routed text prompts on its text index: %v (%v)", r.TokenizeFallbacks, r.TokenizeFallbackReasons)
			}
		} else if r.Picker == PickerFloor {
			// Round-robin: 40 requests over two engines, 20 each.
			if r.Histogram.Name != floorpicker.HistogramName || r.LoadCV != 0 || r.LeakedBookings != nil {
				t.Errorf("floor run: histogram %q, load CV %v, bookings %v", r.Histogram.Name, r.LoadCV, r.LeakedBookings)
			}
		} else if r.WithScores != requests || r.Histogram.Name != "llm_d_epp_scheduler_e2e_duration_seconds" {
			t.Errorf("EPP run: %d decisions with endpoint scores, histogram %q", r.WithScores, r.Histogram.Name)
		}
	}
	want := []string{"decision p50 / p90 / p95 / p99", "prefix-cache hit rate"}
	if len(pickers) > 1 {
		want = append(want, "kvselect vs epp:")
	}
	if slices.Contains(pickers, PickerFloor) {
		want = append(want, "above the floor (")
	}
	if text {
		want = append(want, "tokenize fallbacks")
	}
	for _, w := range want {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, stdout.String())
		}
	}
	files := []string{"vs-epp.svg"}
	if slices.Contains(pickers, pickerEPP) {
		files = append(files, "epp-plain/epp-config.yaml", "epp-plain/endpoints.yaml")
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// Without the endpoint picker's binary, vs-epp says where to get it; without
// the simulator's, likewise.
func TestVsEPPNeedsThePeers(t *testing.T) {
	c := Defaults()
	c.EPP, c.Sim = "", "/bin/true"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), peerproc.EnvEPP) {
		t.Fatalf("err = %v, want one naming %s", err, peerproc.EnvEPP)
	}
	c.Pickers, c.Sim = []string{pickerKvselect}, ""
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), peerproc.EnvSim) {
		t.Fatalf("err = %v, want one naming %s", err, peerproc.EnvSim)
	}
}

// The mock family needs no simulator; text prompts with the EPP need the
// simulator family, whose engines render text for the EPP's token producer
// (the floor reads no prompt and runs with either); the floor needs the
// command that serves it and serves plaintext only.
func TestVsEPPFamilyAndPromptsChecks(t *testing.T) {
	for _, tc := range []struct {
		family     fleet.Family
		prompts    string
		mockworker string
		pickers    []string
		floor      bool // FloorPicker set
		transports []string
		want       string // in the error; "" for none
	}{
		{family: fleet.FamilyMock},
		{family: fleet.FamilyMock, prompts: PromptsText, pickers: []string{pickerKvselect, pickerKvselectPrefix}},
		{family: fleet.FamilyMock, prompts: PromptsText, want: "-engine-family llmd-sim"},
		{family: fleet.FamilyMock, mockworker: "-", want: "-mockworker"},
		{family: "vllm", want: "want llmd-sim or mock"},
		{family: fleet.FamilyMock, prompts: "chat", want: "want tokens or text"},
		{family: fleet.FamilyMock, pickers: []string{PickerFloor}, want: "picker floor needs the command"},
		{family: fleet.FamilyMock, pickers: []string{PickerFloor}, floor: true, transports: []string{"plain", "tls"}, want: "picker floor serves plaintext only"},
		{family: fleet.FamilyMock, prompts: PromptsText, pickers: []string{pickerKvselect, PickerFloor}, floor: true},
	} {
		c := Config{Slice: mooncake.Slice{Requests: 1}, Concurrency: 1, BlockTokens: 1, MaxOutput: 1,
			Spec: fleet.Spec{Workers: 1, Engine: fleet.Engine{BlockSize: 1, PoolBlocks: 1, MaxNumSeqs: 1}, Family: tc.family,
				Binaries: fleet.Binaries{EPP: "/bin/true", MockWorker: "bin/kvselect-mockworker"}},
			SaturateStreams: 1, Loop: "open", Compress: 1, Idle: time.Second,
			Transports: []string{"plain"}, Pickers: []string{pickerKvselect, pickerEPP}, Prompts: PromptsTokens}
		if tc.prompts != "" {
			c.Prompts = tc.prompts
		}
		if tc.mockworker == "-" {
			c.MockWorker = ""
		}
		if tc.pickers != nil {
			c.Pickers = tc.pickers
		}
		if tc.floor {
			c.FloorPicker = floortest.Command()
		}
		if tc.transports != nil {
			c.Transports = tc.transports
		}
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: err = %v, want one containing %q", tc, err, tc.want)
		}
	}
}

// Both traffic modes issue every trace request exactly once: the closed loop
// with at most -concurrency in flight, the open loop at a fixed rate too.
func TestTrafficIssuesEveryRequestOnce(t *testing.T) {
	reqs := make([]mooncake.Request, 40)
	for i := range reqs {
		reqs[i].Timestamp = int64(i) // 1 ms apart in trace time
	}
	for _, c := range []Config{
		{Loop: "closed", Concurrency: 3},
		{Loop: "open", Concurrency: 3, Compress: 10},
		{Loop: "open", Concurrency: 2, Rate: 2000},
	} {
		var mu sync.Mutex
		seen := make([]int, len(reqs))
		inFlight, most := 0, 0
		err := c.traffic(context.Background(), reqs, func(i int) {
			mu.Lock()
			seen[i]++
			inFlight++
			most = max(most, inFlight)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			inFlight--
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("%s: request %d issued %d times", c.loopName(), i, n)
			}
		}
		if most > c.Concurrency {
			t.Fatalf("%s: %d in flight, limit %d", c.loopName(), most, c.Concurrency)
		}
	}
}
