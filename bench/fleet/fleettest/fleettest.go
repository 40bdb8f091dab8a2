// Package fleettest gives the harness tests the binaries bench/fleet runs:
// kvselect and the mock worker built from this module, and the peers from
// their environment variables.
package fleettest

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvselect/kvselect/bench/fleet"
)

// Binaries builds kvselect and the mock worker into a temporary directory;
// the test is skipped with -short, for it runs real processes.
func Binaries(t testing.TB) fleet.Binaries {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs kvselect and mock worker processes; skipped with -short")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("needs the go command: %v", err)
	}
	dir := t.TempDir()
	build := exec.Command(goTool, "build", "-o", dir+"/",
		"github.com/kvselect/kvselect/cmd/kvselect", "github.com/kvselect/kvselect/cmd/kvselect-mockworker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return fleet.Binaries{KVSelect: filepath.Join(dir, "kvselect"), MockWorker: filepath.Join(dir, "kvselect-mockworker")}
}

// Trace is the Mooncake conversation trace, from a test in a package
// directory under bench/.
const Trace = "../testdata/mooncake/conversation_trace.jsonl.gz"
