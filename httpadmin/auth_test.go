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
	srv := startTokenServer(t, "select-token-0123456789abcdef select name=ray\n")
	return srv, runtime.NumGoroutine()
}

// startTokenServer serves the REST API authenticating with a token file of
// the given lines.
func startTokenServer(t *testing.T, lines string) *httptest.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := access.OpenTokenFile(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(newService(t, nil), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Auth: access.NewChain(tokens, nil, nil)}))
	t.Cleanup(srv.Close)
	return srv
}

// A request refused before its body is read — for its credentials, its
// route, its method, its content type — is answered, not reset: a client
// still writing a large body reads the refusal (the same drain as the 413's).
func TestRefusedLargeBodyIsAnsweredNotReset(t *testing.T) {
	for _, tc := range []struct {
		name, path, contentType string
		auth                    bool
		status                  int
		body                    string
	}{
		{"no credentials", "/select", "application/json", true, http.StatusUnauthorized, `{"error":"authentication required"}`},
		{"no such route", "/nope", "application/json", false, http.StatusNotFound, `{"error":"route not found"}`},
		{"wrong method", "/loads", "application/json", false, http.StatusMethodNotAllowed, `{"error":"method not allowed"}`},
		{"wrong content type", "/select", "text/plain", false, http.StatusUnsupportedMediaType, `{"error":"` + msgContentType + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := func(t *testing.T) (*httptest.Server, int) { return startOversizeServer(t, false) }
			if tc.auth {
				start = startAuthServer
			}
			srv, baseline := start(t)
			body := oversizeBody(9)
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
			head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: kvselect\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", tc.path, tc.contentType, len(body))
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
			if res.StatusCode != tc.status || string(got) != tc.body || !res.Close {
				t.Fatalf("%d close=%v %s, want %d %s", res.StatusCode, res.Close, got, tc.status, tc.body)
			}
			if tc.auth && res.Header.Get("WWW-Authenticate") != `Bearer realm="kvselect"` {
				t.Errorf("challenge %q", res.Header.Get("WWW-Authenticate"))
			}
			if tc.status == http.StatusMethodNotAllowed && res.Header.Get("Allow") == "" {
				t.Errorf("no Allow header: %v", res.Header)
			}
			conn.Close()
			checkHealthyAfter(t, srv, baseline)
		})
	}
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
