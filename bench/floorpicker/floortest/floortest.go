// Package floortest lets a test binary serve the floor picker, so that a
// harness under test starts it as a process of its own, as kvbench's
// floor-picker subcommand is started outside the tests.
package floortest

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/extproc"
)

// arg, as the test binary's first argument, makes it serve the floor.
const arg = "floor-picker"

// Command is a harness's floor-picker command in tests: this test binary.
func Command() []string { return []string{os.Args[0], arg} }

// Main is the package's TestMain: it serves the floor when the binary was
// started by Command, and runs the tests otherwise.
func Main(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == arg {
		os.Exit(serve(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func serve(args []string) int {
	var f floorpicker.Flags
	fs := flag.NewFlagSet(arg, flag.ContinueOnError)
	f.Register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := f.Serve(ctx, extproc.ServerOptions(), slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "floor-picker:", err)
		return 1
	}
	return 0
}
