package main

import (
	"context"
	"flag"
	"io"
	"log/slog"

	"github.com/kvselect/kvselect/bench/floorpicker"
	"github.com/kvselect/kvselect/extproc"
)

// floorPickerCmd serves bench/floorpicker's ext_proc picker, which does only
// what the protocol requires, on kvselect's gRPC server options: vs-epp
// starts it as the picker "floor", and the demo with -gateway-floor.
func floorPickerCmd(fs *flag.FlagSet, _ []string) func(ctx context.Context, stdout, stderr io.Writer) error {
	var f floorpicker.Flags
	f.Register(fs)
	return func(ctx context.Context, _, stderr io.Writer) error {
		return f.Serve(ctx, extproc.ServerOptions(), slog.New(slog.NewTextHandler(stderr, nil)))
	}
}
