package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/mockworker"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	var o options
	newFlagSet(&o).VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out.String(), "-"+f.Name) {
			t.Errorf("--help does not mention -%s", f.Name)
		}
	})
	if !strings.HasPrefix(out.String(), "kvselect-mockworker:") {
		t.Fatalf("help starts %q", out.String()[:40])
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--nope"},
		{"extra"},
		{"--port", "70000"},
		{"--kv-events-format", "json"},
		{"--log-level", "loud"},
		{"--log-format", "xml"},
		{"--register", "localhost:8092"},
		{"--port", "0", "--block-size", "0"},
		{"--port", "0", "--speedup", "-1"},
		{"--port", "0", "--num-gpu-blocks", "-3"},
		{"--port", "0", "--kv-events-endpoint", "udp://x:1"},
		{"--port", "0", "--decode-batch-slowdown", "-1"},
		{"--port", "0", "--kv-events-connect", "tcp://127.0.0.1:5557", "--kv-events-endpoint", "tcp://127.0.0.1:0"},
		{"--port", "0", "--kv-events-connect", "udp://127.0.0.1:5557"},
		{"--port", "0", "--kv-events-connect", "tcp://127.0.0.1"},
		{"--port", "0", "--kv-events=false", "--kv-events-connect", "tcp://127.0.0.1:5557"},
	} {
		err := run(context.Background(), args, io.Discard, io.Discard, nil)
		if code := exitStatus(err, io.Discard); code != 2 {
			t.Errorf("%q: exit status %d (%v), want 2", args, code, err)
		}
	}
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

// TestServeRegisterDeregister runs the program against a real kvselect REST
// API: it registers, serves a completion, and deletes itself on shutdown.
func TestServeRegisterDeregister(t *testing.T) {
	l := kvlisten.New(context.Background(), kvlisten.Options{})
	defer l.Close()
	svc, err := selection.New(selection.Config{Router: routerconfig.Default(), Listeners: l})
	if err != nil {
		t.Fatal(err)
	}
	kv := httptest.NewServer(httpadmin.New(svc, httpadmin.Options{}))
	defer kv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--port", "0", "--register", kv.URL, "--worker-id", "77", "--block-size", "4",
			"--num-gpu-blocks", "64", "--speedup", "1000", "--data-parallel-size", "2", "--log-level", "warn"},
			io.Discard, io.Discard, func(a string) { addr <- a })
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run ended: %v", err)
	}
	if code := getJSON(t, base+"/health", nil); code != 200 {
		t.Fatalf("/health %d", code)
	}
	var workers []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for len(workers) == 0 && time.Now().Before(deadline) {
		getJSON(t, kv.URL+"/workers", &workers)
		time.Sleep(10 * time.Millisecond)
	}
	if len(workers) != 1 || workers[0]["worker_id"] != 77.0 || workers[0]["lifecycle"] != "schedulable" ||
		workers[0]["endpoint"] != base {
		t.Fatalf("workers %v", workers)
	}
	if eps, _ := workers[0]["kv_events_endpoints"].(map[string]any); len(eps) != 2 {
		t.Fatalf("kv_events_endpoints %v", workers[0]["kv_events_endpoints"])
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hello mock world","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	getJSON(t, kv.URL+"/workers", &workers)
	if len(workers) != 0 {
		t.Fatalf("still registered after shutdown: %v", workers)
	}
}

// TestConnectFeedsKvselectsCollector runs the program in llm-d's topology
// against a real kvselect: a KV events collector bound by kvselect's
// listeners, the worker's two ranks dialing it under the default topic
// kv@<host>:<port>@<model>, the registration carrying no KV events endpoint.
// A prompt run on rank 1 must reach kvselect's index as rank 1's blocks.
func TestConnectFeedsKvselectsCollector(t *testing.T) {
	l := kvlisten.New(context.Background(), kvlisten.Options{})
	defer l.Close()
	collector, err := l.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := selection.New(selection.Config{Router: routerconfig.Default(), Listeners: l, EventsCollector: true})
	if err != nil {
		t.Fatal(err)
	}
	kv := httptest.NewServer(httpadmin.New(svc, httpadmin.Options{}))
	defer kv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--port", "0", "--register", kv.URL, "--worker-id", "78", "--block-size", "4",
			"--num-gpu-blocks", "64", "--speedup", "1000", "--data-parallel-size", "2", "--kv-events-connect", collector,
			"--log-level", "warn"}, io.Discard, io.Discard, func(a string) { addr <- a })
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run ended: %v", err)
	}
	var workers []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for len(workers) == 0 && time.Now().Before(deadline) {
		getJSON(t, kv.URL+"/workers", &workers)
		time.Sleep(10 * time.Millisecond)
	}
	if len(workers) != 1 || workers[0]["worker_id"] != 78.0 || workers[0]["lifecycle"] != "schedulable" {
		t.Fatalf("workers %v", workers)
	}
	if eps, _ := workers[0]["kv_events_endpoints"].(map[string]any); len(eps) != 0 || workers[0]["kv_events_topic"] != nil {
		t.Fatalf("registered kv_events_endpoints %v, kv_events_topic %v: want neither (the topic is llm-d's)",
			workers[0]["kv_events_endpoints"], workers[0]["kv_events_topic"])
	}

	complete := func(prompt []int) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-data-parallel-rank", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("completion: %d", resp.StatusCode)
		}
	}
	// Two ranks register no replay endpoint, so what rank 1 publishes before
	// kvselect routes its topic is lost: publish one-block prompts until the
	// collector has delivered one of rank 1's batches.
	synced := func() bool {
		var ws []struct {
			Status map[string]struct {
				LastSequence *uint64 `json:"last_sequence"`
			} `json:"kv_events_status"`
		}
		getJSON(t, kv.URL+"/workers", &ws)
		return len(ws) == 1 && ws[0].Status["1"].LastSequence != nil
	}
	for i := 0; !synced(); i++ {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for rank 1's KV events through the collector")
		}
		complete([]int{9000 + i, 1, 2, 3})
		time.Sleep(10 * time.Millisecond)
	}
	prompt := make([]int, 12)
	tokens := make([]uint32, len(prompt))
	for i := range prompt {
		prompt[i] = 100 + i
		tokens[i] = uint32(prompt[i])
	}
	complete(prompt)
	var got struct {
		WorkerID uint64 `json:"worker_id"`
		DPRank   uint32 `json:"dp_rank"`
		Overlap  struct {
			GPU uint64 `json:"gpu"`
		} `json:"overlap"`
	}
	for got.Overlap.GPU != 12 {
		if time.Now().After(deadline) {
			t.Fatalf("/select never found the prompt's 3 blocks: last answer %+v", got)
		}
		b, _ := json.Marshal(map[string]any{"model_name": "mock-model", "token_ids": tokens})
		resp, err := http.Post(kv.URL+"/select", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got.WorkerID != 78 || got.DPRank != 1 {
		t.Fatalf("/select chose worker %d rank %d, want 78 rank 1 (the batch's dp_rank)", got.WorkerID, got.DPRank)
	}
	var cs struct {
		Delivered uint64 `json:"delivered"`
	}
	if code := getJSON(t, kv.URL+"/kv_events/collector", &cs); code != 200 || cs.Delivered == 0 {
		t.Fatalf("GET /kv_events/collector: %d, %+v", code, cs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// The command line the benchmarks start mock workers with (peerproc) parses,
// dials the collector, binds the replay socket, and keeps the timing model.
func TestPeerprocCommandLineParses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     peerproc.MockWorker
		collect string
		replay  bool
	}{
		{"collector and replay", peerproc.MockWorker{Port: 8123, Collector: "tcp://127.0.0.1:5557", ReplayPort: 9123,
			PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 2 * time.Millisecond, MaxNumSeqs: 4, MaxModelLen: 4096},
			"tcp://127.0.0.1:5557", true},
		{"no events", peerproc.MockWorker{Port: 8123}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(peerproc.MockWorkerArgs(tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			c := o.cfg
			if c.KVEventsCollector != tc.collect || c.KVEventsEndpoint != "" || (c.ReplayEndpoint != "") != tc.replay ||
				c.Model != "fake-model" || c.PrefillPerToken != tc.cfg.PrefillPerToken || c.DecodePerToken != tc.cfg.DecodePerToken ||
				c.DecodeBatchSlowdown != 0 || c.PrefillSlots != 0 || (tc.cfg.MaxNumSeqs > 0 && c.MaxNumSeqs != tc.cfg.MaxNumSeqs) {
				t.Fatalf("parsed %+v from %q", c, peerproc.MockWorkerArgs(tc.cfg))
			}
		})
	}
}

// The disaggregation flags: defaults, values, and refusals that name the flag.
func TestDisaggregationFlags(t *testing.T) {
	o, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.cfg; c.Role != mockworker.RoleBoth || c.PrefillerHeader != "x-prefiller-host-port" ||
		c.KVTransferPerBlock != mockworker.DefaultKVTransferPerBlock || c.PrefillTimeout != mockworker.DefaultPrefillTimeout || c.PrefillStallsDecode {
		t.Fatalf("defaults %+v", c)
	}
	o, err = parse([]string{"--role", "decode", "--prefiller-header", "x-prefill", "--kv-transfer-per-block", "1ms",
		"--prefill-timeout", "5s", "--prefill-stalls-decode"})
	if err != nil {
		t.Fatal(err)
	}
	if c := o.cfg; c.Role != mockworker.RoleDecode || c.PrefillerHeader != "x-prefill" || c.KVTransferPerBlock != time.Millisecond ||
		c.PrefillTimeout != 5*time.Second || !c.PrefillStallsDecode {
		t.Fatalf("parsed %+v", c)
	}
	for _, tc := range []struct {
		args []string
		frag string
	}{
		{[]string{"--role", "prefiller"}, `--role "prefiller": want both, prefill or decode`},
		{[]string{"--kv-transfer-per-block", "-1ms"}, "--kv-transfer-per-block must not be negative"},
		{[]string{"--prefill-timeout", "0s"}, "--prefill-timeout must be positive"},
		{[]string{"--prefiller-header", ""}, "--prefiller-header must not be empty"},
		{[]string{"--port", "0", "--prefiller-header", "x prefiller"}, "is not an HTTP header name"},
	} {
		err := run(context.Background(), tc.args, io.Discard, io.Discard, nil)
		if code := exitStatus(err, io.Discard); code != 2 || !strings.Contains(err.Error(), tc.frag) {
			t.Errorf("%q: exit status %d (%v), want 2 and %q", tc.args, code, err, tc.frag)
		}
	}
}

// A prefill-role worker started from the command line answers a prefill
// stage with its advertised address as the place to pull the KV from.
func TestPrefillRoleAdvertisesItsAddress(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--port", "0", "--role", "prefill", "--advertise-host", "10.1.2.3", "--kv-events=false",
			"--prefill-time-per-token", "0s", "--decode-time-per-token", "0s", "--log-level", "error"}, io.Discard, io.Discard,
			func(a string) { addrc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		KV map[string]any `json:"kv_transfer_params"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(addr, ":")
	if got.KV["remote_host"] != "10.1.2.3" || fmt.Sprint(got.KV["remote_port"]) != port || fmt.Sprint(got.KV["remote_block_ids"]) != "[0 1]" {
		t.Fatalf("kv_transfer_params %v (served on %s)", got.KV, addr)
	}
}
