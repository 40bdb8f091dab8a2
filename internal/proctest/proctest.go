// Package proctest holds the small helpers of tests that drive real
// processes on loopback (kvselect, engines, gateways): a free port, a
// condition polled until a deadline, the tail of a process's output for a
// failure message. Test code only.
package proctest

import (
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/peerproc"
)

// FreePort is a loopback TCP port nobody listened on a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Eventually polls cond every 10 ms until it holds, failing the test after
// limit with what it waited for.
func Eventually(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Tail is the last n bytes of s, marked as cut when it is.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
