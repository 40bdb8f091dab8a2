package selection

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
)

// Flow control (Config.Flow): while every eligible worker of a partition is
// busy, its waiting requests are ordered by the partition's flow.Controller —
// priority bands, fairness between tenants, FIFO inside a tenant — instead of
// Dynamo's queue policy, and limited: queued bytes, a time to live, and
// sheddable requests (negative priority) never wait. The controller is the
// deterministic part; choose only waits for what it says.

// Flow outcomes, one per request that met flow control (FlowEvent.Outcome).
const (
	FlowDispatched = "dispatched" // waited (possibly 0), then got a worker
	FlowExpired    = "expired"    // waited its TTL
	FlowShed       = "shed"       // sheddable, the pool saturated: not queued
	FlowRejected   = "rejected"   // the queue's byte or tenant limit
	FlowAbandoned  = "abandoned"  // its client went away while it waited
)

// FlowEvent is one request leaving flow control, for metrics.
type FlowEvent struct {
	Model, RoutingGroup string
	Priority            int
	Tenant              string
	Outcome             string
	Wait                time.Duration
}

// PartitionFlow is one partition's flow control state (GET /flow).
type PartitionFlow struct {
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
	flow.State
}

// FlowState snapshots every partition's waiting requests; empty with flow
// control off.
func (s *Service) FlowState() []PartitionFlow {
	out := []PartitionFlow{}
	if s.flowCfg == nil {
		return out
	}
	now := s.clock()
	for _, p := range s.partitions() {
		p.queueMu.Lock()
		st := p.flow.State(now)
		p.queueMu.Unlock()
		out = append(out, PartitionFlow{ModelName: p.key.Model, RoutingGroup: p.key.RoutingGroup, State: st})
	}
	slices.SortFunc(out, func(a, b PartitionFlow) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.RoutingGroup, b.RoutingGroup))
	})
	return out
}

// FlowConfig is the flow control configuration, nil when it is off.
func (s *Service) FlowConfig() *flow.Config {
	if s.flowCfg == nil {
		return nil
	}
	c := *s.flowCfg
	return &c
}

// checkFlowFields validates what flow control reads from a request, whether
// or not flow control is on: a request is refused the same way everywhere.
func checkFlowFields(req *SelectRequest) error {
	if p := req.Priority; p != nil && (*p < flow.MinPriority || *p > flow.MaxPriority) {
		return apierr.New(KindBadRequest, "priority %d is out of range [%d, %d]", *p, flow.MinPriority, flow.MaxPriority)
	}
	return CheckTenant(req.Tenant)
}

// CheckTenant validates a tenant id: at most flow.MaxTenantLen bytes of
// printable UTF-8.
func CheckTenant(t string) error {
	if len(t) > flow.MaxTenantLen {
		return apierr.New(KindBadRequest, "tenant id is %d bytes long, more than %d", len(t), flow.MaxTenantLen)
	}
	if !utf8.ValidString(t) {
		return apierr.New(KindBadRequest, "tenant id is not valid UTF-8")
	}
	for _, r := range t {
		if r < 0x20 || r == 0x7f {
			return apierr.New(KindBadRequest, "tenant id contains the control character %U", r)
		}
	}
	return nil
}

// flowPriority is the band of req: its priority, else Dynamo's
// strict_priority.
func flowPriority(req *SelectRequest) int {
	if req == nil {
		return 0
	}
	if req.Priority != nil {
		return *req.Priority
	}
	return int(min(req.StrictPriority, flow.MaxPriority))
}

// flowRequest is what the controller knows of req: its band, tenant, bytes
// and cost — the uncached prompt tokens at the best cached prefix plus the
// expected output tokens.
func flowRequest(req *SelectRequest, isl, cached int) flow.Request {
	r := flow.Request{Priority: flowPriority(req), ISL: isl, Cost: int64(max(isl-cached, 1))}
	if req != nil {
		r.Tenant, r.Bytes = req.Tenant, int64(req.RequestBytes)
		if o := req.ExpectedOutputTokens; o != nil {
			r.Cost += int64(*o)
		}
	}
	if r.Tenant == "" {
		r.Tenant = flow.DefaultTenant
	}
	return r
}

// flowError is the 429 of a request flow control turned away.
func flowError(outcome string, p *partition, r flow.Request, cause error) error {
	msg := cause.Error()
	switch outcome {
	case FlowShed:
		msg = fmt.Sprintf("sheddable request (priority %d) rejected: every worker of %s is busy", r.Priority, displayKey(p.key))
	case FlowExpired:
		msg = fmt.Sprintf("request waited the flow control queue TTL for a worker of %s", displayKey(p.key))
	}
	return apierr.WithDetails(KindOverloaded, msg, cause,
		map[string]any{"flow_outcome": outcome, "priority": r.Priority, "tenant": r.Tenant})
}

// noteFlow reports a request leaving flow control.
func (s *Service) noteFlow(key index.Partition, r flow.Request, outcome string, wait time.Duration) {
	if s.onFlow != nil {
		s.onFlow(FlowEvent{Model: key.Model, RoutingGroup: key.RoutingGroup, Priority: r.Priority, Tenant: r.Tenant, Outcome: outcome, Wait: wait})
	}
}

// Causes inside the errors of shed and expired requests.
var (
	errFlowShed    = errors.New("flow control: sheddable request while saturated")
	errFlowExpired = errors.New("flow control: queue TTL passed")
)
