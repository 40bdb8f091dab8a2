package peerproc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Skipf and Fatalf instead of ending
// the test, to check which one binary chooses.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Skipf(format string, a ...any)  { r.skipped = fmt.Sprintf(format, a...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestBinaryLookup(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "peer")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const env, req = "PEERPROC_TEST_BIN", "PEERPROC_TEST_REQUIRE"
	cases := []struct {
		name, value, require string
		want, skip, fail     bool
	}{
		{"set", exe, "", true, false, false},
		{"unset", "", "", false, true, false},
		{"unset but required", "", "1", false, false, true},
		{"missing file", exe + ".gone", "", false, true, false},
		{"not executable, required", plain, "1", false, false, true},
		{"a directory", t.TempDir(), "", false, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(env, tc.value)
			t.Setenv(req, tc.require)
			r := &recorder{TB: t}
			got := binary(r, env, "build it", req)
			if (got == exe) != tc.want || (r.skipped != "") != tc.skip || (r.failed != "") != tc.fail {
				t.Fatalf("binary = %q, skipped %q, failed %q", got, r.skipped, r.failed)
			}
			if msg := r.skipped + r.failed; msg != "" && (!strings.Contains(msg, env) || !strings.Contains(msg, "build it")) {
				t.Fatalf("message %q does not name %s and how to get the binary", msg, env)
			}
		})
	}
}

func TestStartSimNeedsAPort(t *testing.T) {
	if _, err := StartSim(context.Background(), Sim{Binary: "/bin/true"}); err == nil {
		t.Fatal("started a simulator on port 0")
	}
}

// TestStartSimUntilHealthy: a simulator that exits 0 without serving (as it
// does on a startup failure) is reported, and a real one is healthy when
// StartSim returns.
func TestStartSimUntilHealthy(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := StartSim(context.Background(), Sim{Binary: "/bin/true", Port: port}); err == nil ||
		!strings.Contains(err.Error(), "exited") {
		t.Fatalf("a process that exits at once: %v, want an error saying it exited", err)
	}
	bin := SimBinary(t)
	s, err := StartSim(context.Background(), Sim{Binary: bin, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	resp, err := http.Get(s.URL() + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("not healthy after StartSim: %v", err)
	}
	resp.Body.Close()
	if want := fmt.Sprintf("kv@127.0.0.1:%d@fake-model", port); s.Topic() != want {
		t.Fatalf("topic %q, want %q", s.Topic(), want)
	}
}

// TestFreePortIsBelowTheEphemeralRange: ports for processes to listen on
// come from outside the range the kernel picks source ports from, so an
// outgoing connection elsewhere cannot take one before its process starts.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	start := ephemeralStart()
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < 10000 || p >= start {
			t.Fatalf("FreePort = %d, want one in [10000, %d)", p, start)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}

// TestFreePortNeverRepeats: ports are checked free, not held, so without the
// record two calls could return the same one; 2,000 draws from the ~22,000
// ports below the ephemeral range would repeat dozens of times.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := make(map[int]bool)
	for i := range 2000 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("draw %d: port %d handed out twice", i, p)
		}
		seen[p] = true
	}
}
