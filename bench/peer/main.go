// Command peer replays one Mooncake workload against kvselect's KV index and, in
// the same process and run, against llm-d-kv-cache-manager's in-memory index (the
// index a Go user would otherwise pick), checks that both report the same
// overlaps, and prints them side by side with the ratio.
//
// It lives in its own module so llm-d and its dependencies never enter
// kvselect's go.mod. Run it with `make bench-peer` from the repository root.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/kvselect/kvselect/bench/kvtarget"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/peer/llmd"
	"github.com/kvselect/kvselect/bench/report"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "peer:", err)
		}
		os.Exit(2)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var m mooncake.Flags
	m.Register(fs, "../testdata/mooncake/conversation_trace.jsonl.gz")
	runs := fs.Int("runs", 3, "replays per target, alternating; the median (by combined ops/s) is reported")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	noReserve := fs.Bool("no-reserve", false, "do not pre-size kvselect's per-worker tables from the engines' capacity (the service does, from total_kv_blocks)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *runs < 1 {
		return fmt.Errorf("-runs must be at least 1")
	}
	w, err := m.Prepare()
	if err != nil {
		return err
	}
	var kvRuns, peerRuns []mooncake.Result
	for i := range *runs {
		fmt.Fprintf(stderr, "run %d/%d: kvselect...", i+1, *runs)
		kv, err := kvtarget.New(512)
		if err != nil {
			return err
		}
		if !*noReserve {
			kv.Reserve(w.Config().Workers, w.Config().BlocksPerWorker)
		}
		kvRes := w.Run(kv)
		if kv.Errors() != 0 {
			return fmt.Errorf("kvselect rejected %d events", kv.Errors())
		}
		fmt.Fprint(stderr, " llm-d...")
		peer, err := llmd.New(w.Config().Workers, llmd.ChainedKeys)
		if err != nil {
			return err
		}
		peerRes := w.Run(peer)
		fmt.Fprintln(stderr, " done")
		if kvRes.MatchSum != peerRes.MatchSum || kvRes.MatchDigest != peerRes.MatchDigest {
			return fmt.Errorf("the indexes disagree: kvselect matched %d workers in all (digest %x), llm-d %d (digest %x)",
				kvRes.MatchSum, kvRes.MatchDigest, peerRes.MatchSum, peerRes.MatchDigest)
		}
		kvRuns, peerRuns = append(kvRuns, kvRes), append(peerRuns, peerRes)
	}
	kvRes, peerRes := median(kvRuns), median(peerRuns)
	c := w.Config()
	fmt.Fprintf(stdout, "Mooncake replay %s: %d workers x %d blocks, %s placement, duplication %d, median of %d runs\n",
		m.Trace, c.Workers, c.BlocksPerWorker, c.Assign, c.TraceDuplication, *runs)
	fmt.Fprintf(stdout, "both indexes agree on every lookup (digest %016x)\n\n", kvRes.MatchDigest)
	if err := report.Table(stdout, kvRes, peerRes); err != nil {
		return err
	}
	if *jsonOut != "" {
		return report.WriteJSON(*jsonOut, map[string]any{"kvselect": kvRuns, "llm-d": peerRuns})
	}
	return nil
}

func median(rs []mooncake.Result) mooncake.Result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b mooncake.Result) int {
		switch {
		case a.OpsPerSec < b.OpsPerSec:
			return -1
		case a.OpsPerSec > b.OpsPerSec:
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}
