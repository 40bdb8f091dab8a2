// Package benchflag holds what kvbench's subcommands share on their command
// lines, so that every subcommand spells and reads a knob alike: the engines'
// timing (Timing), comma-separated lists, and hidden aliases for the
// spellings a flag had before (Alias).
//
// Deprecated spellings, accepted for one release but no longer shown by -h:
//
//	-prefill-per-token    is -prefill-time-per-token (route, pd, flow)
//	-decode-per-token     is -decode-time-per-token (route, pd)
//	-inter-token-latency  is -decode-time-per-token (vs-epp)
//	-decode-step          is -decode-time-per-token (flow)
//	-engines              is -engine-family (demo) and -workers (vs-epp)
//	-kv-blocks            is -pool-blocks (vs-epp)
//	-sim                  is -sim-bin (soak)
package benchflag

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// Timing defines the engines' timing flags on fs, bound to prefill and
// decode, whose values now are the defaults: -prefill-time-per-token, the
// prefill time per uncached prompt token, and -decode-time-per-token, the
// time per output token (the inter-token latency) — the spellings of the
// mock worker's flags. The old spellings stay as hidden aliases. note, when
// set, ends both usage lines.
func Timing(fs *flag.FlagSet, prefill, decode *time.Duration, note string) {
	if note != "" {
		note = " (" + note + ")"
	}
	fs.DurationVar(prefill, "prefill-time-per-token", *prefill, "engines' prefill time per uncached prompt token"+note)
	fs.DurationVar(decode, "decode-time-per-token", *decode, "engines' time per output token, the inter-token latency"+note)
	Alias(fs, "prefill-per-token", "prefill-time-per-token")
	for _, old := range []string{"decode-per-token", "inter-token-latency", "decode-step"} {
		Alias(fs, old, "decode-time-per-token")
	}
}

// Alias defines old on fs as a hidden spelling of the flag name, which must
// be defined already: setting either sets the same value. fs's usage then
// lists every flag but its aliases.
func Alias(fs *flag.FlagSet, old, name string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("benchflag: alias " + old + " of undefined flag " + name)
	}
	fs.Var(alias{f.Value}, old, "deprecated spelling of -"+name)
	fs.Usage = func() { printUsage(fs) }
}

// alias is the value of a hidden spelling: the flag's own value.
type alias struct{ flag.Value }

// printUsage is flag's default usage without the aliases.
func printUsage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(alias); !ok {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}

// CPUProfile is the -cpuprofile flag: a CPU profile of a run, written to
// the file it names.
type CPUProfile struct{ path string }

// Register defines -cpuprofile.
func (p *CPUProfile) Register(fs *flag.FlagSet) {
	fs.StringVar(&p.path, "cpuprofile", "", "write a CPU profile of the run to this `file`")
}

// Start starts the profile when the flag is set; stop ends it and closes
// the file.
func (p *CPUProfile) Start() (stop func(), err error) {
	if p.path == "" {
		return func() {}, nil
	}
	f, err := os.Create(p.path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// Split is a comma-separated list, each item trimmed, empty items dropped.
func Split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Ints reads a comma-separated list of positive integers.
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// Floats reads a comma-separated list of numbers in [0, hi] (hi 0: no upper
// bound).
func Floats(s string, hi float64) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v >= 0) || (hi > 0 && v > hi) || math.IsInf(v, 0) {
			if hi > 0 {
				return nil, fmt.Errorf("%q is not a number in [0, %g]", f, hi)
			}
			return nil, fmt.Errorf("%q is not a non-negative number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// Durations reads a comma-separated list of durations, none negative.
func Durations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q: want durations >= 0", f)
		}
		out = append(out, d)
	}
	return out, nil
}
