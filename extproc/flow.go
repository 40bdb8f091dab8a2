package extproc

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// Request headers of flow control. The objective and fairness names are
// llm-d's router's (llm-d-router v0.10.0, pkg/epp/metadata/consts.go), whose
// older GIE names (gateway-api-inference-extension v1.5.0) it still reads as
// deprecated aliases; so does the picker, the current name winning when a
// request sends both, and it strips every one of them before the request
// reaches the worker, as those pickers do.
const (
	// HeaderObjective names the request's InferenceObjective, whose
	// priority becomes the request's (Options.Objectives).
	HeaderObjective = "x-llm-d-inference-objective"
	// HeaderFairnessID is the tenant the request is shared fairly as.
	HeaderFairnessID = "x-llm-d-inference-fairness-id"
	// HeaderObjectiveLegacy and HeaderFairnessIDLegacy are the deprecated
	// GIE names of the two, read when the current ones are absent.
	HeaderObjectiveLegacy  = "x-gateway-inference-objective"
	HeaderFairnessIDLegacy = "x-gateway-inference-fairness-id"
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

// deprecatedHeaders are the deprecated aliases a request may send, in the
// order of their bits in identity.deprecated; each is counted
// (kvselect_extproc_deprecated_headers_total) and logged once.
var deprecatedHeaders = [...]string{HeaderObjectiveLegacy, HeaderFairnessIDLegacy, HeaderSLOTTFTLegacy, HeaderSLOTPOTLegacy, HeaderModelRewriteLegacy}

// Bits of identity.deprecated, one per deprecatedHeaders entry.
const (
	sentObjectiveLegacy uint8 = 1 << iota
	sentFairnessIDLegacy
	sentSLOTTFTLegacy
	sentSLOTPOTLegacy
	sentModelRewriteLegacy // rewrite.go
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
// fairness id, else — with Options.SessionAsFairnessID — the request's
// session id when it is a valid tenant. Each header's current name wins over
// its deprecated alias. A malformed header is the client's 400.
func flowFields(id *identity, opts *Options, session string, req *selection.SelectRequest) (unknown string, err error) {
	tenant, header := id.tenant, HeaderFairnessID
	if tenant == "" {
		tenant, header = id.tenantLegacy, HeaderFairnessIDLegacy
	}
	if err := selection.CheckTenant(tenant); err != nil {
		return "", fmt.Errorf("header %s: %w", header, err)
	}
	if tenant == "" && opts.SessionAsFairnessID && selection.CheckTenant(session) == nil {
		// A session id too long or unprintable for a tenant leaves the
		// request in the default flow rather than failing it: the client
		// sent no fairness id to be wrong.
		tenant = session
	}
	req.Tenant = tenant
	objective := cmp.Or(id.objective, id.objectiveLegacy)
	switch {
	case id.priority != "":
		p, err := parsePriority(id.priority)
		if err != nil {
			return "", err
		}
		req.Priority = &p
	case objective != "":
		p, ok := opts.Objectives.Lookup(objective)
		if !ok {
			return objective, nil
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

// countDeprecated counts the deprecated header names a request sent and logs
// the first use of each.
func (s *Server) countDeprecated(sent uint8) {
	if sent == 0 {
		return
	}
	for i, name := range deprecatedHeaders {
		if sent&(1<<i) == 0 {
			continue
		}
		s.metrics.deprecated[i].Add(1)
		if !s.deprecatedWarned[i].Swap(true) {
			s.log.Warn("extproc: request sent a deprecated header name; send the current one (logged once per name)",
				"header", name, "current", currentHeaders[i])
		}
	}
}

// currentHeaders are the current names of deprecatedHeaders, entry by entry.
var currentHeaders = [...]string{HeaderObjective, HeaderFairnessID, HeaderSLOTTFT, HeaderSLOTPOT, HeaderModelRewrite}
