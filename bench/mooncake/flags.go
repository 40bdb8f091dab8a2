package mooncake

import (
	"flag"
	"fmt"
)

// DefaultTrace is the conversation trace's path from the repository root,
// where the benchmark commands run.
const DefaultTrace = "bench/testdata/mooncake/conversation_trace.jsonl.gz"

// Slice is the part of a trace a run replays: Requests requests (all when
// 0) after the first Offset.
type Slice struct {
	Trace            string
	Requests, Offset int
}

// Register defines -trace, -requests and -offset; the values s holds are the
// defaults.
func (s *Slice) Register(fs *flag.FlagSet) {
	fs.StringVar(&s.Trace, "trace", s.Trace, "Mooncake trace (`path`, .jsonl or .jsonl.gz)")
	fs.IntVar(&s.Requests, "requests", s.Requests, "trace `requests` to replay (0: all)")
	fs.IntVar(&s.Offset, "offset", s.Offset, "skip this many trace requests first")
}

// Load reads the trace and cuts the slice.
func (s Slice) Load() ([]Request, error) {
	reqs, err := LoadTrace(s.Trace)
	if err != nil {
		return nil, err
	}
	if s.Offset < 0 || s.Offset >= len(reqs) {
		return nil, fmt.Errorf("-offset %d: the trace has %d requests", s.Offset, len(reqs))
	}
	end := len(reqs)
	if s.Requests > 0 {
		end = min(end, s.Offset+s.Requests)
	}
	return reqs[s.Offset:end], nil
}

// Flags are the command-line settings of a trace replay, shared by every
// trace-driven benchmark command so they spell and default them alike.
type Flags struct {
	Trace  string
	Config Config
	assign string
}

// Register defines the flags on fs; defaultTrace is the trace path default
// (commands run from different directories).
func (f *Flags) Register(fs *flag.FlagSet, defaultTrace string) {
	fs.StringVar(&f.Trace, "trace", defaultTrace, "Mooncake trace (.jsonl or .jsonl.gz)")
	fs.IntVar(&f.Config.Workers, "workers", 64, "synthetic workers, one mock engine each")
	fs.IntVar(&f.Config.BlocksPerWorker, "blocks", 16384, "KV block pool per mock engine")
	fs.StringVar(&f.assign, "assign", "random", "request placement: round-robin, prefix-hash or random")
	fs.Uint64Var(&f.Config.Seed, "seed", 1, "seed for -assign random")
	fs.IntVar(&f.Config.TraceDuplication, "dup", 1, "copies of the trace with disjoint block ids (scales the index)")
	fs.IntVar(&f.Config.MaxRequests, "max", 0, "replay at most this many requests (0 = all)")
	fs.BoolVar(&f.Config.BatchRemovals, "batch-removals", false, "one Removed event per request instead of one per block")
}

// Prepare loads the trace and pre-generates the workload the flags describe.
func (f *Flags) Prepare() (*Workload, error) {
	a, err := ParseAssign(f.assign)
	if err != nil {
		return nil, err
	}
	f.Config.Assign = a
	reqs, err := LoadTrace(f.Trace)
	if err != nil {
		return nil, fmt.Errorf("load trace: %w", err)
	}
	return Prepare(f.Config, reqs), nil
}
