package extproc

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// Request headers of flow control. The first two are GIE's
// (gateway-api-inference-extension v1.5.0, pkg/epp/metadata/consts.go:
// ObjectiveKey, FlowFairnessIDKey); like GIE, the picker strips all three
// before the request reaches the worker.
const (
	// HeaderObjective names the request's InferenceObjective, whose
	// priority becomes the request's (Options.Objectives).
	HeaderObjective = "x-gateway-inference-objective"
	// HeaderFairnessID is the tenant the request is shared fairly as.
	HeaderFairnessID = "x-gateway-inference-fairness-id"
	// HeaderPriority sets the priority directly, over the objective's.
	HeaderPriority = "x-kvselect-priority"
	// HeaderSLOTTFT and HeaderSLOTPOT are the request's latency objectives
	// in milliseconds (time to first token, time per output token), as
	// llm-d's router reads them (pkg/epp/metadata/consts.go at v0.10.0);
	// the predicted-latency policy places the request by them.
	HeaderSLOTTFT = "x-llm-d-slo-ttft-ms"
	HeaderSLOTPOT = "x-llm-d-slo-tpot-ms"
	// HeaderSLOTTFTLegacy and HeaderSLOTPOTLegacy are the older names, read
	// when the new ones are absent.
	HeaderSLOTTFTLegacy = "x-slo-ttft-ms"
	HeaderSLOTPOTLegacy = "x-slo-tpot-ms"
)

// maxWarnedObjectives bounds the unknown objective names logged (each once).
const maxWarnedObjectives = 100

// unknownObjectives counts requests naming an objective nobody defined and
// logs each such name once, up to maxWarnedObjectives names.
type unknownObjectives struct {
	mu     sync.Mutex
	warned map[string]bool
}

// parsePriority reads HeaderPriority: a decimal integer within the flow
// controller's bounds.
func parsePriority(s string) (int, error) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("header %s: %q is not an integer", HeaderPriority, s)
	}
	if v < flow.MinPriority || v > flow.MaxPriority {
		return 0, fmt.Errorf("header %s: priority %d is out of range [%d, %d]", HeaderPriority, v, flow.MinPriority, flow.MaxPriority)
	}
	return int(v), nil
}

// flowFields puts the request's priority and tenant into req: the priority
// header, else the objective's priority (an objective no table defines is
// priority 0 and returned as unknown), else none (0); the tenant is the
// fairness id. A malformed header is the client's 400.
func flowFields(id *identity, objectives *flow.Objectives, req *selection.SelectRequest) (unknown string, err error) {
	if err := selection.CheckTenant(id.tenant); err != nil {
		return "", fmt.Errorf("header %s: %w", HeaderFairnessID, err)
	}
	req.Tenant = id.tenant
	switch {
	case id.priority != "":
		p, err := parsePriority(id.priority)
		if err != nil {
			return "", err
		}
		req.Priority = &p
	case id.objective != "":
		p, ok := objectives.Lookup(id.objective)
		if !ok {
			return id.objective, nil
		}
		req.Priority = &p
	}
	return "", nil
}

func (u *unknownObjectives) warn(s *Server, name string) {
	u.mu.Lock()
	first := !u.warned[name] && len(u.warned) < maxWarnedObjectives
	if first {
		if u.warned == nil {
			u.warned = make(map[string]bool)
		}
		u.warned[name] = true
	}
	u.mu.Unlock()
	if first {
		s.log.Warn("extproc: request names an unknown InferenceObjective: priority 0 (logged once per name)",
			"objective", name, "header", HeaderObjective)
	}
}
