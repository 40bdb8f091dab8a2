// Command kvselect is the selection server: Dynamo's standalone selection
// service (python -m dynamo.select_service) with the same flags, environment
// and REST API, plus the Envoy ext_proc endpoint picker. `kvselect --help`
// lists every flag and variable; package server holds the program.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvselect/kvselect/server"
)

// version is set at release time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version or VCS revision from the build info is shown.
var version = ""

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal ends the process the default way
	os.Exit(server.ExitStatus(server.Run(ctx, os.Args[1:], server.WithVersion(version)), os.Stderr))
}
