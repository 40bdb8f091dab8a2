package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// buildFleetBinaries builds kvselect and the mock worker into a temp dir.
func buildFleetBinaries(t *testing.T) (kvselect, worker string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs kvselect and mock worker processes; skipped with -short")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("needs the go command: %v", err)
	}
	dir := t.TempDir()
	if out, err := exec.Command(goTool, "build", "-o", dir+"/", "../kvselect", "../kvselect-mockworker").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "kvselect"), filepath.Join(dir, "kvselect-mockworker")
}

// TestSharedPrefixFollowsTheCache runs kvselect and two mock workers as real
// processes on loopback and drives them with the Envoy-faithful ext_proc
// client: the second request of a shared prefix lands on the worker that
// cached it (known to kvselect only through the worker's KV events), and
// every booking is freed once the responses end.
func TestSharedPrefixFollowsTheCache(t *testing.T) {
	kvselectBin, workerBin := buildFleetBinaries(t)
	ctx := context.Background()
	c := &demoConfig{kvselectBin: kvselectBin, workerBin: workerBin, workers: 2, concurrency: 4, blockSize: 16,
		poolBlocks: 1024, speedup: 1000, prefillPerToken: 50 * time.Microsecond, decodePerToken: time.Millisecond, out: t.TempDir()}
	fl, err := startFleet(ctx, c, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.stop()
	client := envoysim.New(fl.conn)

	prefix := demoTokens([]uint64{11, 12, 13, 14}, 64) // 256 tokens: 16 blocks
	body := func(tail uint64) []byte {
		b, _ := json.Marshal(demoBody{Model: "mock-model", Prompt: append(append([]uint32(nil), prefix...), demoTokens([]uint64{tail}, 64)...),
			MaxTokens: 4, Stream: true})
		return b
	}
	first, err := fl.viaPicker(ctx, client, body(100), 1)
	if err != nil {
		t.Fatal(err)
	}
	// kvselect learns the first worker's blocks from its KV events.
	var overlap struct {
		Workers []struct {
			WorkerID     uint64 `json:"worker_id"`
			DeviceBlocks uint32 `json:"device_blocks"`
		} `json:"workers"`
	}
	probe, _ := json.Marshal(map[string]any{"model_name": "mock-model", "token_ids": prefix})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := fl.hc.Post(fl.rest+"/overlap_scores", "application/json", bytes.NewReader(probe))
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&overlap)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		held := uint32(0)
		for _, w := range overlap.Workers {
			if w.WorkerID == uint64(first.worker+1) {
				held = w.DeviceBlocks
			}
		}
		if held == 16 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvselect never indexed the first worker's 16 prefix blocks: %+v", overlap)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 5 {
		second, err := fl.viaPicker(ctx, client, body(uint64(200+i)), 2+i)
		if err != nil {
			t.Fatal(err)
		}
		if second.worker != first.worker {
			t.Fatalf("request %d sharing the prefix went to worker %d, not %d which caches it", i, second.worker+1, first.worker+1)
		}
	}
	if n, err := fl.activeRequests(); err != nil || n != 0 {
		t.Fatalf("active requests after every response ended: %d (%v)", n, err)
	}
}

// TestDemoCommand runs `kvbench demo` on a short slice: both phases, the
// table, the JSON and the SVG, no errors, no load left.
func TestDemoCommand(t *testing.T) {
	kvselectBin, workerBin := buildFleetBinaries(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"demo", "-kvselect", kvselectBin, "-mockworker", workerBin, "-trace", trace,
		"-requests", "80", "-workers", "2", "-compress", "400", "-speedup", "400", "-quiet", "-out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"prefix-cache hit rate", "TTFT p90 (ms)", "round-robin", "active requests after the run: 0",
		"decision, kvselect's own p50 / p99", "decision, client-observed p50 / p99"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "demo.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep demoReport
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Phases) != 2 {
		t.Fatalf("demo.json: %v %s", err, b)
	}
	for _, ph := range rep.Phases {
		if ph.Errors != 0 || ph.Requests != 80 || ph.TTFTP50Ms <= 0 || ph.Throughput <= 0 {
			t.Fatalf("phase %+v", ph)
		}
		if ph.Policy == "kvselect" && (ph.ServerPick == nil || ph.ServerPick.Count != 80 || ph.ServerPick.P50Us <= 0) {
			t.Errorf("kvselect phase: server-side decision time %+v, want 80 observations", ph.ServerPick)
		}
	}
	if !strings.Contains(stderr.String(), "/ui/") {
		t.Errorf("the demo did not print the status page URL:\n%s", stderr.String())
	}
	svg, err := os.ReadFile(filepath.Join(out, "demo.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CDF", "Hit rate per second", "kvselect decision time", "<polyline"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("demo.svg lacks %q", want)
		}
	}
	if strings.Contains(string(svg), "Throughput") {
		t.Error("demo.svg still draws the throughput bar an open-loop replay cannot change")
	}
}

// TestDemoOverLLMDSim runs `kvbench demo -engines llmd-sim` on a short slice:
// kvselect learns the simulators' caches only through its KV events collector
// (they dial it; the demo registers them over REST), both phases complete with
// fresh simulators, the hit rate comes from the simulators' own counters, and
// no booking is left.
func TestDemoOverLLMDSim(t *testing.T) {
	sim := peerproc.SimBinary(t)
	kvselectBin, _ := buildFleetBinaries(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"demo", "-engines", "llmd-sim", "-sim-bin", sim, "-kvselect", kvselectBin, "-trace", trace,
		"-requests", "120", "-workers", "2", "-compress", "100", "-quiet", "-out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{"llm-d-inference-sim engines", "round-robin", "active requests after the run: 0"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "demo.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep demoReport
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Phases) != 2 || rep.Engines != "llmd-sim" {
		t.Fatalf("demo.json: %v %s", err, b)
	}
	for _, ph := range rep.Phases {
		routed := 0
		for _, n := range ph.PerWorker {
			routed += n
		}
		// A slice of the conversation trace repeats prefixes: some of its
		// prompt tokens must be cache hits in either phase.
		if ph.Errors != 0 || routed != 120 || ph.HitRate <= 0 || ph.TTFTP50Ms <= 0 {
			t.Fatalf("phase %+v", ph)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "kvselect-sim-1.log")); err != nil {
		t.Fatalf("the picker phase's simulator log: %v", err)
	}
}

// Without a simulator binary, -engines llmd-sim says where to get one.
func TestDemoOverLLMDSimNeedsTheBinary(t *testing.T) {
	t.Setenv(peerproc.EnvSim, "")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"demo", "-engines", "llmd-sim"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), peerproc.EnvSim) {
		t.Fatalf("err = %v, want one naming %s", err, peerproc.EnvSim)
	}
}
