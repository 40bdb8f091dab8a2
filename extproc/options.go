package extproc

import (
	"runtime"

	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/internal/vtcodec"
)

// StreamWorkers is the size of the gRPC server's stream worker pool. Every
// HTTP request is one ext_proc stream that lives as long as the request, so
// workers are busy for the whole response; a stream that finds no idle worker
// gets a fresh goroutine, whose stack then grows (copied twice or three times)
// through the picker's call depth. A pool as large as the usual number of
// requests in flight keeps grown stacks in use: 256 idle workers hold a few
// MB. Measured in docs/benchmarks.md (the stack copies were 5 % of the
// server's CPU with a pool of GOMAXPROCS workers at 64 streams).
const StreamWorkers = 256

// ServerOptions are the grpc.Server options the picker is run and measured
// with: the stream worker pool above and the vtprotobuf encoder
// (internal/vtcodec) for the ~46 messages of each request.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(uint32(max(StreamWorkers, runtime.GOMAXPROCS(0)))),
		grpc.ForceServerCodecV2(vtcodec.NewCodec()),
	}
}
