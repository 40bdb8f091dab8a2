package fleet

import (
	"flag"
	"os"

	"github.com/kvselect/kvselect/bench/benchflag"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// Binaries are the programs the harnesses run; the flags default to `make
// build`'s paths and to the peers' environment variables.
type Binaries struct {
	KVSelect, MockWorker string
	Sim                  string // llm-d-inference-sim
	EPP                  string // llm-d's endpoint picker
}

// Register defines -kvselect and -mockworker.
func (b *Binaries) Register(fs *flag.FlagSet) {
	fs.StringVar(&b.KVSelect, "kvselect", "bin/kvselect", "kvselect `binary`")
	fs.StringVar(&b.MockWorker, "mockworker", "bin/kvselect-mockworker", "mock worker `binary`")
}

// RegisterSim defines -sim-bin (and its old spelling -sim).
func (b *Binaries) RegisterSim(fs *flag.FlagSet) {
	fs.StringVar(&b.Sim, "sim-bin", os.Getenv(peerproc.EnvSim), "llm-d-inference-sim `binary` (default $"+peerproc.EnvSim+")")
	benchflag.Alias(fs, "sim", "sim-bin")
}

// RegisterEPP defines -epp-bin.
func (b *Binaries) RegisterEPP(fs *flag.FlagSet) {
	fs.StringVar(&b.EPP, "epp-bin", os.Getenv(peerproc.EnvEPP), "llm-d endpoint picker `binary` (default $"+peerproc.EnvEPP+")")
}

// String and Set make a Family the -engine-family flag; Validate methods
// check its value.
func (f Family) String() string { return string(f) }

// Set names the family.
func (f *Family) Set(v string) error {
	*f = Family(v)
	return nil
}

// Spec is the fleet a harness runs, as its command line sets it: Workers
// engines of Family, each running as Engine says, their logs (and the
// harness's results) in Out.
type Spec struct {
	Binaries
	Family  Family
	Workers int
	Engine  Engine
	Out     string
}

// Register defines -kvselect, -mockworker, -workers, -out and the engines'
// -block-size, -pool-blocks, timing (benchflag.Timing) and -speedup; the
// values s holds are the defaults.
func (s *Spec) Register(fs *flag.FlagSet) {
	s.Binaries.Register(fs)
	fs.IntVar(&s.Workers, "workers", s.Workers, "`engines` (processes)")
	fs.StringVar(&s.Out, "out", s.Out, "`directory` for the results and the processes' logs")
	e := &s.Engine
	fs.IntVar(&e.BlockSize, "block-size", e.BlockSize, "engines' KV block size, in tokens")
	fs.IntVar(&e.PoolBlocks, "pool-blocks", e.PoolBlocks, "engines' KV pool, in `blocks` (the mock's --num-gpu-blocks, the simulator's --kv-cache-size)")
	benchflag.Alias(fs, "kv-blocks", "pool-blocks")
	benchflag.Timing(fs, &e.PrefillPerToken, &e.DecodePerToken, "before -speedup")
	fs.Float64Var(&e.Speedup, "speedup", e.Speedup, "engines' timing speed-up: the per-token times are divided by it (0: none)")
}

// RegisterFamily defines -engine-family and -sim-bin, for the harnesses
// that run either family.
func (s *Spec) RegisterFamily(fs *flag.FlagSet) {
	fs.Var(&s.Family, "engine-family", "`engines`: "+string(FamilyMock)+" (kvselect's mock workers) or "+string(FamilySim)+" (llm-d-inference-sim processes)")
	s.Binaries.RegisterSim(fs)
}
