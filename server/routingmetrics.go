package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
)

// Routing quality per partition, from the service's totals: the hit rate is
// rate(kvselect_selection_cached_tokens_total) /
// rate(kvselect_selection_prompt_tokens_total). Labels are the partitions,
// which exist only for models and routing groups of registered workers.
var (
	descDecisions = prometheus.NewDesc("kvselect_selection_decisions_total",
		"Selections made (select and select_and_reserve, REST and ext_proc; advisory probes excluded), by partition.",
		[]string{"model", "routing_group"}, nil)
	descPromptTokens = prometheus.NewDesc("kvselect_selection_prompt_tokens_total",
		"Prompt tokens of the selections made, by partition.", []string{"model", "routing_group"}, nil)
	descCachedTokens = prometheus.NewDesc("kvselect_selection_cached_tokens_total",
		"Prompt tokens the chosen ranks had cached (the cost's prefix credit: device blocks, host and disk blocks at their hit weights), by partition.",
		[]string{"model", "routing_group"}, nil)
	descBestCachedTokens = prometheus.NewDesc("kvselect_selection_best_cached_tokens_total",
		"Prompt tokens the best-cached candidate rank of each selection had cached, counted as kvselect_selection_cached_tokens_total is, by partition: the difference is the cache the policy gave up for load.",
		[]string{"model", "routing_group"}, nil)
	descWorkers = prometheus.NewDesc("kvselect_workers",
		"Registered workers by model, routing group and lifecycle (schedulable, incomplete, draining): the catalog as GET /workers shows it.",
		[]string{"model", "routing_group", "lifecycle"}, nil)
	descMatchedPrefix = prometheus.NewDesc("kvselect_selection_matched_prefix_ratio",
		"Share of each selection's prompt the chosen rank had cached (0 to 1), by partition.",
		[]string{"model", "routing_group"}, nil)
)

type routingMetrics struct{ svc *selection.Service }

func (routingMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDecisions, descPromptTokens, descCachedTokens, descBestCachedTokens, descMatchedPrefix, descWorkers} {
		ch <- d
	}
}

func (m routingMetrics) Collect(ch chan<- prometheus.Metric) {
	type key struct{ model, group, lifecycle string }
	workers := map[key]int{}
	for _, r := range m.svc.Workers(nil, nil) {
		lc := string(r.Lifecycle)
		if lc == string(catalog.Schedulable) && len(r.NotSchedulableReasons) > 0 {
			lc = "ejected" // schedulable in the catalog, taken out by the health checks
		}
		workers[key{r.ModelName, r.RoutingGroup, lc}]++
	}
	for k, n := range workers {
		ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(n), k.model, k.group, k.lifecycle)
	}
	for _, p := range m.svc.Inspect().RoutingStats() {
		ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(p.Decisions), p.Model, p.RoutingGroup)
		ch <- prometheus.MustNewConstMetric(descPromptTokens, prometheus.CounterValue, float64(p.PromptTokens), p.Model, p.RoutingGroup)
		ch <- prometheus.MustNewConstMetric(descCachedTokens, prometheus.CounterValue, float64(p.CachedTokens), p.Model, p.RoutingGroup)
		ch <- prometheus.MustNewConstMetric(descBestCachedTokens, prometheus.CounterValue, float64(p.BestCachedTokens), p.Model, p.RoutingGroup)
		buckets := make(map[float64]uint64, len(p.MatchedBuckets))
		for i, ub := range selection.MatchedPrefixBuckets {
			buckets[ub] = p.MatchedBuckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(descMatchedPrefix, p.Decisions, p.MatchedSum, buckets, p.Model, p.RoutingGroup)
	}
}
