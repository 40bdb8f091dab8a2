package httpadmin

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/access"
)

// startAuthServer serves the REST API with a token file holding one select
// token.
func startAuthServer(t *testing.T) (*httptest.Server, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("select-token-0123456789abcdef select name=ray\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := access.OpenTokenFile(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(newService(t, nil), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Auth: access.NewChain(tokens, nil, nil)}))
	t.Cleanup(srv.Close)
	return srv, runtime.NumGoroutine()
}

// A request refused for its credentials is refused before its body is read;
// a client writing a large body first must still read the 401, not a reset
// (the same drain as the 413's).
func TestUnauthorizedLargeBodyIsAnsweredNotReset(t *testing.T) {
	srv, baseline := startAuthServer(t)
	body := oversizeBody(9)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	head := fmt.Sprintf("POST /select HTTP/1.1\r\nHost: kvselect\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(body); err != nil {
		t.Fatalf("writing the body: %v (the server reset the connection)", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") != `Bearer realm="kvselect"` ||
		string(got) != `{"error":"authentication required"}` {
		t.Fatalf("%d %v %s", res.StatusCode, res.Header, got)
	}
	conn.Close()
	checkHealthyAfter(t, srv, baseline)
}

// The same with Python's urllib, as Ray's tooling would send it.
func TestUnauthorizedLargeBodyPythonUrllib(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		if os.Getenv("KVSELECT_REQUIRE_PYTHON") == "1" {
			t.Fatalf("%s: %v (KVSELECT_REQUIRE_PYTHON=1)", python, err)
		}
		t.Skipf("%s not found (%v); set KVSELECT_REQUIRE_PYTHON=1 to fail instead", python, err)
	}
	srv, baseline := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", pythonPost, srv.URL+"/select").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := "401\n" + `{"error":"authentication required"}` + "\n"; string(out) != want {
		t.Fatalf("urllib got %q, want %q", out, want)
	}
	checkHealthyAfter(t, srv, baseline)
}

// A small body refused for its credentials gets the ordinary answer, on a
// connection that stays open (net/http drains small bodies itself).
func TestUnauthorizedSmallBodyKeepsTheConnection(t *testing.T) {
	srv, _ := startAuthServer(t)
	c := srv.Client()
	for range 3 {
		res, err := c.Post(srv.URL+"/select", "application/json", strings.NewReader(`{"model_name":"m","token_ids":[1,2,3,4]}`))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || res.Close || !bytes.Contains(raw, []byte("authentication required")) {
			t.Fatalf("%d close=%v %s", res.StatusCode, res.Close, raw)
		}
	}
}
