package selection

import (
	"github.com/kvselect/kvselect/selection/admission"
	"github.com/kvselect/kvselect/selection/flow"
)

// Flow control (Config.Flow): while every eligible worker of a partition is
// busy, its waiting requests are ordered by the partition's flow.Controller —
// priority bands, fairness between tenants, FIFO inside a tenant — instead of
// Dynamo's queue policy, and limited: queued bytes, a time to live, and
// sheddable requests (negative priority) never wait. The controller is the
// deterministic part; each partition's waiting room (package admission) holds
// the requests and turns them away, and choose only waits for what it says.

// Flow outcomes, one per request that met flow control (FlowEvent.Outcome).
const (
	FlowDispatched = admission.Dispatched // waited (possibly 0), then got a worker
	FlowExpired    = admission.Expired    // waited its TTL
	FlowShed       = admission.Shed       // sheddable, the pool saturated: not queued
	FlowRejected   = admission.Rejected   // the queue's byte or tenant limit
	FlowAbandoned  = admission.Abandoned  // its client went away while it waited
)

// FlowEvent is one request leaving flow control, for metrics.
type FlowEvent = admission.Event

// PartitionFlow is one partition's flow control state (GET /flow).
type PartitionFlow struct {
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
	flow.State
}

// CheckTenant validates a tenant id: at most flow.MaxTenantLen bytes of
// printable UTF-8.
func CheckTenant(t string) error { return admission.CheckTenant(t) }
