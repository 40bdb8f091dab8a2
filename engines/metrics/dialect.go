package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvselect/kvselect/selection"
)

// series names one gauge, optionally narrowed to the series whose label has
// a value (Triton's request_type="waiting").
type series struct {
	name, label, value string
}

// Dialect is one engine's metric names: GIE's model-server protocol table
// (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/003-model-server-protocol/README.md) maps each figure to
// the engine's own gauge.
type Dialect struct {
	Name string
	// Waiting and Running are request gauges, KVUsage the KV cache's used
	// fraction. Each lists alternatives, the first present in a payload
	// winning (a newer name before an older one, one server's names before
	// another's).
	Waiting, Running, KVUsage []series
	// RankLabel labels per data-parallel-rank series with the rank; "" when
	// the engine does not label ranks.
	RankLabel string
	// CopyLabel tells apart processes of one rank that each export the
	// rank's figures (SGLang's tensor-parallel schedulers with
	// --enable-metrics-for-all-schedulers: tp_rank); only the series of the
	// lowest value per rank are read, so that copies are not summed.
	CopyLabel string
	// LoRAInfo is vLLM's adapter info gauge, "" for engines without one.
	LoRAInfo string
	// TTFT and ITL are the engine's latency histograms (time to first token,
	// inter-token latency), alternatives in order like the gauges. Only
	// their _count and _sum series are read: the latency model fits an
	// interval's mean, which needs no buckets.
	TTFT, ITL []string

	names []string // the families read, set once by init
}

// Dialects are the engines a worker record may name (catalog.Engines).
var dialects = map[string]*Dialect{
	// vLLM V1 (vllm/v1/metrics/loggers.py): gauges labelled model_name and
	// engine, the engine index of a data-parallel deployment. Before V1 the
	// usage gauge was vllm:gpu_cache_usage_perc.
	"vllm": {
		Name:      "vllm",
		Waiting:   []series{{name: "vllm:num_requests_waiting"}},
		Running:   []series{{name: "vllm:num_requests_running"}},
		KVUsage:   []series{{name: "vllm:kv_cache_usage_perc"}, {name: "vllm:gpu_cache_usage_perc"}},
		RankLabel: "engine",
		LoRAInfo:  "vllm:lora_requests_info",
		// vLLM V1 exports inter_token_latency_seconds; before it, and in
		// V1 until it was renamed, time_per_output_token_seconds held the
		// same per-token gaps.
		TTFT: []string{"vllm:time_to_first_token_seconds"},
		ITL:  []string{"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"},
	},
	// SGLang (python/sglang/srt/metrics/collector.py): token_usage is the
	// KV pool's used fraction. Each scheduler labels its series with
	// model_name, tp_rank, pp_rank and, under data parallelism, dp_rank
	// (python/sglang/srt/managers/scheduler_metrics_mixin.py); without
	// dp_rank the figures are the worker's.
	"sglang": {
		Name:      "sglang",
		Waiting:   []series{{name: "sglang:num_queue_reqs"}},
		Running:   []series{{name: "sglang:num_running_reqs"}},
		KVUsage:   []series{{name: "sglang:token_usage"}},
		RankLabel: "dp_rank",
		CopyLabel: "tp_rank",
		TTFT:      []string{"sglang:time_to_first_token_seconds"},
		ITL:       []string{"sglang:inter_token_latency_seconds"},
	},
	// TensorRT-LLM: trtllm-serve's own names, else those of Triton's
	// TensorRT-LLM backend (triton_backend/inflight_batcher_llm/src/
	// custom_metrics_reporter), both as GIE's protocol table gives them.
	// trtllm_kv_cache_utilization is a 0-1 fraction like the others.
	"trtllm": {
		Name: "trtllm",
		Waiting: []series{{name: "trtllm_num_requests_waiting"},
			{name: "nv_trt_llm_request_metrics", label: "request_type", value: "waiting"}},
		Running: []series{{name: "trtllm_num_requests_running"},
			{name: "nv_trt_llm_request_metrics", label: "request_type", value: "scheduled"}},
		KVUsage: []series{{name: "trtllm_kv_cache_utilization"},
			{name: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", value: "fraction"}},
		// trtllm-serve's histograms (tensorrt_llm/metrics/collector.py).
		TTFT: []string{"trtllm_time_to_first_token_seconds"},
		ITL:  []string{"trtllm_time_per_output_token_seconds"},
	},
}

func init() {
	for _, d := range dialects {
		d.names = d.familyNames()
	}
}

// DialectFor returns the engine's dialect; ok is false for an unknown engine.
func DialectFor(engine string) (*Dialect, bool) {
	d, ok := dialects[engine]
	return d, ok
}

// familyNames are the metric families the dialect reads.
func (d *Dialect) familyNames() []string {
	var out []string
	for _, l := range [][]series{d.Waiting, d.Running, d.KVUsage} {
		for _, s := range l {
			if !slices.Contains(out, s.name) {
				out = append(out, s.name)
			}
		}
	}
	if d.LoRAInfo != "" {
		out = append(out, d.LoRAInfo)
	}
	for _, h := range slices.Concat(d.TTFT, d.ITL) {
		out = append(out, h+"_count", h+"_sum")
	}
	return out
}

// ParseError is a payload that gives no figures; Reason is its counter label.
type ParseError struct {
	Reason string // parse_error, missing_series
	Err    error
}

func (e *ParseError) Error() string { return fmt.Sprintf("%s: %v", e.Reason, e.Err) }
func (e *ParseError) Unwrap() error { return e.Err }

// Dropped counts values a payload carried that were refused: not finite,
// negative, a usage above 1, a rank the worker does not have, an unreadable
// LoRA info series.
type Dropped map[string]int

// Parse reads one Prometheus text payload in dialect d for a worker with the
// given global ranks. Only the dialect's families are parsed: the other
// lines (the Go runtime's, histograms, ...) are skipped before the parser
// sees them, which keeps a scrape's cost independent of how much else the
// engine exports. A value that cannot be trusted is dropped and counted, so
// it never reaches selection; a payload without either request gauge is an
// error.
func (d *Dialect) Parse(body []byte, ranks []uint32, dropped Dropped) (map[uint32]selection.EngineRank, error) {
	return d.parse(newParser(), body, ranks, dropped)
}

// parser is the reusable state of a parse: the kept lines and the text
// parser with its read buffer. A scraper pools them, so that a scrape
// allocates little more than the families it reads.
type parser struct {
	text expfmt.TextParser
	kept []byte
	in   bytes.Reader
}

func newParser() *parser {
	// vLLM's names contain ':', which both schemes accept; UTF-8 is the
	// scheme prometheus/common v0.72 parses by default.
	return &parser{text: expfmt.NewTextParser(model.UTF8Validation)}
}

func (d *Dialect) parse(p *parser, body []byte, ranks []uint32, dropped Dropped) (map[uint32]selection.EngineRank, error) {
	p.kept = keepFamilies(p.kept[:0], body, d.names)
	p.in.Reset(p.kept)
	fams, err := p.text.TextToMetricFamilies(&p.in)
	if err != nil {
		return nil, &ParseError{Reason: "parse_error", Err: err}
	}
	present := func(l []series) bool {
		return slices.ContainsFunc(l, func(s series) bool { return fams[s.name] != nil })
	}
	if !present(d.Waiting) && !present(d.Running) {
		return nil, &ParseError{Reason: "missing_series", Err: fmt.Errorf("neither %s nor %s is exported", d.Waiting[0].name, d.Running[0].name)}
	}
	out := map[uint32]selection.EngineRank{}
	rankOf := func(m *dto.Metric) (uint32, bool) {
		if d.RankLabel == "" {
			return selection.AllRanks, true
		}
		v, ok := label(m, d.RankLabel)
		if !ok {
			return selection.AllRanks, true
		}
		r, err := strconv.ParseUint(v, 10, 32)
		if err != nil || !slices.Contains(ranks, uint32(r)) {
			dropped["unknown_rank"]++
			return 0, false
		}
		return uint32(r), true
	}
	each := func(s series, f func(rank uint32, v float64)) bool {
		fam := fams[s.name]
		if fam == nil {
			return false
		}
		copies := d.firstCopies(fam)
		found := false
		for _, m := range fam.GetMetric() {
			if s.label != "" {
				if v, _ := label(m, s.label); v != s.value {
					continue
				}
			}
			if copies != nil && !copies.keep(m) {
				continue
			}
			v, ok := value(m)
			if !ok {
				continue
			}
			found = true
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				dropped["bad_value"]++
				continue
			}
			if r, ok := rankOf(m); ok {
				f(r, v)
			}
		}
		return found
	}
	// first reads the first alternative the payload has.
	first := func(l []series, f func(rank uint32, v float64)) {
		for _, s := range l {
			if each(s, f) {
				return
			}
		}
	}
	first(d.Waiting, func(r uint32, v float64) { e := out[r]; e.Waiting += v; out[r] = e })
	first(d.Running, func(r uint32, v float64) { e := out[r]; e.Running += v; out[r] = e })
	first(d.KVUsage, func(r uint32, v float64) {
		if v > 1 {
			dropped["bad_value"]++
			return
		}
		e := out[r]
		if !e.HasKVUsage || v > e.KVUsage {
			e.KVUsage, e.HasKVUsage = v, true
		}
		out[r] = e
	})
	// Finite series can sum past the largest float: such a count is
	// dropped like an infinite sample.
	for r, e := range out {
		if math.IsInf(e.Waiting, 0) {
			e.Waiting = 0
			dropped["bad_value"]++
		}
		if math.IsInf(e.Running, 0) {
			e.Running = 0
			dropped["bad_value"]++
		}
		out[r] = e
	}
	if d.LoRAInfo != "" {
		d.parseLoRA(fams[d.LoRAInfo], out, rankOf, dropped)
	}
	histogram := func(names []string, h func(*selection.EngineRank) *selection.EngineHistogram) {
		for _, name := range names {
			// A histogram's count and sum are read as two samples
			// (keepFamilies drops its TYPE line); one without the other is
			// not read at all.
			if fams[name+"_count"] == nil || fams[name+"_sum"] == nil {
				continue
			}
			first([]series{{name: name + "_count"}}, func(r uint32, v float64) {
				e := out[r]
				h(&e).Count += v
				h(&e).Reported = true
				out[r] = e
			})
			first([]series{{name: name + "_sum"}}, func(r uint32, v float64) { e := out[r]; h(&e).Sum += v; out[r] = e })
			return
		}
	}
	histogram(d.TTFT, func(e *selection.EngineRank) *selection.EngineHistogram { return &e.TTFT })
	histogram(d.ITL, func(e *selection.EngineRank) *selection.EngineHistogram { return &e.ITL })
	return out, nil
}

// copyFilter keeps, per rank label value, the series of the lowest copy
// label value.
type copyFilter struct {
	d      *Dialect
	lowest map[string]uint64
}

// firstCopies returns the filter for fam, nil when the dialect has no copy
// label or fam has no series carrying it.
func (d *Dialect) firstCopies(fam *dto.MetricFamily) *copyFilter {
	if d.CopyLabel == "" {
		return nil
	}
	var f *copyFilter
	for _, m := range fam.GetMetric() {
		c, ok := d.copyOf(m)
		if !ok {
			continue
		}
		if f == nil {
			f = &copyFilter{d: d, lowest: map[string]uint64{}}
		}
		r, _ := label(m, d.RankLabel)
		if low, seen := f.lowest[r]; !seen || c < low {
			f.lowest[r] = c
		}
	}
	return f
}

func (d *Dialect) copyOf(m *dto.Metric) (uint64, bool) {
	v, ok := label(m, d.CopyLabel)
	if !ok {
		return 0, false
	}
	c, err := strconv.ParseUint(v, 10, 64)
	return c, err == nil
}

func (f *copyFilter) keep(m *dto.Metric) bool {
	c, ok := f.d.copyOf(m)
	if !ok {
		return true
	}
	r, _ := label(m, f.d.RankLabel)
	return c == f.lowest[r]
}

// parseLoRA reads vLLM's vllm:lora_requests_info: one series per set of
// loaded adapters, its value the time it was set, so the newest series of
// each rank is the current one (vllm/v1/metrics/loggers.py).
func (d *Dialect) parseLoRA(fam *dto.MetricFamily, out map[uint32]selection.EngineRank, rankOf func(*dto.Metric) (uint32, bool), dropped Dropped) {
	if fam == nil {
		return
	}
	newest := map[uint32]float64{}
	for _, m := range fam.GetMetric() {
		v, ok := value(m)
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			dropped["bad_value"]++
			continue
		}
		r, ok := rankOf(m)
		if !ok {
			continue
		}
		maxLoRA := 0
		if s, ok := label(m, "max_lora"); ok && s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				dropped["bad_lora_info"]++
				continue
			}
			maxLoRA = n
		}
		if prev, seen := newest[r]; seen && prev >= v {
			continue
		}
		newest[r] = v
		running, _ := label(m, "running_lora_adapters")
		waiting, _ := label(m, "waiting_lora_adapters")
		e := out[r]
		e.LoRA = &selection.LoRAState{Running: splitList(running), Waiting: splitList(waiting), MaxLoRA: maxLoRA}
		out[r] = e
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// value reads a gauge, counter or untyped sample.
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue(), true
	case m.Untyped != nil:
		return m.GetUntyped().GetValue(), true
	case m.Counter != nil:
		return m.GetCounter().GetValue(), true
	}
	return 0, false
}

// keepFamilies appends to dst the sample lines of body that belong to the
// named families. Comments are dropped, # TYPE included: every figure read
// is a single sample (a gauge, which without its TYPE line parses as
// untyped and reads the same), so the parser has fewer lines to read and
// an engine's help text cannot fail a scrape. A sample line starts with its
// metric name, followed by '{', a space or a tab; UTF-8 names in quotes are
// not used by the engines read here and are dropped with the rest.
func keepFamilies(dst, body []byte, names []string) []byte {
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if keepLine(line, names) {
			dst = append(dst, line...)
			dst = append(dst, '\n')
		}
	}
	return dst
}

func keepLine(line []byte, names []string) bool {
	for _, n := range names {
		if len(line) > len(n) && line[0] == n[0] && string(line[:len(n)]) == n {
			switch line[len(n)] {
			case '{', ' ', '\t':
				return true
			}
		}
	}
	return false
}

var errTooLarge = errors.New("body too large")
