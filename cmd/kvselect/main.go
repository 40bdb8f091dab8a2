// Command kvselect is the selection server: Dynamo's standalone selection
// service (python -m dynamo.select_service) with the same flags, environment
// and REST API. `kvselect --help` lists both; run.go holds the program.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal ends the process the default way
	os.Exit(exitStatus(run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr), os.Stderr))
}
