package vsepp

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

// floorArg makes this test binary serve the floor picker instead of running
// the tests: the harness starts the picker "floor" as a process of its own,
// as kvbench's floor-picker subcommand does outside the tests.
const floorArg = "floor-picker"

// floorCommand is Config.FloorPicker in the tests: this binary.
func floorCommand() []string { return []string{os.Args[0], floorArg} }

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == floorArg {
		os.Exit(serveFloor(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func serveFloor(args []string) int {
	var f floorpicker.Flags
	fs := flag.NewFlagSet(floorArg, flag.ContinueOnError)
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
