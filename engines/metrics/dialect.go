package metrics

import (
	"bufio"
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
	// Waiting and Running are request gauges; KVUsage the KV cache's used
	// fraction, the first series present winning (a newer name, then an
	// older one).
	Waiting, Running series
	KVUsage          []series
	// RankLabel labels per data-parallel-rank series with the rank; "" when
	// the engine does not label ranks.
	RankLabel string
	// LoRAInfo is vLLM's adapter info gauge, "" for engines without one.
	LoRAInfo string
}

// Dialects are the engines a worker record may name (catalog.Engines).
var dialects = map[string]*Dialect{
	// vLLM V1 (vllm/v1/metrics/loggers.py): gauges labelled model_name and
	// engine, the engine index of a data-parallel deployment. Before V1 the
	// usage gauge was vllm:gpu_cache_usage_perc.
	"vllm": {
		Name:      "vllm",
		Waiting:   series{name: "vllm:num_requests_waiting"},
		Running:   series{name: "vllm:num_requests_running"},
		KVUsage:   []series{{name: "vllm:kv_cache_usage_perc"}, {name: "vllm:gpu_cache_usage_perc"}},
		RankLabel: "engine",
		LoRAInfo:  "vllm:lora_requests_info",
	},
	// SGLang (python/sglang/srt/metrics/collector.py): token_usage is the
	// KV pool's used fraction. Scheduler ranks are told apart by dp_rank
	// where the series carry it; otherwise the figures are the worker's.
	"sglang": {
		Name:      "sglang",
		Waiting:   series{name: "sglang:num_queue_reqs"},
		Running:   series{name: "sglang:num_running_reqs"},
		KVUsage:   []series{{name: "sglang:token_usage"}},
		RankLabel: "dp_rank",
	},
	// TensorRT-LLM behind Triton's TensorRT-LLM backend, the names GIE's
	// protocol table gives.
	"trtllm": {
		Name:    "trtllm",
		Waiting: series{name: "nv_trt_llm_request_metrics", label: "request_type", value: "waiting"},
		Running: series{name: "nv_trt_llm_request_metrics", label: "request_type", value: "scheduled"},
		KVUsage: []series{{name: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", value: "fraction"}},
	},
}

// DialectFor returns the engine's dialect; ok is false for an unknown engine.
func DialectFor(engine string) (*Dialect, bool) {
	d, ok := dialects[engine]
	return d, ok
}

// names are the metric families the dialect reads.
func (d *Dialect) names() []string {
	out := []string{d.Waiting.name, d.Running.name}
	for _, s := range d.KVUsage {
		out = append(out, s.name)
	}
	if d.LoRAInfo != "" {
		out = append(out, d.LoRAInfo)
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
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(keepFamilies(body, d.names())))
	if err != nil {
		return nil, &ParseError{Reason: "parse_error", Err: err}
	}
	if fams[d.Waiting.name] == nil && fams[d.Running.name] == nil {
		return nil, &ParseError{Reason: "missing_series", Err: fmt.Errorf("neither %s nor %s is exported", d.Waiting.name, d.Running.name)}
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
		found := false
		for _, m := range fam.GetMetric() {
			if s.label != "" {
				if v, _ := label(m, s.label); v != s.value {
					continue
				}
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
	each(d.Waiting, func(r uint32, v float64) { e := out[r]; e.Waiting += v; out[r] = e })
	each(d.Running, func(r uint32, v float64) { e := out[r]; e.Running += v; out[r] = e })
	for _, s := range d.KVUsage {
		if each(s, func(r uint32, v float64) {
			if v > 1 {
				dropped["bad_value"]++
				return
			}
			e := out[r]
			if !e.HasKVUsage || v > e.KVUsage {
				e.KVUsage, e.HasKVUsage = v, true
			}
			out[r] = e
		}) {
			break
		}
	}
	if d.LoRAInfo != "" {
		d.parseLoRA(fams[d.LoRAInfo], out, rankOf, dropped)
	}
	return out, nil
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

// keepFamilies returns the lines of body that belong to the named families:
// their samples and their # HELP / # TYPE comments. A sample line starts with
// its metric name, followed by '{', a space or a tab; UTF-8 names in quotes
// are not used by the engines read here and are dropped with the rest.
func keepFamilies(body []byte, names []string) []byte {
	out := make([]byte, 0, 4096)
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64*1024), len(body)+1)
	for sc.Scan() {
		line := sc.Bytes()
		if keepLine(line, names) {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	if err := sc.Err(); err != nil {
		// A line the scanner cannot hold: let the parser see the payload
		// whole and fail or succeed on its own terms.
		return body
	}
	return out
}

func keepLine(line []byte, names []string) bool {
	rest := line
	if bytes.HasPrefix(rest, []byte("#")) {
		rest = bytes.TrimLeft(rest[1:], " \t")
		switch {
		case bytes.HasPrefix(rest, []byte("HELP")), bytes.HasPrefix(rest, []byte("TYPE")):
			rest = bytes.TrimLeft(rest[4:], " \t")
		default:
			return false // other comments carry nothing
		}
	}
	for _, n := range names {
		if len(rest) > len(n) && string(rest[:len(n)]) == n {
			switch rest[len(n)] {
			case '{', ' ', '\t':
				return true
			}
		}
	}
	return false
}

var errTooLarge = errors.New("body too large")
