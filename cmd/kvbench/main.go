// Command kvbench measures kvselect. `kvbench index` replays a Mooncake trace
// through a mock engine per worker into kvselect's KV index, timing every lookup
// and the event application, and prints a table (and optionally JSON).
// `kvbench rest` is a closed-loop HTTP/1.1 load generator for the REST API
// (select_and_reserve + delete), against an in-process or a loopback server.
//
// `kvbench demo` runs kvselect with real engine processes through its ext_proc
// picker against round-robin; `kvbench vs-epp` runs kvselect's picker and
// llm-d's endpoint picker side by side on the same engines and trace.
//
// The side-by-side run against llm-d-kv-cache-manager lives in the nested module
// bench/peer (make bench-peer), so that peer never enters kvselect's go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"

	"github.com/kvselect/kvselect/bench/kvtarget"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
)

const usage = `usage: kvbench <index|rest|route|extproc|replicas|demo|vs-epp|text|health|pd|flow|observe|otlp-sink|soak> [flags]

Subcommands:
  replicas two replicas selecting concurrently, with replica sync off and on: per-worker load spread
  index   replay a Mooncake trace against kvselect's KV index
  rest    closed-loop HTTP load on the REST API (select_and_reserve + delete)
  route   routing-policy comparison on a Mooncake trace over simulated workers
  demo    kvselect + engine processes on loopback (mock workers or llm-d-inference-sim), a trace slice through ext_proc vs round-robin
  vs-epp  kvselect's picker and llm-d's endpoint picker side by side: same llm-d-inference-sim engines, same trace, through envoysim
  extproc per-request overhead of the ext_proc picker (or the same lifecycle over REST)
  health  kvselect + mock worker processes: one worker fails mid-run (ejection, trials, restoration); optional direct traffic that bypasses kvselect, with and without engine metrics
  pd      disaggregated prefill/decode: aggregated vs always-remote vs conditional P/D on long-prompt chat sessions, simulated (-mode sim) or with kvselect and mock worker processes (-mode real)
  flow    flow control: a tenant with long prompts and one with short prompts on a saturated pool, with flow control off, count and cost fairness (simulation)
  observe kvselect + mock workers scraped by a real Prometheus, the status page in headless Chromium: checks the Grafana dashboard's queries and the alert rules, saves screenshots
  soak    kvselect replicas, mock workers and traffic for an hour under seeded faults (workers, KV publishers, replicas, clients); checks for leaked load, index drift, resource growth and 5xx
  otlp-sink an OTLP trace receiver that counts spans (the other end of bench/tracing-overhead.sh)
  text    text chat sessions through the picker: --tokenize pool vs the approximate text index vs token ids vs round-robin, on mock workers

Run 'kvbench <subcommand> -h' for the flags.
`

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
	switch args[0] {
	case "replicas":
		return runReplicas(ctx, args[1:], stdout, stderr)
	case "index":
		return runIndex(ctx, args[1:], stdout, stderr)
	case "rest":
		return runRest(ctx, args[1:], stdout, stderr)
	case "route":
		return runRoute(ctx, args[1:], stdout, stderr)
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "extproc":
		return runExtProc(ctx, args[1:], stdout, stderr)
	case "text":
		return runText(ctx, args[1:], stdout, stderr)
	case "health":
		return runHealth(ctx, args[1:], stdout, stderr)
	case "vs-epp":
		return runVsEPP(ctx, args[1:], stdout, stderr)
	case "pd":
		return runPD(ctx, args[1:], stdout, stderr)
	case "flow":
		return runFlow(ctx, args[1:], stdout, stderr)
	case "observe":
		return runObserve(ctx, args[1:], stdout, stderr)
	case "soak":
		return runSoak(ctx, args[1:], stdout, stderr)
	case "otlp-sink":
		return runOTLPSink(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown subcommand %q", args[0])
}

func runIndex(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench index", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var m mooncake.Flags
	m.Register(fs, "bench/testdata/mooncake/conversation_trace.jsonl.gz")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	noReserve := fs.Bool("no-reserve", false, "do not pre-size kvselect's per-worker tables from the engines' capacity (the service does, from total_kv_blocks)")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the timed replay to this file")
	svgOut := fs.String("svg", "", "also write a chart of the results to this SVG `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "preparing the workload (%d mock engines)...\n", m.Config.Workers)
	w, err := m.Prepare()
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	kv, err := kvtarget.New(512)
	if err != nil {
		return err
	}
	if !*noReserve {
		kv.Reserve(w.Config().Workers, w.Config().BlocksPerWorker)
	}
	stopProfile, err := startCPUProfile(*prof)
	if err != nil {
		return err
	}
	defer stopProfile()
	res := w.Run(kv)
	if kv.Errors() > 0 {
		return fmt.Errorf("the index rejected %d events of a well-formed replay", kv.Errors())
	}
	st := kv.Index().Stats()
	fmt.Fprintf(stdout, "Mooncake replay: %s\n", m.Trace)
	fmt.Fprintf(stdout, "%d workers x %d blocks, %s placement, duplication %d; index now %d entries in %d nodes\n\n",
		res.Config.Workers, res.Config.BlocksPerWorker, res.Config.Assign, res.Config.TraceDuplication, st.Entries, st.Nodes)
	if err := report.Table(stdout, res); err != nil {
		return err
	}
	return writeOutputs(*jsonOut, map[string]any{"results": []mooncake.Result{res}, "index": st},
		*svgOut, "kvbench index: "+m.Trace, func() []report.Chart { return report.ReplayCharts(res) })
}

// startCPUProfile starts a CPU profile into path; stop ends it and closes
// the file. An empty path profiles nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// writeOutputs writes the results as JSON and the charts as SVG, each only
// when its path is set (the -json and -svg flags of every subcommand).
func writeOutputs(jsonPath string, results any, svgPath, title string, charts func() []report.Chart) error {
	if jsonPath != "" {
		if err := report.WriteJSON(jsonPath, results); err != nil {
			return err
		}
	}
	if svgPath != "" {
		return report.WriteSVG(svgPath, title, charts()...)
	}
	return nil
}
