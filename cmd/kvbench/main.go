// Command kvbench measures kvselect: every subcommand reads its flags and
// calls one harness under bench/ (bench/demo, bench/vsepp, bench/routesim,
// bench/soak, …), which runs the measurement and prints its table. `kvbench
// <subcommand> -h` lists a subcommand's flags.
//
// The side-by-side run against llm-d-kv-cache-manager lives in the nested
// module bench/peer (make bench-peer), so that peer never enters kvselect's
// go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
)

const usage = `usage: kvbench <subcommand> [flags]

Subcommands:
  index     replay a Mooncake trace against kvselect's KV index
  rest      closed-loop HTTP load on the REST API (select_and_reserve + delete)
  extproc   per-request overhead of the ext_proc picker (or the same lifecycle over REST)
  replicas  two replicas selecting concurrently, with replica sync off and on: per-worker load spread
  route     routing-policy comparison on a Mooncake trace over simulated workers
  pd        disaggregated prefill/decode: aggregated vs always-remote vs conditional P/D on long-prompt chat sessions, simulated (-mode sim) or with kvselect and mock worker processes (-mode real)
  flow      flow control: a tenant with long prompts and one with short prompts on a saturated pool, with flow control off, count and cost fairness (-mode sim or real)
  demo      kvselect + engine processes on loopback (mock workers or llm-d-inference-sim), a trace slice through ext_proc vs round-robin
  vs-epp    kvselect's picker and llm-d's endpoint picker side by side: same engines, same trace, through envoysim
  suite     every picker of vs-epp over workloads × engine families × engine shapes: one table, one JSON, one SVG, each cell's goals
  text      text chat sessions through the picker: --tokenize pool vs the approximate text index vs token ids vs round-robin, on mock workers
  health    kvselect + mock worker processes: one worker fails mid-run (ejection, trials, restoration); optional direct traffic that bypasses kvselect, with and without engine metrics
  observe   kvselect + mock workers scraped by a real Prometheus, the status page in headless Chromium: checks the Grafana dashboard's queries and the alert rules, saves screenshots
  scale     selection, KV-event ingest and replica-mesh costs as the fleet grows (64 to 16,384 ranks, 1 to 8 replicas), in process
  soak      kvselect replicas, mock workers and traffic for an hour under seeded faults (workers, KV publishers, replicas, clients); checks for leaked load, index drift, resource growth and 5xx
  otlp-sink an OTLP trace receiver that counts spans (the other end of bench/tracing-overhead.sh)
  floor-picker  an ext_proc picker that does only what the protocol requires (vs-epp's picker "floor", demo -gateway-floor)

Run 'kvbench <subcommand> -h' for the flags.
`

// subcommand defines its flags on fs (named and writing to stderr) and
// returns the call to make once args, its command line, are parsed.
type subcommand func(fs *flag.FlagSet, args []string) func(ctx context.Context, stdout, stderr io.Writer) error

var subcommands = map[string]subcommand{
	"index": indexCmd, "rest": restCmd, "extproc": extprocCmd, "replicas": replicasCmd, "otlp-sink": otlpSinkCmd,
	"route": routeCmd, "pd": pdCmd, "flow": flowCmd,
	"demo": demoCmd, "vs-epp": vsEPPCmd, "suite": suiteCmd, "text": textCmd, "health": healthCmd, "observe": observeCmd, "soak": soakCmd,
	"scale": scaleCmd, "floor-picker": floorPickerCmd,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "kvbench:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return nil
	}
	sub, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown subcommand %q", args[0])
	}
	fs := flag.NewFlagSet("kvbench "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	call := sub(fs, args[1:])
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return call(ctx, stdout, stderr)
}
