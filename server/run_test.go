package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/logwatch"
	"github.com/kvselect/kvselect/internal/proctest"
)

// logBuffer collects the JSON log lines a running server writes from several
// goroutines.
type logBuffer = logwatch.Buffer

// listeningAddr returns the addr of the startup line in JSON logs, if written.
func listeningAddr(logs string) (string, bool) {
	return logwatch.Attr(logs, "kvselect listening", "addr")
}

// runWith runs the server with the environment lookup, help output and log
// output the tests give it.
func runWith(ctx context.Context, args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) error {
	return Run(ctx, args, WithEnv(lookup), WithStdout(stdout), WithStderr(stderr))
}

// withoutKVEvents is an environment with KV events off: the index learns
// from bookings, so workers need no engine behind them.
func withoutKVEvents(k string) (string, bool) {
	if k == "DYN_ROUTER_USE_KV_EVENTS" {
		return "false", true
	}
	return "", false
}

// background is a server Run started by runInBackground.
type background struct {
	addrs  Listening
	logs   *logBuffer
	cancel context.CancelFunc
	done   chan error // Run's result, read once
	err    error      // Run's result after stop
	ended  bool
}

// runInBackground runs the server on 127.0.0.1 with ports the kernel picks
// (args may choose others), JSON logs and env, and returns once it listens.
// If the test does not stop it, the test's cleanup does, and then Run must
// have returned nil.
func runInBackground(t *testing.T, env func(string) (string, bool), args []string, opts ...Option) *background {
	t.Helper()
	return runArgsInBackground(t, env, append([]string{"--host", "127.0.0.1", "--port", "0", "--log-format", "json"}, args...), opts...)
}

// runArgsInBackground is runInBackground with exactly the arguments given.
func runArgsInBackground(t *testing.T, env func(string) (string, bool), args []string, opts ...Option) *background {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &background{logs: &logBuffer{}, cancel: cancel, done: make(chan error, 1)}
	listening := make(chan Listening, 1)
	opts = append([]Option{WithEnv(env), WithStdout(io.Discard), WithStderr(b.logs),
		WithListening(func(l Listening) { listening <- l })}, opts...)
	go func() {
		b.done <- Run(ctx, args, opts...)
	}()
	t.Cleanup(func() {
		if !b.ended {
			if err := b.stop(20 * time.Second); err != nil {
				t.Errorf("Run: %v\n%s", err, b.logs.String())
			}
		}
	})
	select {
	case b.addrs = <-listening:
		return b
	case err := <-b.done:
		b.ended = true
		t.Fatalf("Run ended before listening: %v\n%s", err, b.logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("not listening after 60 s:\n%s", b.logs.String())
	}
	return nil
}

// rest is the REST API's base URL.
func (b *background) rest() string { return "http://" + b.addrs.REST.String() }

// stop cancels Run and returns its result, or an error when it did not
// return within timeout.
func (b *background) stop(timeout time.Duration) error {
	b.cancel()
	if b.ended {
		return b.err
	}
	select {
	case b.err = <-b.done:
		b.ended = true
		return b.err
	case <-time.After(timeout):
		return fmt.Errorf("Run did not return within %v of the cancellation", timeout)
	}
}

func TestRunServesUntilCancelledThenStopsCleanly(t *testing.T) {
	srv := runInBackground(t, noEnv, nil)
	addr, logs := srv.addrs.REST.String(), srv.logs
	if logged, ok := listeningAddr(logs.String()); !ok || logged != addr {
		t.Errorf("startup log names %q, want %s", logged, addr)
	}
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health = %d", resp.StatusCode)
	}
	if err := srv.stop(15 * time.Second); err != nil {
		t.Fatalf("run = %v, want nil after cancellation", err)
	}
	for _, want := range []string{`"msg":"shutting down"`, `"msg":"selection service stopped admitting selections"`, `"msg":"shutdown complete"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Errorf("%s still accepts connections after run returned", addr)
	}
}

// TestShutdownStopsTheServiceBeforeDraining pins the order of the graceful
// stop: the service stops first, so a request still in flight
// while the HTTP server drains gets 503 "selection service is shutting down"
// instead of changing state. The request is held with its body half-sent
// across the start of the shutdown: its handler is already running (Shutdown
// waits for it) but reaches the service only once the body is complete.
// (Go's server drops requests whose headers arrive after Shutdown begins, so
// DELETE /workers during shutdown is left to the selection and httpadmin tests.)
func TestShutdownStopsTheServiceBeforeDraining(t *testing.T) {
	srv := runInBackground(t, noEnv, nil)
	addr, logs := srv.addrs.REST.String(), srv.logs

	body := `{"worker_id":1,"endpoint":"http://127.0.0.1:8000","block_size":16,"kv_events_endpoint":"tcp://127.0.0.1:5557"}`
	upsert := halfSend(t, addr, "POST /workers HTTP/1.1\r\nHost: kvselect\r\nContent-Type: application/json\r\n"+
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body))+body[:10])
	time.Sleep(200 * time.Millisecond) // let the server read the headers and start the handler

	srv.cancel()
	proctest.Eventually(t, "the service to stop", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), `"msg":"selection service stopped admitting selections"`)
	})
	if code, resp := finish(t, upsert, body[10:]); code != http.StatusServiceUnavailable || !strings.Contains(resp, "selection service is shutting down") {
		t.Errorf("POST /workers during shutdown = %d %s, want 503 selection service is shutting down", code, resp)
	}
	if err := srv.stop(15 * time.Second); err != nil {
		t.Fatalf("run = %v, want nil", err)
	}
}

func halfSend(t *testing.T, addr, head string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

func finish(t *testing.T, c net.Conn, rest string) (int, string) {
	t.Helper()
	if _, err := io.WriteString(c, rest); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRunFailsWhenThePortIsTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	status, _, stderr := runArgs(t, "--host", "127.0.0.1", "--port", port)
	if status != 1 || !strings.Contains(stderr, "address already in use") {
		t.Errorf("status %d, stderr %q; want 1 and the bind error", status, stderr)
	}
}

func TestIPv4HostsBindIPv4OnlyAsInDynamo(t *testing.T) {
	for host, want := range map[string]string{
		"0.0.0.0": "tcp4", "127.0.0.1": "tcp4",
		"::": "tcp", "::1": "tcp", "::ffff:10.0.0.1": "tcp", "": "tcp", "localhost": "tcp",
	} {
		if got := listenNetwork(host); got != want {
			t.Errorf("listenNetwork(%q) = %q, want %q", host, got, want)
		}
	}
}

// TestShutdownTimeoutClosesStragglers: a request that never completes holds the
// drain for --shutdown-timeout only; then run closes it and fails (status 1).
func TestShutdownTimeoutClosesStragglers(t *testing.T) {
	srv := runInBackground(t, noEnv, []string{"--shutdown-timeout", "300ms"})
	addr, logs := srv.addrs.REST.String(), srv.logs
	halfSend(t, addr, "POST /workers HTTP/1.1\r\nHost: kvselect\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	time.Sleep(200 * time.Millisecond) // let the server read the headers and start the handler
	start := time.Now()
	err := srv.stop(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "graceful shutdown") || ExitStatus(err, io.Discard) != 1 {
		t.Fatalf("run = %v, want a graceful-shutdown error with status 1", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %v with a 300ms timeout", took)
	}
	if !strings.Contains(logs.String(), "graceful shutdown timed out") {
		t.Errorf("logs lack the timeout:\n%s", logs.String())
	}
}

// writeAtomically replaces path's content in one rename, as a ConfigMap
// update does: a reader never sees half a file.
func writeAtomically(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}
