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
	bin, config := binaryAndConfig(t, "policy:\n  name: kv-cost\n  parameters:\n    router_temperature: 0\n")

	const shutdownTimeout = 5 * time.Second
	p := startBinary(t, bin, "--shutdown-timeout", shutdownTimeout.String(), "--config", config)
	cmd, logs, exited := p.cmd, p.logs, p.exited
	base := "http://" + p.addr

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
		if p.waitErr != nil {
			t.Fatalf("kvselect exited with %v after SIGTERM, want status 0\n%s", p.waitErr, logs.String())
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

// TestSIGHUPAsSoonAsItListens: a SIGHUP sent the moment the server says it
// listens reloads it. The handler used to be installed after the listeners
// and the background work had started, so a signal in between took the
// default action and ended the process.
func TestSIGHUPAsSoonAsItListens(t *testing.T) {
	bin, config := binaryAndConfig(t, "policy:\n  name: kv-cost\n")
	p := startBinary(t, bin, "--config", config)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.logs.String(), `"msg":"config reloaded"`) {
		select {
		case <-p.exited:
			t.Fatalf("kvselect ended on a SIGHUP sent as it started listening (%v):\n%s", p.waitErr, p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload within 30s of SIGHUP:\n%s", p.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// binaryAndConfig builds kvselect (skipped with -short) and writes a config
// file with content for it.
func binaryAndConfig(t *testing.T, content string) (bin, config string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the kvselect binary; skipped with -short")
	}
	bin, err := kvselectBinary()
	if err != nil {
		t.Fatal(err)
	}
	config = filepath.Join(t.TempDir(), "kvselect.yaml")
	if err := os.WriteFile(config, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return bin, config
}

// process is a kvselect binary started by startBinary.
type process struct {
	cmd     *exec.Cmd
	logs    *logBuffer
	addr    string        // the REST API's host:port
	exited  chan struct{} // closed once it exited; waitErr is then set
	waitErr error
}

// startBinary runs bin on a free loopback port with JSON logs and args, and
// returns once its startup line names the address; the test's cleanup kills
// it if it still runs.
func startBinary(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--host", "127.0.0.1", "--port", "0", "--log-format", "json"}, args...)...)
	cmd.Env = withoutRouterEnv(os.Environ())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, logs: &logBuffer{}, exited: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(io.TeeReader(stderr, p.logs))
		for sc.Scan() {
			if addr, ok := listeningAddr(sc.Text()); ok {
				addrc <- addr
			}
		}
		p.waitErr = cmd.Wait() // after stderr is drained, as exec requires
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case p.addr = <-addrc:
	case <-p.exited:
		t.Fatalf("kvselect exited before listening: %v\n%s", p.waitErr, p.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("no startup line within 30s:\n%s", p.logs.String())
	}
	return p
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
