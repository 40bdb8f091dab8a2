package scheduler

// Conditional disaggregation: whether a request whose decode worker is chosen
// prefills its prompt remotely, on a worker of the model's prefill pool, or
// locally on the decode worker. The rules are Dynamo's: the policies of
// lib/kv-router/src/conditional_disagg.rs and the decode gate of
// lib/llm/src/kv_router/prefill_router/conditional_bypass.rs in
// ai-dynamo/dynamo (commits 48bbf30c and e311655f). In Dynamo's words a local
// prefill "bypasses" the remote one.

import "github.com/kvselect/kvselect/selection/routerconfig"

// Reasons a disaggregated request is prefilled where it is. The first five
// are the labels Dynamo's prefill router logs for the same outcomes.
const (
	// ReasonDisaggUnconditional: conditional disaggregation is off, so every
	// request of a model with a prefill pool prefills remotely (remote).
	ReasonDisaggUnconditional = "conditional_disagg_disabled"
	// ReasonPolicyDeclined: the policy wants the remote prefill (remote).
	ReasonPolicyDeclined = "bypass_declined_by_policy"
	// ReasonDecodeBusy: the policy allowed a local prefill but the decode
	// worker is over its decode-busy line (remote).
	ReasonDecodeBusy = "bypass_denied_decode_busy"
	// ReasonDecodeBusyUnknown: the decode gate is on but the decode worker's
	// capacity (total_kv_blocks) is unknown, so the gate cannot clear it
	// (remote).
	ReasonDecodeBusyUnknown = "bypass_denied_decode_busy_unknown"
	// ReasonDecodeGateOff: the policy allowed a local prefill and no decode
	// gate is configured (local).
	ReasonDecodeGateOff = "bypass_allowed_decode_gate_disabled"
	// ReasonDecodeNotBusy: the policy allowed a local prefill and the decode
	// worker is under its decode-busy line (local).
	ReasonDecodeNotBusy = "bypass_allowed_decode_not_busy"
	// ReasonNoPrefillWorkers: the model's prefill pool has no schedulable
	// worker (local).
	ReasonNoPrefillWorkers = "no_prefill_workers"
	// ReasonPrefillUnavailable: the prefill pool could not take the request
	// (every worker ejected by the health checks, overloaded, or filtered
	// out), so the decode worker prefills it rather than fail it (local).
	ReasonPrefillUnavailable = "prefill_unavailable"
)

// DisaggReasons lists every reason, remote ones first.
var DisaggReasons = [...]string{
	ReasonDisaggUnconditional, ReasonPolicyDeclined, ReasonDecodeBusy, ReasonDecodeBusyUnknown,
	ReasonDecodeGateOff, ReasonDecodeNotBusy, ReasonNoPrefillWorkers, ReasonPrefillUnavailable,
}

// ReasonRemote reports whether reason is a remote-prefill outcome.
func ReasonRemote(reason string) bool {
	switch reason {
	case ReasonDisaggUnconditional, ReasonPolicyDeclined, ReasonDecodeBusy, ReasonDecodeBusyUnknown:
		return true
	}
	return false
}

// DisaggPolicy is the conditional disaggregation configuration.
type DisaggPolicy struct {
	// Conditional is conditional_disagg_enabled: false prefills every
	// request remotely.
	Conditional bool
	Kind        routerconfig.ConditionalDisaggPolicy
	// EffISLThreshold and EffISLRatioThreshold bound a local prefill under
	// isl_bounding: uncached tokens < EffISLThreshold and uncached tokens /
	// prompt tokens < EffISLRatioThreshold.
	EffISLThreshold      int
	EffISLRatioThreshold float64
	// DecodeGate is set when conditional_disagg_decode_busy_threshold is:
	// a local prefill then also needs the decode worker known not busy.
	DecodeGate bool
}

// NeedsPrefillBusy reports whether Decide reads DisaggInput.PrefillBusy, so
// the caller can skip the prefill pool probe otherwise (Dynamo skips its
// prefill peek for isl_bounding the same way).
func (p DisaggPolicy) NeedsPrefillBusy() bool {
	return p.Conditional && (p.Kind == routerconfig.DisaggPrefillLoad || p.Kind == routerconfig.DisaggISLOrLoad)
}

// DisaggInput is what the decision reads.
type DisaggInput struct {
	// PromptTokens is the prompt's length (isl).
	PromptTokens int
	// CachedTokens is the decode worker's weighted cache credit for the
	// prompt (device blocks in full, host and disk tiers by their hit
	// weights), in tokens: PromptTokens minus the selection's
	// effective_prefill_tokens.
	CachedTokens int
	// PrefillBusy is whether the prefill worker that would take the request
	// is over the prefill-busy line; nil when unknown (treated as calm).
	PrefillBusy *bool
	// DecodeBusy is the decode worker's decode_busy (potential decode blocks
	// with this request > threshold × total_kv_blocks); nil when unknown.
	DecodeBusy *bool
}

// UncachedTokens is the prompt's net-new prefill on the decode worker.
func (in DisaggInput) UncachedTokens() int {
	return in.PromptTokens - min(max(in.CachedTokens, 0), in.PromptTokens)
}

// Decide says whether the request prefills remotely, and why (one of the
// Reason* constants but the last two, which are the caller's fallbacks).
func (p DisaggPolicy) Decide(in DisaggInput) (remote bool, reason string) {
	if !p.Conditional {
		return true, ReasonDisaggUnconditional
	}
	if !p.bypass(in) {
		return true, ReasonPolicyDeclined
	}
	switch {
	case !p.DecodeGate:
		return false, ReasonDecodeGateOff
	case in.DecodeBusy == nil:
		return true, ReasonDecodeBusyUnknown
	case *in.DecodeBusy:
		return true, ReasonDecodeBusy
	}
	return false, ReasonDecodeNotBusy
}

// bypass is the policy's verdict: true for a local prefill.
func (p DisaggPolicy) bypass(in DisaggInput) bool {
	switch p.Kind {
	case routerconfig.DisaggPrefillLoad:
		return p.prefillLoad(in)
	case routerconfig.DisaggISLOrLoad:
		return p.islBounding(in) || p.prefillLoad(in)
	}
	return p.islBounding(in)
}

func (p DisaggPolicy) islBounding(in DisaggInput) bool {
	eff := in.UncachedTokens()
	if eff >= p.EffISLThreshold {
		return false
	}
	return float64(eff)/float64(max(in.PromptTokens, 1)) < p.EffISLRatioThreshold
}

// prefillLoad: an unknown signal is calm, so the request stays remote.
func (p DisaggPolicy) prefillLoad(in DisaggInput) bool {
	return in.PrefillBusy != nil && *in.PrefillBusy
}
