// Command kvselect-mockworker is a simulated vLLM-like inference engine (package
// mockworker): an OpenAI-compatible HTTP server with a KV block pool, prefix
// caching and LRU eviction per data-parallel rank, publishing real vLLM KV
// events on ZMQ, and optionally registering itself with a kvselect REST API.
// `kvselect-mockworker --help` lists the flags; run.go holds the program.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal ends the process the default way
	os.Exit(exitStatus(run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil), os.Stderr))
}

// exitStatus is 0 for success, 2 for a usage error, 1 otherwise.
func exitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "kvselect-mockworker:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}
