package scale

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/report"
)

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Nanoseconds())/1e3) }

func mib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// Table prints one table per part that ran.
func (r *Report) Table(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(r.Selection) > 0 {
		fmt.Fprintln(tw, "Selection on one core (GOMAXPROCS=1)")
		fmt.Fprintln(tw, "ranks\tworkers\tindexed blocks\tp50 µs\tp90 µs\tp99 µs\tmax µs\tCPU µs/request\thit share\tfleet MiB\tindex MiB\tdecoders MiB\tB/rank\tB/block\tdecoder B/rank\tpopulate s\t")
		for _, p := range r.Selection {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.3f\t%s\t%s\t%s\t%.0f\t%.1f\t%.0f\t%.1f\t\n", p.Ranks, p.Workers, p.IndexedBlocks,
				us(p.P50), us(p.P90), us(p.P99), us(p.Max), us(p.CPUPerRequest), p.HitShare, mib(p.FleetHeapBytes), mib(p.IndexHeapBytes),
				mib(p.DecoderHeapBytes), p.BytesPerRank, p.BytesPerBlock, p.DecoderPerRank, p.PopulateTime.Seconds())
		}
		fmt.Fprintln(tw)
	}
	if len(r.Ingest) > 0 {
		fmt.Fprintln(tw, "Ingest on one core (decode + apply, GOMAXPROCS=1)")
		fmt.Fprintln(tw, "engines\treq/s per engine\tevents/s per engine\tbatches/s per engine\tevents\tblocks stored+removed\tCPU s\tns/event\tns/block\tcores for all\t% core per engine\tsaturation events/s\tsaturation engines\t")
		for _, p := range r.Ingest {
			fmt.Fprintf(tw, "%d\t%g\t%.0f\t%.1f\t%d\t%d\t%.2f\t%.0f\t%.0f\t%.3f\t%.4f\t%.0f\t%.0f\t\n", p.Engines, p.RequestRate, p.EventsPerEngineSecond,
				p.BatchesPerEngineSecond, p.Events, p.Stored+p.Removed, p.CPU.Seconds(), p.NsPerEvent, p.NsPerBlock, p.CoresForEngines,
				100*p.CorePerEngine, p.SaturationEvents, p.SaturationEngines)
		}
		fmt.Fprintln(tw)
	}
	if len(r.Replicas) > 0 {
		fmt.Fprintf(tw, "Replica mesh (GOMAXPROCS=%d, all replicas in one process)\n", r.GoMaxProcs)
		fmt.Fprintln(tw, "replicas\toffered req/s\tserved req/s\tpublished/s per replica\treceived/s per replica\tdropped\tcores per replica\tmesh cores per replica\tmesh µs/received\tkept up\t")
		for _, p := range r.Replicas {
			fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%.3f\t%.3f\t%.1f\t%v\t\n", p.Replicas, p.Offered, p.Achieved, p.PublishedPerReplica,
				p.ReceivedPerReplica, p.Dropped, p.CoresPerReplica, p.MeshCoresPerReplica, p.MeshMicrosPerReceived, p.KeptUp)
		}
	}
	return tw.Flush()
}

// WriteFiles writes scale.json and one SVG per curve into dir.
func (r *Report) WriteFiles(dir string) error {
	if err := report.WriteJSON(filepath.Join(dir, "scale.json"), r); err != nil {
		return err
	}
	for name, charts := range r.Charts() {
		if err := report.WriteSVG(filepath.Join(dir, name+".svg"), charts.title, charts.charts...); err != nil {
			return err
		}
	}
	return nil
}

type svgFile struct {
	title  string
	charts []report.Chart
}

// Charts are the curves by file name: scale-selection, scale-memory,
// scale-ingest and scale-replicas (those whose part ran).
func (r *Report) Charts() map[string]svgFile {
	out := map[string]svgFile{}
	if len(r.Selection) > 0 {
		x := make([]float64, len(r.Selection))
		var p50, p99, cpu, perRank, perBlock, decoders []float64
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
		for i, p := range r.Selection {
			x[i] = float64(p.Ranks)
			p50, p99 = append(p50, ms(p.P50)), append(p99, ms(p.P99))
			cpu = append(cpu, ms(p.CPUPerRequest))
			perRank, perBlock = append(perRank, p.BytesPerRank/1024), append(perBlock, p.BytesPerBlock)
			decoders = append(decoders, p.DecoderPerRank/1024)
		}
		// The goals: p99 within 1 ms at 4,096 ranks and 5 ms at 16,384.
		goal := report.Line{Name: "p99 goal", X: []float64{4096, 16384}, Y: []float64{1, 5}}
		out["scale-selection"] = svgFile{"kvselect selection vs fleet size, one core", []report.Chart{
			{Title: "SelectAndReserve p50 and CPU per request", Unit: "ms", XLabel: "engine ranks (log scale)", LogX: true,
				Lines: []report.Line{{Name: "p50", X: x, Y: p50}, {Name: "CPU per request", X: x, Y: cpu}}},
			{Title: "SelectAndReserve p99", Unit: "ms", XLabel: "engine ranks (log scale)", LogX: true,
				Lines: []report.Line{{Name: "p99", X: x, Y: p99}, goal}},
		}}
		out["scale-memory"] = svgFile{"kvselect memory vs fleet size", []report.Chart{
			{Title: "Heap per rank", Unit: "KiB", XLabel: "engine ranks (log scale)", LogX: true,
				Lines: []report.Line{{Name: "registered, before any block", X: x, Y: perRank},
					{Name: "decoder batch buffers kept", X: x, Y: decoders}}},
			{Title: "Heap per indexed (rank, block)", Unit: "bytes", XLabel: "engine ranks (log scale)", LogX: true,
				Lines: []report.Line{{Name: "bytes per indexed block", X: x, Y: perBlock}}},
		}}
	}
	if len(r.Ingest) > 0 {
		x := make([]float64, len(r.Ingest))
		var cores, goal, ns []float64
		for i, p := range r.Ingest {
			x[i] = float64(p.Engines)
			cores, goal = append(cores, p.CoresForEngines), append(goal, 0.25*float64(p.Engines)/1024)
			ns = append(ns, p.NsPerEvent)
		}
		out["scale-ingest"] = svgFile{fmt.Sprintf("kvselect KV event ingest, engines at %g requests/s", r.Config.RequestRate), []report.Chart{
			{Title: "Cores to decode and index every engine's events", Unit: "cores", XLabel: "engine ranks (log scale)", LogX: true,
				Lines: []report.Line{{Name: "measured", X: x, Y: cores}, {Name: "goal: 25 % of a core per 1,024 engines", X: x, Y: goal}}},
			{Title: "CPU per event", Unit: "ns", XLabel: "engine ranks (log scale)", LogX: true,
				Lines: []report.Line{{Name: "ns per event", X: x, Y: ns}}},
		}}
	}
	if len(r.Replicas) > 0 {
		var cores, msgs []report.Line
		counts := []int{}
		for _, p := range r.Replicas {
			if !slices.Contains(counts, p.Replicas) {
				counts = append(counts, p.Replicas)
			}
		}
		for _, n := range counts {
			name := fmt.Sprintf("%d replicas", n)
			if n == 1 {
				name = "1 replica"
			}
			c, m := report.Line{Name: name}, report.Line{Name: name}
			for _, p := range r.Replicas {
				if p.Replicas != n {
					continue
				}
				c.X, c.Y = append(c.X, p.Offered), append(c.Y, p.CoresPerReplica)
				m.X, m.Y = append(m.X, p.Offered), append(m.Y, p.ReceivedPerReplica/1e3)
			}
			cores, msgs = append(cores, c), append(msgs, m)
		}
		out["scale-replicas"] = svgFile{"kvselect replica mesh vs fleet request rate", []report.Chart{
			{Title: "CPU per replica (selection + mesh)", Unit: "cores", XLabel: "fleet requests/s (log scale)", LogX: true, Lines: cores},
			{Title: "Mesh messages received per replica", Unit: "thousands per second", XLabel: "fleet requests/s (log scale)", LogX: true, Lines: msgs},
		}}
	}
	return out
}
