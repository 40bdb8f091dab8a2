// Package catalog holds the worker catalog of the selection service: the worker
// records exactly as clients registered them through POST/PATCH /workers, their
// lifecycle and the reasons an accepted worker is not schedulable, the ZMQ
// endpoint syntax, and the per-rank endpoint view that the KV-event listeners
// reconcile against, as Dynamo's lib/kv-router/src/services/selection/catalog.rs
// (commit 6616406a) keeps them. It decides nothing about selection and does no
// I/O.
package catalog

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Lifecycle is a worker's catalog state.
type Lifecycle string

// Lifecycle states, with Dynamo's wire names. Only Schedulable workers of a
// request's partition are selection candidates.
const (
	Incomplete    Lifecycle = "incomplete"    // accepted, not selectable; reasons say why
	Schedulable   Lifecycle = "schedulable"   // a selection candidate
	Draining      Lifecycle = "draining"      // transient while being removed or moved
	Unschedulable Lifecycle = "unschedulable" // returned by DELETE
)

// DefaultPartitionName is the model name and routing group used when omitted.
const DefaultPartitionName = "default"

// Record is a worker catalog record: the POST /workers body and the
// WorkerCatalogRecord response share it (field order = wire order). Optional
// fields are pointers and stay nil when not sent: the catalog stores what the
// client sent and fills no defaults (GET /workers shows data_parallel_size
// null when it was not sent, as Dynamo does), except model_name and
// routing_group, which name the partition.
type Record struct {
	WorkerID     uint64    `json:"worker_id"`
	ModelName    string    `json:"model_name"`
	RoutingGroup string    `json:"routing_group"`
	Lifecycle    Lifecycle `json:"lifecycle"`

	Endpoint              *string           `json:"endpoint"`
	KVEventsEndpoint      *string           `json:"kv_events_endpoint"`
	KVEventsEndpoints     map[uint32]string `json:"kv_events_endpoints,omitempty"`
	ReplayEndpoint        *string           `json:"replay_endpoint"`
	BlockSize             *uint32           `json:"block_size"`
	DataParallelStartRank *uint32           `json:"data_parallel_start_rank"`
	DataParallelSize      *uint32           `json:"data_parallel_size"`
	MaxNumBatchedTokens   *uint64           `json:"max_num_batched_tokens"`
	TotalKVBlocks         *uint64           `json:"total_kv_blocks"`
	StableRoutingID       *string           `json:"stable_routing_id"`
	IsEagle               *bool             `json:"is_eagle"`
	Taints                []string          `json:"taints"`
	TopologyDomains       map[string]string `json:"topology_domains"`

	// KVEventsTopic (not in Dynamo's record; omitted when unset) is the ZMQ
	// topic the worker's engine publishes under when it dials kvselect's
	// collector socket (--kv-events-bind) with a topic of its own choosing.
	// Without it the collector matches llm-d's convention,
	// kv@<host>:<port>@<model_name>, against the worker's endpoint.
	KVEventsTopic *string `json:"kv_events_topic,omitempty"`

	// Engine (not in Dynamo's record; omitted when unset) names the inference
	// engine behind the worker, which decides the metric names its Prometheus
	// endpoint is read with: vllm (the default), sglang or trtllm.
	Engine *string `json:"engine,omitempty"`
	// MetricsEndpoint (not in Dynamo's record; omitted when unset) is the URL of
	// the engine's Prometheus metrics; without it, <endpoint>/metrics.
	MetricsEndpoint *string `json:"metrics_endpoint,omitempty"`

	// Role (not in Dynamo's record; omitted when unset) is the worker's part
	// in disaggregated prefill/decode serving: "prefill", "decode" or "both"
	// (aggregated, the same as unset). A prefill worker serves the prefill
	// stage of disaggregated requests and belongs to the prefill routing
	// group (registered without a routing group, it joins it); decode and
	// aggregated workers may not sit in that group.
	Role *string `json:"role,omitempty"`

	KVTransferDomain          *string  `json:"kv_transfer_domain"`
	KVTransferEnforcement     *string  `json:"kv_transfer_enforcement"`
	KVTransferPreferredWeight *float32 `json:"kv_transfer_preferred_weight"`

	RouterHintWorkerType             *string           `json:"router_hint_worker_type,omitempty"`
	RouterHintSourceControlEndpoints map[uint32]string `json:"router_hint_source_control_endpoints,omitempty"`
	KVEventSourceMode                *string           `json:"kv_event_source_mode,omitempty"`

	NotSchedulableReasons []string `json:"not_schedulable_reasons,omitempty"`

	// SourceReasons are problems a discovery source found while building the
	// record (a pod annotation that does not parse, say). They come first in
	// not_schedulable_reasons and keep the worker incomplete, so a bad source
	// entry is visible in GET /workers instead of silently dropped. Set only by
	// in-process sources, never from JSON.
	SourceReasons []string `json:"-"`

	// KVEventsStatus is output only (GET /workers, not in Dynamo's record): the
	// state of each rank's KV event listener, keyed by global dp rank, so that an
	// operator sees when the index's view of a worker is known to be incomplete.
	// It is never stored; input values are ignored.
	KVEventsStatus map[uint32]RankEventsStatus `json:"kv_events_status,omitempty"`

	// EngineMetrics is output only: what the engine's own metrics endpoint
	// said at the last scrape, when kvselect scrapes engines. Never stored.
	EngineMetrics *EngineMetricsView `json:"engine_metrics,omitempty"`
	// Health is output only: the passive and active health checks' state of
	// the worker (ejection), when any outcome was reported. Never stored.
	Health *HealthView `json:"health,omitempty"`
}

// RankEventsStatus is one rank's KV event listener state, as GET /workers shows
// it.
type RankEventsStatus struct {
	Connected bool `json:"connected"`
	// LastSequence is the last accepted batch sequence number; absent before the
	// first batch.
	LastSequence *uint64 `json:"last_sequence,omitempty"`
	// Complete is false once any batch is known lost (a sequence gap that replay
	// could not fill) or dropped as malformed since the listener started: the
	// index may then miss blocks the worker holds, or hold blocks it freed.
	Complete bool `json:"complete"`
	// LostBatches counts batches lost to gaps plus batches dropped as malformed.
	LostBatches uint64 `json:"lost_batches"`
	// IncompleteReason is the reason of the latest incomplete replay
	// (empty, started_after_requested, non_contiguous, ended_before_target,
	// replay_failed) or no_replay_endpoint.
	IncompleteReason string `json:"incomplete_reason,omitempty"`
	LastError        string `json:"last_error,omitempty"`
}

// KVTransferEnforcements are the values kv_transfer_enforcement accepts.
var KVTransferEnforcements = []string{"required", "preferred"}

// StateAgentV2 is the kv_event_source_mode of workers whose events come from a
// state agent: they can receive KV hints but are never chosen as hint sources.
const StateAgentV2 = "state_agent_v2"

// Normalize fills the partition defaults and turns absent collections into empty
// ones, so a record serializes `taints: []` and `topology_domains: {}` as Dynamo
// does. It validates enums that the wire restricts.
func (r *Record) Normalize() error {
	if r.ModelName == "" {
		r.ModelName = DefaultPartitionName
	}
	if r.RoutingGroup == "" && !r.IsPrefill() {
		// A prefill worker's group is the service's prefill group
		// (ResolveRole), which only the service knows.
		r.RoutingGroup = DefaultPartitionName
	}
	if r.Taints == nil {
		r.Taints = []string{}
	}
	if r.TopologyDomains == nil {
		r.TopologyDomains = map[string]string{}
	}
	if e := r.KVTransferEnforcement; e != nil && !slices.Contains(KVTransferEnforcements, *e) {
		return fmt.Errorf("kv_transfer_enforcement must be \"required\" or \"preferred\", not %q", *e)
	}
	if ro := r.Role; ro != nil && !slices.Contains(Roles, *ro) {
		return fmt.Errorf("role must be one of %s, not %q", strings.Join(Roles, ", "), *ro)
	}
	if e := r.Engine; e != nil && !slices.Contains(Engines, *e) {
		return fmt.Errorf("engine must be one of %s, not %q", strings.Join(Engines, ", "), *e)
	}
	if m := r.MetricsEndpoint; m != nil {
		if err := ValidateHTTPURL(*m); err != nil {
			return fmt.Errorf("metrics_endpoint: %w", err)
		}
	}
	return nil
}

// Clone returns a deep copy, so callers can hand records out without sharing maps.
func (r *Record) Clone() *Record {
	c := *r
	c.KVEventsEndpoints = maps.Clone(r.KVEventsEndpoints)
	c.Taints = slices.Clone(r.Taints)
	c.TopologyDomains = maps.Clone(r.TopologyDomains)
	c.RouterHintSourceControlEndpoints = maps.Clone(r.RouterHintSourceControlEndpoints)
	c.NotSchedulableReasons = slices.Clone(r.NotSchedulableReasons)
	c.SourceReasons = slices.Clone(r.SourceReasons)
	c.KVEventsStatus = maps.Clone(r.KVEventsStatus)
	c.EngineMetrics = r.EngineMetrics.clone()
	c.Health = r.Health.clone()
	return &c
}

// StartRank is data_parallel_start_rank (0 when absent).
func (r *Record) StartRank() uint32 { return deref(r.DataParallelStartRank, 0) }

// DPSize is data_parallel_size (1 when absent).
func (r *Record) DPSize() uint32 { return deref(r.DataParallelSize, 1) }

// Ranks lists the worker's global data-parallel ranks [start, start+size).
func (r *Record) Ranks() []uint32 {
	out := make([]uint32, 0, r.DPSize())
	for i := range r.DPSize() {
		out = append(out, r.StartRank()+i)
	}
	return out
}

// HasRank reports whether rank is inside the worker's current range.
func (r *Record) HasRank(rank uint32) bool {
	return rank >= r.StartRank() && rank-r.StartRank() < r.DPSize()
}

// EndpointOrEmpty is the client-facing endpoint.
func (r *Record) EndpointOrEmpty() string { return deref(r.Endpoint, "") }

// RankEndpoints is where one rank's KV events come from: a PUB endpoint the
// listener dials (subscribe mode), or, with KVEvents empty, the collector
// socket, where the rank's messages are recognised by their topic.
type RankEndpoints struct {
	KVEvents string // ZMQ PUB endpoint of the rank's publisher; "" = the collector
	Replay   string // ZMQ ROUTER endpoint for gap replay; "" = none
	// Set when a collector is bound: the worker's kv_events_topic, and the
	// host:port of its endpoint that llm-d's topic convention names ("" when
	// the endpoint has none).
	Topic    string
	HostPort string
}

// KVEndpoints returns each rank's event endpoints: kv_events_endpoints, or the
// legacy kv_events_endpoint for a single-rank worker that sent no map (Dynamo
// maps it to data_parallel_start_rank and ignores it for data_parallel_size > 1).
// With collector set (kvselect binds a collector socket), every rank without
// an endpoint of its own is fed by the collector; otherwise such ranks are
// absent. An explicit endpoint always wins over the collector.
func (r *Record) KVEndpoints(collector bool) map[uint32]RankEndpoints {
	out := make(map[uint32]RankEndpoints)
	replay := deref(r.ReplayEndpoint, "")
	if len(r.KVEventsEndpoints) == 0 {
		if ep := deref(r.KVEventsEndpoint, ""); ep != "" && r.DPSize() == 1 {
			out[r.StartRank()] = RankEndpoints{KVEvents: ep, Replay: replay}
		}
	} else {
		for _, rank := range r.Ranks() {
			if ep := r.KVEventsEndpoints[rank]; ep != "" {
				out[rank] = RankEndpoints{KVEvents: ep, Replay: replay}
			}
		}
	}
	if collector {
		// Subscribed ranks carry the topic keys too, so that the collector can
		// tell their messages (fed by the subscription, skipped) from unknown ones.
		hp, _ := HostPort(deref(r.Endpoint, ""))
		topic := deref(r.KVEventsTopic, "")
		for _, rank := range r.Ranks() {
			e := out[rank]
			if e.KVEvents == "" {
				e.Replay = replay
			}
			e.Topic, e.HostPort = topic, hp
			out[rank] = e
		}
	}
	return out
}

// Checks are the service settings that decide schedulability.
type Checks struct {
	// Queueing: max_num_batched_tokens becomes required.
	Queueing bool
	// ConsumesEvents: the service itself listens to KV events, so every rank
	// needs an event endpoint and replay needs a single rank.
	ConsumesEvents bool
	// Collector: a collector socket is bound, so a rank without an event
	// endpoint is fed through it and needs only a topic to be recognised by:
	// kv_events_topic, or an endpoint with a host and port.
	Collector bool
	// PrefillGroup is the service's prefill routing group: a worker's role
	// must agree with whether it is in it.
	PrefillGroup string
}

// Reasons computes why r cannot be scheduled, in Dynamo's order and words
// (the first step of an upsert in services/selection/core/workers.rs, before
// the partition is looked up). Partition and listener checks come later from
// the service and are appended by it.
func (r *Record) Reasons(c Checks) []string {
	out := slices.Clone(r.SourceReasons)
	if deref(r.Endpoint, "") == "" {
		out = append(out, "endpoint is required")
	}
	if deref(r.BlockSize, 0) == 0 {
		out = append(out, "block_size must be greater than 0")
	}
	if r.DataParallelSize != nil && *r.DataParallelSize == 0 {
		out = append(out, "data_parallel_size must be greater than 0")
	}
	if c.Queueing && r.MaxNumBatchedTokens == nil {
		out = append(out, "max_num_batched_tokens is required while queueing is enabled")
	}
	if c.ConsumesEvents && r.DPSize() > 0 {
		eps := r.KVEndpoints(c.Collector)
		for _, rank := range r.Ranks() {
			e, ok := eps[rank]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("kv_events endpoint is required for dp_rank %d", rank))
			case e.KVEvents == "" && e.Topic == "" && e.HostPort == "" && deref(r.Endpoint, "") != "":
				out = append(out, fmt.Sprintf("dp_rank %d is fed by the kv events collector but the endpoint has no host:port for its topic; set kv_events_topic", rank))
			}
		}
		if r.DPSize() > 1 && deref(r.ReplayEndpoint, "") != "" {
			out = append(out, "replay_endpoint is supported only for data_parallel_size 1")
		}
	}
	// A worker without a role is whatever its group makes it, as in
	// Dynamo, where the prefill pool is simply a routing group.
	if c.PrefillGroup != "" && r.Role != nil {
		switch role := *r.Role; {
		case role == RolePrefill && r.RoutingGroup != c.PrefillGroup:
			out = append(out, fmt.Sprintf("role prefill conflicts with routing_group %q: prefill workers belong to the prefill routing group %q", r.RoutingGroup, c.PrefillGroup))
		case role != RolePrefill && r.RoutingGroup == c.PrefillGroup:
			out = append(out, fmt.Sprintf("role %s conflicts with routing_group %q, the prefill routing group (set role prefill, or another group)", role, r.RoutingGroup))
		}
	}
	return out
}

// IsPrefill reports whether the record says role prefill.
func (r *Record) IsPrefill() bool { return r.Role != nil && *r.Role == RolePrefill }

// ResolveRole puts a prefill worker registered without a routing group into
// prefillGroup, the service's prefill routing group.
func (r *Record) ResolveRole(prefillGroup string) {
	if r.IsPrefill() && r.RoutingGroup == "" {
		r.RoutingGroup = prefillGroup
	}
}

// Worker roles in disaggregated prefill/decode serving (Record.Role).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
	RoleBoth    = "both"
)

// Roles are the values Record.Role accepts.
var Roles = []string{RolePrefill, RoleDecode, RoleBoth}

// Patch is a PATCH /workers/{id} body: present scalar fields replace, absent or
// null ones leave the record alone; present maps and lists replace wholesale.
// worker_id, model_name and routing_group cannot be patched (a move needs POST).
type Patch struct {
	Endpoint                         *string           `json:"endpoint"`
	KVEventsEndpoint                 *string           `json:"kv_events_endpoint"`
	KVEventsEndpoints                map[uint32]string `json:"kv_events_endpoints"`
	ReplayEndpoint                   *string           `json:"replay_endpoint"`
	KVEventsTopic                    *string           `json:"kv_events_topic"`
	Engine                           *string           `json:"engine"`
	MetricsEndpoint                  *string           `json:"metrics_endpoint"`
	BlockSize                        *uint32           `json:"block_size"`
	DataParallelStartRank            *uint32           `json:"data_parallel_start_rank"`
	DataParallelSize                 *uint32           `json:"data_parallel_size"`
	MaxNumBatchedTokens              *uint64           `json:"max_num_batched_tokens"`
	TotalKVBlocks                    *uint64           `json:"total_kv_blocks"`
	StableRoutingID                  *string           `json:"stable_routing_id"`
	IsEagle                          *bool             `json:"is_eagle"`
	Taints                           []string          `json:"taints"`
	TopologyDomains                  map[string]string `json:"topology_domains"`
	KVTransferDomain                 *string           `json:"kv_transfer_domain"`
	KVTransferEnforcement            *string           `json:"kv_transfer_enforcement"`
	KVTransferPreferredWeight        *float32          `json:"kv_transfer_preferred_weight"`
	RouterHintWorkerType             *string           `json:"router_hint_worker_type"`
	RouterHintSourceControlEndpoints map[uint32]string `json:"router_hint_source_control_endpoints"`
	KVEventSourceMode                *string           `json:"kv_event_source_mode"`
}

// Apply returns a copy of r with the patch applied.
func (p *Patch) Apply(r *Record) *Record {
	c := r.Clone()
	set(&c.Endpoint, p.Endpoint)
	set(&c.KVEventsEndpoint, p.KVEventsEndpoint)
	set(&c.ReplayEndpoint, p.ReplayEndpoint)
	set(&c.KVEventsTopic, p.KVEventsTopic)
	set(&c.Engine, p.Engine)
	set(&c.MetricsEndpoint, p.MetricsEndpoint)
	set(&c.BlockSize, p.BlockSize)
	set(&c.DataParallelStartRank, p.DataParallelStartRank)
	set(&c.DataParallelSize, p.DataParallelSize)
	set(&c.MaxNumBatchedTokens, p.MaxNumBatchedTokens)
	set(&c.TotalKVBlocks, p.TotalKVBlocks)
	set(&c.StableRoutingID, p.StableRoutingID)
	set(&c.IsEagle, p.IsEagle)
	set(&c.KVTransferDomain, p.KVTransferDomain)
	set(&c.KVTransferEnforcement, p.KVTransferEnforcement)
	set(&c.KVTransferPreferredWeight, p.KVTransferPreferredWeight)
	set(&c.RouterHintWorkerType, p.RouterHintWorkerType)
	set(&c.KVEventSourceMode, p.KVEventSourceMode)
	if p.KVEventsEndpoints != nil {
		c.KVEventsEndpoints = maps.Clone(p.KVEventsEndpoints)
	}
	if p.Taints != nil {
		c.Taints = slices.Clone(p.Taints)
	}
	if p.TopologyDomains != nil {
		c.TopologyDomains = maps.Clone(p.TopologyDomains)
	}
	if p.RouterHintSourceControlEndpoints != nil {
		c.RouterHintSourceControlEndpoints = maps.Clone(p.RouterHintSourceControlEndpoints)
	}
	return c
}

func set[T any](dst **T, v *T) {
	if v != nil {
		x := *v
		*dst = &x
	}
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// Sort orders records by (model_name, routing_group, worker_id), the order of
// GET /workers and /ready.
func Sort(rs []*Record) {
	slices.SortFunc(rs, func(a, b *Record) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.RoutingGroup, b.RoutingGroup), cmp.Compare(a.WorkerID, b.WorkerID))
	})
}

// ValidateZMQEndpoint checks ZMQ endpoint syntax as Dynamo does for KV-event,
// replay and replica peer endpoints: scheme tcp, ipc or inproc; tcp needs a
// non-empty host and a u16 port, IPv6 bracketed. The error texts are Dynamo's,
// since POST /replica_sync/register_peer returns them as its 400 body.
func ValidateZMQEndpoint(ep string) error {
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok {
		return fmt.Errorf("invalid ZMQ endpoint `%s`: missing scheme", ep)
	}
	switch scheme {
	case "ipc", "inproc":
		if addr == "" {
			return fmt.Errorf("invalid ZMQ endpoint `%s`: missing address", ep)
		}
		return nil
	case "tcp":
	default:
		return fmt.Errorf("invalid ZMQ endpoint `%s`: unsupported scheme `%s`", ep, scheme)
	}
	var host, port string
	if strings.HasPrefix(addr, "[") {
		end := strings.Index(addr, "]")
		if end < 0 {
			return fmt.Errorf("invalid ZMQ endpoint `%s`: unterminated IPv6 address", ep)
		}
		host, port = addr[1:end], strings.TrimPrefix(addr[end+1:], ":")
		if !strings.HasPrefix(addr[end+1:], ":") {
			return fmt.Errorf("invalid ZMQ endpoint `%s`: missing TCP port", ep)
		}
	} else {
		i := strings.LastIndex(addr, ":")
		if i < 0 {
			return fmt.Errorf("invalid ZMQ endpoint `%s`: missing TCP port", ep)
		}
		host, port = addr[:i], addr[i+1:]
		if strings.Contains(host, ":") {
			return fmt.Errorf("invalid ZMQ endpoint `%s`: IPv6 addresses must be bracketed", ep)
		}
	}
	if host == "" {
		return fmt.Errorf("invalid ZMQ endpoint `%s`: missing TCP host", ep)
	}
	if port == "" {
		return fmt.Errorf("invalid ZMQ endpoint `%s`: missing TCP port", ep)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("invalid ZMQ endpoint `%s`: invalid TCP port `%s`", ep, port)
	}
	return nil
}

// HostPort returns the host:port an endpoint names, in the form llm-d's KV
// event topics use (kv@<host>:<port>@<model>): a URL ("http://10.0.0.7:8000/v1",
// the port defaulting to 80 or 443 by scheme) or a bare "host:port". IPv6
// hosts come back bracketed and hosts lower-cased, so equal addresses compare
// equal. ok is false when no host and port can be read.
func HostPort(endpoint string) (hostPort string, ok bool) {
	rest := endpoint
	defPort := ""
	if scheme, after, found := strings.Cut(endpoint, "://"); found {
		switch strings.ToLower(scheme) {
		case "http":
			defPort = "80"
		case "https":
			defPort = "443"
		}
		rest = after
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			rest = rest[:i]
		}
		if i := strings.LastIndex(rest, "@"); i >= 0 { // user info
			rest = rest[i+1:]
		}
	}
	var host, port string
	switch {
	case strings.HasPrefix(rest, "["):
		end := strings.Index(rest, "]")
		if end < 0 {
			return "", false
		}
		host, port = rest[1:end], strings.TrimPrefix(rest[end+1:], ":")
		if port == "" && rest[end+1:] != "" {
			return "", false
		}
	case strings.Count(rest, ":") > 1: // an unbracketed IPv6 literal: the port is after the last colon
		i := strings.LastIndex(rest, ":")
		host, port = rest[:i], rest[i+1:]
	default:
		host, port, _ = strings.Cut(rest, ":")
	}
	if port == "" {
		port = defPort
	}
	if host == "" || port == "" {
		return "", false
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", false
	}
	host = strings.ToLower(host)
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port, true
	}
	return host + ":" + port, true
}
