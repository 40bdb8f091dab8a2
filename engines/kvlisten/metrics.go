package kvlisten

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
)

// RankEventsStatus implements selection.ListenerStatus: the rank's state as
// GET /workers shows it.
func (l *Listeners) RankEventsStatus(p index.Partition, w index.WorkerKey) (catalog.RankEventsStatus, bool) {
	st, ok := l.Status(p, w)
	if !ok {
		return catalog.RankEventsStatus{}, false
	}
	out := catalog.RankEventsStatus{
		Connected:        st.Connected,
		LostBatches:      st.Lost + st.DecodeErrors,
		IncompleteReason: st.LastIncompleteReason,
		LastError:        st.LastError,
	}
	out.Complete = out.LostBatches == 0
	if st.Synced {
		seq := st.LastSeq
		out.LastSequence = &seq
	}
	return out, true
}

// Metric descriptors. Per-rank series carry the partition and the rank; they
// start at zero when a rank is (re)attached and vanish when it is detached.
var (
	rankLabels = []string{"model_name", "routing_group", "worker_id", "dp_rank"}

	descBatches = prometheus.NewDesc("kvselect_kv_events_batches_total",
		"KV event batches decoded and applied to the index (live and replayed).", rankLabels, nil)
	descBlocks = prometheus.NewDesc("kvselect_kv_events_blocks_total",
		"Block operations (stored plus removed blocks) applied to the index.", rankLabels, nil)
	descRejected = prometheus.NewDesc("kvselect_kv_events_rejected_total",
		"Events the index rejected (parent not found, invalid sequence, unknown block).", rankLabels, nil)
	descDecodeErrors = prometheus.NewDesc("kvselect_kv_events_decode_errors_total",
		"Malformed messages and batches, counted and dropped.", rankLabels, nil)
	descLost = prometheus.NewDesc("kvselect_kv_events_lost_batches_total",
		"Batches known lost: sequence gaps that replay could not fill.", rankLabels, nil)
	descGaps = prometheus.NewDesc("kvselect_kv_events_gaps_total",
		"Live sequence gaps detected.", rankLabels, nil)
	descStale = prometheus.NewDesc("kvselect_kv_events_stale_batches_total",
		"Live batches at or below the sequence watermark, skipped (duplicates, reordered batches, a restarted publisher's first batches).", rankLabels, nil)
	descRestarts = prometheus.NewDesc("kvselect_kv_events_publisher_restarts_total",
		"Publisher restarts recognized by a sequence that started over: the rank's blocks were dropped and the new stream caught up from its start.", rankLabels, nil)
	descReplays = prometheus.NewDesc("kvselect_kv_events_replays_total",
		"Replay requests sent to the engine's replay endpoint.", rankLabels, nil)
	descReplayed = prometheus.NewDesc("kvselect_kv_events_replayed_batches_total",
		"Batches applied from replays.", rankLabels, nil)
	descIncomplete = prometheus.NewDesc("kvselect_kv_events_incomplete_replays_total",
		"Replays that did not return the whole requested range.", rankLabels, nil)
	descReconnects = prometheus.NewDesc("kvselect_kv_events_reconnects_total",
		"Subscriber sessions that ended in an error and were redialed.", rankLabels, nil)
	descConnected = prometheus.NewDesc("kvselect_kv_events_connected",
		"1 when the rank's SUB socket is connected and subscribed.", rankLabels, nil)
	descLastSeq = prometheus.NewDesc("kvselect_kv_events_last_sequence",
		"Last accepted batch sequence number (absent before the first batch).", rankLabels, nil)
	descComplete = prometheus.NewDesc("kvselect_kv_events_complete",
		"1 while no batch of the rank is known lost or dropped since it was attached.", rankLabels, nil)
	descLaneQueue = prometheus.NewDesc("kvselect_kv_events_lane_queue_depth",
		"Batches waiting for an index writer lane.", []string{"lane"}, nil)
	descCollector = prometheus.NewDesc("kvselect_kv_events_collector_messages_total",
		"Messages read by the collector sockets (--kv-events-bind), by result: delivered, or why they reached no worker rank (unknown_topic, model_mismatch, unknown_rank, subscribed, malformed).",
		[]string{"result"}, nil)
	descCollectorRejected = prometheus.NewDesc("kvselect_kv_events_collector_rejected_connections_total",
		"Peers the collector sockets disconnected for breaking the wire protocol (oversized_frame, too_many_frames, bad_greeting, handshake_timeout, ...).",
		[]string{"reason"}, nil)
)

// Describe implements prometheus.Collector.
func (l *Listeners) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBatches, descBlocks, descRejected, descDecodeErrors,
		descLost, descGaps, descStale, descRestarts, descReplays, descReplayed, descIncomplete, descReconnects,
		descConnected, descLastSeq, descComplete, descLaneQueue, descCollector, descCollectorRejected} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (l *Listeners) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	ranks := make([]*rank, 0, len(l.ranks))
	for _, r := range l.ranks {
		ranks = append(ranks, r)
	}
	l.mu.Unlock()
	for _, r := range ranks {
		r.mu.Lock()
		st := r.st
		r.mu.Unlock()
		lv := []string{r.a.Partition.Model, r.a.Partition.RoutingGroup,
			strconv.FormatUint(r.a.Worker.WorkerID, 10), strconv.FormatUint(uint64(r.a.Worker.DPRank), 10)}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
		}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		counter(descBatches, st.Applied)
		counter(descBlocks, st.Blocks)
		counter(descRejected, st.Failed)
		counter(descDecodeErrors, st.DecodeErrors)
		counter(descLost, st.Lost)
		counter(descGaps, st.Gaps)
		counter(descStale, st.Stale)
		counter(descRestarts, st.Restarts)
		counter(descReplays, st.Replays)
		counter(descReplayed, st.Replayed)
		counter(descIncomplete, st.IncompleteReplays)
		counter(descReconnects, st.Reconnects)
		gauge(descConnected, b2f(st.Connected))
		gauge(descComplete, b2f(st.Lost+st.DecodeErrors == 0))
		if st.Synced {
			gauge(descLastSeq, float64(st.LastSeq))
		}
	}
	for i, lane := range l.lanes {
		ch <- prometheus.MustNewConstMetric(descLaneQueue, prometheus.GaugeValue, float64(len(lane)), strconv.Itoa(i))
	}
	if cs, ok := l.CollectorStatus(); ok {
		ch <- prometheus.MustNewConstMetric(descCollector, prometheus.CounterValue, float64(cs.Delivered), "delivered")
		for _, reason := range []string{UnmatchedUnknownTopic, UnmatchedModel, UnmatchedRank, UnmatchedSubscribed, UnmatchedMalformed} {
			ch <- prometheus.MustNewConstMetric(descCollector, prometheus.CounterValue, float64(cs.Unmatched[reason]), reason)
		}
		for reason, n := range cs.Rejected {
			ch <- prometheus.MustNewConstMetric(descCollectorRejected, prometheus.CounterValue, float64(n), reason)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
