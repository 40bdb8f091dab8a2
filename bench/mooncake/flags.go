package mooncake

import (
	"flag"
	"fmt"
)

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
