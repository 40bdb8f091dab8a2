package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/kvlisten"
	"github.com/kvselect/kvselect/httpadmin"
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
