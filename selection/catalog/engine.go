package catalog

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Engines are the values a record's engine field accepts; each names the
// metric names its Prometheus endpoint is read with.
var Engines = []string{"vllm", "sglang", "trtllm"}

// DefaultEngine is the engine of a record that names none.
const DefaultEngine = "vllm"

// EngineName is the record's engine, DefaultEngine when unset.
func (r *Record) EngineName() string { return deref(r.Engine, DefaultEngine) }

// MetricsURL is where the worker's engine serves its Prometheus metrics:
// metrics_endpoint, else <endpoint>/metrics; ok is false when the record has
// neither an override nor an http(s) endpoint to derive it from.
func (r *Record) MetricsURL() (string, bool) {
	if m := deref(r.MetricsEndpoint, ""); m != "" {
		return m, true
	}
	ep := deref(r.Endpoint, "")
	if ep == "" {
		return "", false
	}
	if !strings.Contains(ep, "://") {
		ep = "http://" + ep // a bare host:port, as InferencePool endpoints are
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false
	}
	// The engine's API may sit under a path (http://host:8000/v1); its
	// metrics are at the server's root, as vLLM and SGLang serve them.
	return u.Scheme + "://" + u.Host + "/metrics", true
}

// ValidateHTTPURL accepts an absolute http or https URL with a host.
func ValidateHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("invalid URL %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("invalid URL %q: the scheme must be http or https", s)
	}
	if u.Host == "" {
		return fmt.Errorf("invalid URL %q: missing host", s)
	}
	return nil
}

// EngineMetricsView is GET /workers' engine_metrics: the worker's engine as
// its own metrics endpoint last described it, summed over its ranks.
type EngineMetricsView struct {
	// Waiting and Running are the engine's queued and running requests.
	Waiting float64 `json:"waiting"`
	Running float64 `json:"running"`
	// KVUsage is the KV cache's used fraction (0..1), the highest of the
	// ranks; absent when the engine does not report it.
	KVUsage *float64 `json:"kv_usage,omitempty"`
	// AgeMS is the age of the last good scrape in milliseconds; absent before
	// the first one.
	AgeMS *int64 `json:"age_ms,omitempty"`
	// Stale is true when there is no good scrape younger than the staleness
	// bound: selection then relies on its own bookings alone for this worker.
	Stale bool `json:"stale"`
	// Saturated is true when a rank is over the saturation thresholds.
	Saturated bool `json:"saturated"`
	// Error is the last scrape's error, empty when it succeeded.
	Error string `json:"error,omitempty"`
	// LoRA is the adapters the engine reports, when it reports them.
	LoRA *LoRAView `json:"lora,omitempty"`
	// Ranks holds each data-parallel rank's figures, when the engine labels
	// its metrics by rank.
	Ranks map[uint32]EngineRankView `json:"dp_ranks,omitempty"`
}

// EngineRankView is one data-parallel rank's figures.
type EngineRankView struct {
	Waiting   float64  `json:"waiting"`
	Running   float64  `json:"running"`
	KVUsage   *float64 `json:"kv_usage,omitempty"`
	Saturated bool     `json:"saturated"`
}

// LoRAView lists the LoRA adapters an engine has loaded.
type LoRAView struct {
	Running []string `json:"running"`
	Waiting []string `json:"waiting"`
	MaxLoRA int      `json:"max_lora"`
}

func (v *EngineMetricsView) clone() *EngineMetricsView {
	if v == nil {
		return nil
	}
	c := *v
	c.Ranks = maps.Clone(v.Ranks)
	if v.LoRA != nil {
		l := LoRAView{Running: slices.Clone(v.LoRA.Running), Waiting: slices.Clone(v.LoRA.Waiting), MaxLoRA: v.LoRA.MaxLoRA}
		c.LoRA = &l
	}
	return &c
}

// HealthView is GET /workers' health: the worker's ejection state.
type HealthView struct {
	// State is healthy, ejected or probation (the ejection has run out and one
	// trial request decides).
	State string `json:"state"`
	// ConsecutiveFailures counts failures since the last success.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// Ejections counts the worker's ejections since its last restoration.
	Ejections int `json:"ejections"`
	// EjectedUntil is when the current ejection ends (state ejected).
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
	// LastFailure is the latest failure's description.
	LastFailure string `json:"last_failure,omitempty"`
}

func (v *HealthView) clone() *HealthView {
	if v == nil {
		return nil
	}
	c := *v
	return &c
}
