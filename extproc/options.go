package extproc

import (
	"runtime"

	"google.golang.org/grpc"
)

// ServerOptions are the grpc.Server options the picker is run and measured
// with: a fixed pool of stream workers (one per P) instead of a new goroutine
// per stream — every HTTP request is a stream, so streams are short and many.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))}
}
