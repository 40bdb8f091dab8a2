package mesh

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/selection"
)

// Metric descriptors: the Stats counters as Prometheus series.
var (
	descPublished = prometheus.NewDesc("kvselect_replica_sync_published_total",
		"Events handed to the replica PUB socket, by topic.", []string{"topic"}, nil)
	descDropped = prometheus.NewDesc("kvselect_replica_sync_outbound_dropped_total",
		"Events dropped because the outbound queue was full, by topic.", []string{"topic"}, nil)
	descSendErrors = prometheus.NewDesc("kvselect_replica_sync_send_errors_total",
		"PUB sends that failed.", nil, nil)
	descReceived = prometheus.NewDesc("kvselect_replica_sync_received_total",
		"Messages received from peers.", nil, nil)
	descMalformed = prometheus.NewDesc("kvselect_replica_sync_malformed_total",
		"Messages dropped undecoded (frames, topic or payload); with a key, only messages that passed authentication.", nil, nil)
	descRejected = prometheus.NewDesc("kvselect_replica_sync_rejected_envelopes_total",
		"Messages dropped before decoding by the replica sync authentication (a key is set), by reason: unauthenticated (no or invalid HMAC tag), replayed (sequence already seen), malformed (unreadable authentication frame).",
		[]string{"reason"}, nil)
	descInbound = prometheus.NewDesc("kvselect_replica_sync_inbound_events_total",
		"Decoded peer events by topic and outcome (applied, own, unknown_worker, unknown_rank, unknown_partition, block_size_mismatch, duplicate, unknown_request, ...).",
		[]string{"topic", "outcome"}, nil)
	descPeerConnected = prometheus.NewDesc("kvselect_replica_sync_peer_connected",
		"1 while the subscription to a peer address is connected.", []string{"peer", "endpoint"}, nil)
	descPeerReconnects = prometheus.NewDesc("kvselect_replica_sync_peer_reconnects_total",
		"Subscriber sessions to a peer address that ended in an error.", []string{"peer", "endpoint"}, nil)
)

// Describe implements prometheus.Collector.
func (m *Mesh) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPublished, descDropped, descSendErrors, descReceived, descMalformed,
		descRejected, descInbound, descPeerConnected, descPeerReconnects} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Mesh) Collect(ch chan<- prometheus.Metric) {
	st := m.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descPublished, st.BookingsPublished, TopicSlotTracker)
	counter(descPublished, st.BindingsPublished, TopicSessionAffinity)
	counter(descDropped, st.BookingsDropped, TopicSlotTracker)
	counter(descDropped, st.BindingsDropped, TopicSessionAffinity)
	counter(descSendErrors, st.SendErrors)
	counter(descReceived, st.Received)
	counter(descMalformed, st.Malformed)
	for r := rejectUnauthenticated; r < numRejectReasons; r++ {
		counter(descRejected, st.Rejected[r.String()], r.String())
	}
	for _, o := range selection.RemoteOutcomes {
		counter(descInbound, st.Bookings[o.String()], TopicSlotTracker, o.String())
		if m.opts.Affinity {
			counter(descInbound, st.Bindings[o.String()], TopicSessionAffinity, o.String())
		}
	}
	for _, p := range st.Peers {
		if p.Endpoint == "" {
			continue // a name that resolves to nothing yet
		}
		up := 0.0
		if p.Connected {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descPeerConnected, prometheus.GaugeValue, up, p.Peer, p.Endpoint)
		counter(descPeerReconnects, p.Reconnects, p.Peer, p.Endpoint)
	}
}

var _ prometheus.Collector = (*Mesh)(nil)
