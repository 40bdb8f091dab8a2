// Package suite is `kvbench suite`: every picker of `kvbench vs-epp`
// (bench/vsepp) over a matrix of cells — workloads × engine families ×
// engine shapes — with one configuration for all of them, reported as one
// table, one JSON file and one SVG chart, with each cell's goals checked:
// kvselect's default against the better EPP configuration and against
// Dynamo's kv-cost.
package suite

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/report"
	"github.com/kvselect/kvselect/bench/vsepp"
	"github.com/kvselect/kvselect/bench/workload"
)

// Workloads.
const (
	// Conversation is the Mooncake conversation trace at 10× its pace.
	Conversation = "conversation"
	// ConversationText is the same as text prompts (kvselect tokenizes
	// through the engines, the EPP renders through one).
	ConversationText = "conversation-text"
	// SharedPrefix is inference-perf's shared_prefix shape of llm-d's
	// precise-prefix-cache-routing guide: 150 groups × 5 prompts, system
	// prompt 6,000 tokens, question 1,200, output 1,000 (capped like every
	// output here), at 20 requests/s. With the harness's 64 tokens per
	// 512-token trace block every length is divided by 8.
	SharedPrefix = "shared-prefix"
	// MultiTurn is the "few system prompts, multi-turn" case of GIE's
	// prefix-cache benchmark: 6 system prompts of 2,048 tokens, 5-turn
	// conversations of 512-token user turns and answers, 4 new
	// conversations a second, 2 s between turns (lengths ÷ 8 as above).
	MultiTurn = "multi-turn"
	// Ladder steps the conversation trace's arrival rate up (LadderRates):
	// one cell per step, as llm-d's guide steps its load.
	Ladder = "ladder"
)

// generators are the generated workloads, as documented above.
var generators = map[string]interface {
	Generate() ([]mooncake.Request, error)
}{
	SharedPrefix: workload.SharedPrefix{Groups: 150, PromptsPerGroup: 5, SystemTokens: 6000, QuestionTokens: 1200,
		OutputTokens: 1000, Rate: 20, Seed: 1},
	MultiTurn: workload.MultiTurn{Groups: 6, Conversations: 40, Turns: 5, SystemTokens: 2048, UserTokens: 512,
		AnswerTokens: 512, Rate: 4, ThinkMs: 2000, Seed: 1},
}

// Workloads are every workload, in the default order.
var Workloads = []string{Conversation, ConversationText, SharedPrefix, MultiTurn, Ladder}

// Shape is one engine shape.
type Shape struct {
	Name            string
	MaxNumSeqs      int
	PrefillPerToken time.Duration
}

// Shapes are the engine shapes: vs-epp's (4 requests at once, 20 µs per
// prompt token) and a wider, slower-prefilling engine.
var Shapes = []Shape{
	{Name: "seqs4", MaxNumSeqs: 4, PrefillPerToken: 20 * time.Microsecond},
	{Name: "seqs16-slow", MaxNumSeqs: 16, PrefillPerToken: 60 * time.Microsecond},
}

// Config is one suite run.
type Config struct {
	// Base is the vs-epp configuration every cell starts from: binaries,
	// peers, engines, pickers, pinning, goodput objectives. Its Out is the
	// suite's directory; each cell writes into a subdirectory.
	Base      vsepp.Config
	Families  []fleet.Family
	Workloads []string
	Shapes    []string
	Requests  int // per cell (0: the workload's whole trace, the conversation's Base.Requests)
	// Cells, when set, are the cells to run instead of the matrix of
	// Families × Shapes × Workloads: "family/shape/workload", the ladder's
	// as "family/shape/ladder@rate".
	Cells      []string
	LadderRate []float64 // requests per second, one cell each
	// Repeat runs the first cell this many times, to measure the run-to-run
	// spread the goals are read against.
	Repeat int
	Quiet  bool
	Args   string
}

// Cell is one cell's identity and its vs-epp report.
type Cell struct {
	Name     string        `json:"name"`
	Family   string        `json:"engine_family"`
	Workload string        `json:"workload"`
	Shape    string        `json:"shape"`
	Run      int           `json:"run"` // 1.. for repeats of the first cell
	Report   *vsepp.Report `json:"report"`
}

// Report is the suite's result.
type Report struct {
	Date  string `json:"date"`
	Args  string `json:"args"`
	Cells []Cell `json:"cells"`
}

// plan is the cells a configuration runs, each with its vs-epp config.
func (c *Config) plan() ([]Cell, []vsepp.Config, error) {
	var cells []Cell
	var cfgs []vsepp.Config
	add := func(fam fleet.Family, sh Shape, wl string, rate float64) error {
		vc, name, err := c.cell(fam, sh, wl, rate)
		if err != nil || vc == nil {
			return err // nil: not runnable with this family
		}
		cells = append(cells, Cell{Name: name, Family: string(fam), Workload: wl, Shape: sh.Name, Run: 1})
		cfgs = append(cfgs, *vc)
		return nil
	}
	for _, spec := range c.Cells {
		fam, sh, wl, rate, err := parseCell(spec)
		if err != nil {
			return nil, nil, err
		}
		if err := add(fam, sh, wl, rate); err != nil {
			return nil, nil, err
		}
	}
	families := c.Families
	if len(c.Cells) > 0 {
		families = nil
	}
	for _, fam := range families {
		for _, sn := range c.Shapes {
			i := slices.IndexFunc(Shapes, func(s Shape) bool { return s.Name == sn })
			if i < 0 {
				return nil, nil, fmt.Errorf("-shapes: unknown shape %q", sn)
			}
			sh := Shapes[i]
			for _, wl := range c.Workloads {
				steps := []float64{0}
				if wl == Ladder {
					steps = c.LadderRate
				}
				for _, rate := range steps {
					if err := add(fam, sh, wl, rate); err != nil {
						return nil, nil, err
					}
				}
			}
		}
	}
	if len(cells) == 0 {
		return nil, nil, errors.New("no cell to run")
	}
	for r := 2; r <= c.Repeat; r++ {
		cells = append(cells, Cell{Name: fmt.Sprintf("%s#%d", cells[0].Name, r), Family: cells[0].Family,
			Workload: cells[0].Workload, Shape: cells[0].Shape, Run: r})
		vc := cfgs[0]
		vc.Out = filepath.Join(c.Base.Out, fmt.Sprintf("%s-run%d", cells[0].Name, r))
		cfgs = append(cfgs, vc)
	}
	return cells, cfgs, nil
}

// parseCell reads a -cells entry: family/shape/workload, or
// family/shape/ladder@rate.
func parseCell(spec string) (fleet.Family, Shape, string, float64, error) {
	parts := strings.Split(spec, "/")
	if len(parts) != 3 {
		return "", Shape{}, "", 0, fmt.Errorf("-cells: %q is not family/shape/workload", spec)
	}
	i := slices.IndexFunc(Shapes, func(s Shape) bool { return s.Name == parts[1] })
	if i < 0 {
		return "", Shape{}, "", 0, fmt.Errorf("-cells: %q: unknown shape %q", spec, parts[1])
	}
	wl, rate := parts[2], 0.0
	if w, r, ok := strings.Cut(wl, "@"); ok {
		v, err := strconv.ParseFloat(r, 64)
		if err != nil || w != Ladder || !(v > 0) {
			return "", Shape{}, "", 0, fmt.Errorf("-cells: %q: a rate goes with the ladder only, as ladder@rate", spec)
		}
		wl, rate = w, v
	} else if wl == Ladder {
		return "", Shape{}, "", 0, fmt.Errorf("-cells: %q: the ladder's cell names its rate, as ladder@rate", spec)
	}
	return fleet.Family(parts[0]), Shapes[i], wl, rate, nil
}

// cell is the vs-epp configuration of one cell; nil when the family cannot
// run the workload with any of the pickers asked for.
func (c *Config) cell(fam fleet.Family, sh Shape, wl string, rate float64) (*vsepp.Config, string, error) {
	vc := c.Base
	vc.Family = fam
	vc.Engine.MaxNumSeqs, vc.Engine.PrefillPerToken = sh.MaxNumSeqs, sh.PrefillPerToken
	vc.Quiet = c.Quiet
	vc.Pickers = slices.Clone(c.Base.Pickers)
	name := fmt.Sprintf("%s/%s/%s", fam, sh.Name, wl)
	trace := ""
	switch wl {
	case Conversation, ConversationText:
		vc.Trace, vc.Compress = mooncake.DefaultTrace, 10
		vc.Requests = cmp.Or(c.Requests, c.Base.Requests)
		if wl == ConversationText {
			vc.Prompts = vsepp.PromptsText
			if fam == fleet.FamilyMock {
				// The EPP renders text through vLLM's render endpoint,
				// which the mock does not serve: kvselect's pickers only.
				vc.Pickers = slices.DeleteFunc(vc.Pickers, func(p string) bool { return vsepp.IsEPP(p) })
			}
		}
	case SharedPrefix, MultiTurn:
		gen := generators[wl]
		trace = wl + ".jsonl"
		reqs, err := gen.Generate()
		if err != nil {
			return nil, "", err
		}
		if err := workload.WriteTrace(filepath.Join(c.Base.Out, trace), reqs); err != nil {
			return nil, "", err
		}
		vc.Compress, vc.Requests = 1, cmp.Or(c.Requests, len(reqs))
	case Ladder:
		vc.Trace, vc.Rate = mooncake.DefaultTrace, rate
		vc.Requests = cmp.Or(c.Requests, c.Base.Requests)
		name = fmt.Sprintf("%s@%grps", name, rate)
	default:
		return nil, "", fmt.Errorf("-workloads: unknown workload %q (known: %s)", wl, strings.Join(Workloads, ", "))
	}
	if trace != "" {
		vc.Trace = filepath.Join(c.Base.Out, trace)
	}
	if len(vc.Pickers) == 0 {
		return nil, name, nil
	}
	vc.Out = filepath.Join(c.Base.Out, strings.NewReplacer("/", "-", "@", "-").Replace(name))
	return &vc, name, nil
}

// Run runs every cell, one after the other, and writes suite.json,
// suite.svg and each cell's vs-epp files under Base.Out.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (*Report, error) {
	if c.Repeat < 1 {
		c.Repeat = 1
	}
	cells, cfgs, err := c.plan()
	if err != nil {
		return nil, err
	}
	for i := range cfgs {
		if err := cfgs[i].Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", cells[i].Name, err)
		}
	}
	rep := &Report{Date: time.Now().UTC().Format(time.RFC3339), Args: c.Args}
	for i := range cells {
		fmt.Fprintf(stderr, "suite: cell %d/%d: %s\n", i+1, len(cells), cells[i].Name)
		if err := os.MkdirAll(cfgs[i].Out, 0o755); err != nil {
			return rep, err
		}
		table, err := os.Create(filepath.Join(cfgs[i].Out, "table.txt"))
		if err != nil {
			return rep, err
		}
		r, err := vsepp.Run(ctx, cfgs[i], table, stderr)
		table.Close()
		if r == nil {
			return rep, fmt.Errorf("%s: %w", cells[i].Name, err)
		}
		if err != nil {
			fmt.Fprintf(stderr, "suite: %s: %v\n", cells[i].Name, err)
		}
		cells[i].Report = r
		rep.Cells = append(rep.Cells, cells[i])
	}
	if err := rep.Table(stdout); err != nil {
		return rep, err
	}
	if err := report.WriteJSON(filepath.Join(c.Base.Out, "suite.json"), rep); err != nil {
		return rep, err
	}
	svg := filepath.Join(c.Base.Out, "suite.svg")
	if err := report.WriteSVG(svg, "kvselect suite: every picker over every cell", rep.Charts()...); err != nil {
		return rep, err
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s (each cell's vs-epp files in its directory)\n", filepath.Join(c.Base.Out, "suite.json"), svg)
	return rep, nil
}

// Table prints one row per cell and picker, then each cell's goals.
func (rep *Report) Table(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cell\tpicker\thit rate\tTTFT p50 ms\tp90\tp99\tITL p90 ms\tgoodput req/s (share)\tCPU/req µs\tpick p50 µs\terrors\tleaked\tprediction error p50/p90\t")
	for _, cell := range rep.Cells {
		for _, r := range cell.Report.Runs {
			leaked, perr := "-", "-"
			if r.LeakedBookings != nil {
				leaked = fmt.Sprint(*r.LeakedBookings)
			}
			if r.PredictionError != nil {
				perr = fmt.Sprintf("%.2f / %.2f", r.PredictionError[0], r.PredictionError[1])
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f (%.2f)\t%.0f\t%.0f\t%d\t%s\t%s\t\n", cell.Name, r.Picker, r.HitRate,
				r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms, r.ITLP90Ms, r.Goodput, r.GoodputShare, r.CPUPerRequestUs, r.Histogram.P50Us,
				r.Errors, leaked, perr)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, g := range rep.Goals() {
		fmt.Fprintln(w, g)
	}
	return nil
}

// Goal names of Goals.
const (
	goalTTFT = "p90 TTFT ≤ 0.9 × the better EPP's"
	goalHit  = "hit rate ≥ the better EPP's − 0.005"
	goalCost = "p90 TTFT not above kv-cost's"
)

// Goals checks each cell: kvselect's default picker (and the
// predicted-latency one, when it runs under its own name) against the
// better of the EPP runs (the lower p90 TTFT; the higher hit rate) and
// against kv-cost, as one line per cell, picker and goal.
func (rep *Report) Goals() []string {
	var out []string
	for _, cell := range rep.Cells {
		for _, name := range []string{"kvselect", "kvselect-latency"} {
			out = append(out, goals(cell, name)...)
		}
	}
	return out
}

func goals(cell Cell, picker string) []string {
	var out []string
	runs := cell.Report.Runs
	def := find(runs, picker)
	if def == nil {
		return nil
	}
	line := func(goal string, ok bool, detail string) {
		verdict := "missed"
		if ok {
			verdict = "met"
		}
		out = append(out, fmt.Sprintf("%s: %s: %s: %s (%s)", cell.Name, picker, goal, verdict, detail))
	}
	if e, t := find(runs, "epp"), find(runs, "epp-tuned"); e != nil || t != nil {
		bestTTFT, bestHit := betterEPP(e, t)
		line(goalTTFT, def.TTFTP90Ms <= 0.9*bestTTFT, fmt.Sprintf("%.0f vs %.0f ms", def.TTFTP90Ms, bestTTFT))
		line(goalHit, def.HitRate >= bestHit-0.005, fmt.Sprintf("%.3f vs %.3f", def.HitRate, bestHit))
	}
	if k := find(runs, "kvselect-kvcost"); k != nil {
		line(goalCost, def.TTFTP90Ms <= k.TTFTP90Ms, fmt.Sprintf("%.0f vs %.0f ms; read it against the repeated cell's spread", def.TTFTP90Ms, k.TTFTP90Ms))
	}
	return out
}

func betterEPP(runs ...*vsepp.PickerRun) (ttft, hit float64) {
	ttft = -1
	for _, r := range runs {
		if r == nil {
			continue
		}
		if ttft < 0 || r.TTFTP90Ms < ttft {
			ttft = r.TTFTP90Ms
		}
		hit = max(hit, r.HitRate)
	}
	return ttft, hit
}

func find(runs []vsepp.PickerRun, picker string) *vsepp.PickerRun {
	for i := range runs {
		if runs[i].Picker == picker && runs[i].Transport == "plain" {
			return &runs[i]
		}
	}
	return nil
}

// Charts are p90 TTFT and hit rate per cell, one bar per picker.
func (rep *Report) Charts() []report.Chart {
	var pickers []string
	for _, cell := range rep.Cells {
		for _, r := range cell.Report.Runs {
			if !slices.Contains(pickers, r.Picker) {
				pickers = append(pickers, r.Picker)
			}
		}
	}
	ttft := report.Chart{Title: "TTFT p90", Unit: "ms", Series: pickers, LowerIsBetter: true, ClipOutliers: true}
	hit := report.Chart{Title: "prefix-cache hit rate (engines)", Series: pickers}
	for _, cell := range rep.Cells {
		ttft.Groups, hit.Groups = append(ttft.Groups, cell.Name), append(hit.Groups, cell.Name)
		tv, hv := make([]float64, len(pickers)), make([]float64, len(pickers))
		for i, p := range pickers {
			if r := find(cell.Report.Runs, p); r != nil {
				tv[i], hv[i] = r.TTFTP90Ms, r.HitRate
			}
		}
		ttft.Values, hit.Values = append(ttft.Values, tv), append(hit.Values, hv)
	}
	return []report.Chart{ttft, hit}
}
