//go:build unix

package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinaryServesReloadsAndStopsOnSignals builds cmd/kvselect, runs it as a
// real process on a free loopback port and drives its lifecycle over HTTP and
// signals: live, not ready with an empty catalog, ready after POST /workers,
// the config file's policy parameters re-read on SIGHUP, then a clean exit 0
// on SIGTERM.
func TestBinaryServesReloadsAndStopsOnSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the kvselect binary; skipped with -short")
	}
	bin, err := kvselectBinary()
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "kvselect.yaml")
	if err := os.WriteFile(config, []byte("policy:\n  name: kv-cost\n  parameters:\n    router_temperature: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	const shutdownTimeout = 5 * time.Second
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", "0", "--log-format", "json",
		"--shutdown-timeout", shutdownTimeout.String(), "--config", config)
	cmd.Env = withoutRouterEnv(os.Environ())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	var waitErr error
	exited := make(chan struct{})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(io.TeeReader(stderr, &logs))
		for sc.Scan() {
			if addr, ok := listeningAddr(sc.Text()); ok {
				addrc <- addr
			}
		}
		waitErr = cmd.Wait() // after stderr is drained, as exec requires
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	var base string
	select {
	case addr := <-addrc:
		base = "http://" + addr
	case <-exited:
		t.Fatalf("kvselect exited before listening: %v\n%s", waitErr, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("no startup line within 30s:\n%s", logs.String())
	}

	expect(t, "GET", base+"/health", "", http.StatusOK)
	if body := expect(t, "GET", base+"/ready", "", http.StatusServiceUnavailable); !strings.Contains(body, `"ready":false`) {
		t.Errorf("/ready on an empty catalog: %s", body)
	}
	expect(t, "POST", base+"/workers", `{"worker_id":1,"endpoint":"http://127.0.0.1:8000","block_size":16,"kv_events_endpoint":"tcp://127.0.0.1:5557"}`, http.StatusCreated)
	body := expect(t, "GET", base+"/ready", "", http.StatusOK)
	var ready struct {
		Ready              bool `json:"ready"`
		SchedulableWorkers int  `json:"schedulable_workers"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || !ready.Ready || ready.SchedulableWorkers != 1 {
		t.Errorf("/ready after POST /workers: %s (%v)", body, err)
	}

	if err := os.WriteFile(config, []byte("policy:\n  name: kv-cost\n  parameters:\n    router_temperature: 0.25\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"config reloaded"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload within 30s of SIGHUP:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), `"router_temperature":0.25`) {
		t.Errorf("the reload does not name the new parameter:\n%s", logs.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("kvselect exited with %v after SIGTERM, want status 0\n%s", waitErr, logs.String())
		}
	case <-time.After(shutdownTimeout + 5*time.Second):
		t.Fatalf("kvselect still running %v after SIGTERM\n%s", shutdownTimeout+5*time.Second, logs.String())
	}
	for _, want := range []string{`"msg":"shutting down"`, `"msg":"shutdown complete"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
}

// withoutRouterEnv keeps the host's DYN_* and KVSELECT_* variables out of the
// child, so the test does not depend on the machine that runs it.
func withoutRouterEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "DYN_") && !strings.HasPrefix(kv, "KVSELECT_") {
			out = append(out, kv)
		}
	}
	return out
}

// expect sends a request and checks the status, returning the body.
func expect(t *testing.T, method, url, body string, status int) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("%s %s = %d %s, want %d", method, url, resp.StatusCode, b, status)
	}
	return string(b)
}
