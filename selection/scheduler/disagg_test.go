package scheduler

import (
	"testing"

	"github.com/kvselect/kvselect/selection/routerconfig"
)

// TestDisaggDecide holds Dynamo's conditional disaggregation vectors
// (conditional_disagg.rs tests at 48bbf30c, the decode gate of
// conditional_bypass.rs at e311655f), restated as remote/local: a "bypass" is
// a local prefill.
func TestDisaggDecide(t *testing.T) {
	isl := DisaggPolicy{Conditional: true, Kind: routerconfig.DisaggISLBounding, EffISLThreshold: 2048, EffISLRatioThreshold: 0.7}
	loose := isl
	loose.EffISLRatioThreshold = 0.99
	load := DisaggPolicy{Conditional: true, Kind: routerconfig.DisaggPrefillLoad, EffISLThreshold: 2048, EffISLRatioThreshold: 0.7}
	either := DisaggPolicy{Conditional: true, Kind: routerconfig.DisaggISLOrLoad, EffISLThreshold: 2048, EffISLRatioThreshold: 0.7}
	gated := isl
	gated.DecodeGate = true
	blocks := func(prompt, overlap, blockSize int) DisaggInput {
		return DisaggInput{PromptTokens: prompt, CachedTokens: overlap * blockSize}
	}
	withBusy := func(in DisaggInput, prefill, decode *bool) DisaggInput {
		in.PrefillBusy, in.DecodeBusy = prefill, decode
		return in
	}
	for _, tc := range []struct {
		name       string
		p          DisaggPolicy
		in         DisaggInput
		wantRemote bool
		wantReason string
	}{
		{"unconditional is always remote", DisaggPolicy{}, blocks(100, 0, 64), true, ReasonDisaggUnconditional},
		{"unconditional ignores a full cache hit", DisaggPolicy{Kind: routerconfig.DisaggISLBounding}, blocks(1000, 100, 64), true, ReasonDisaggUnconditional},
		// 1000 prompt, 14×64 = 896 cached: 104 uncached, ratio 0.104.
		{"small and mostly cached stays local", isl, blocks(1000, 14, 64), false, ReasonDecodeGateOff},
		// 100k prompt, 64k cached: 36k uncached ≥ 2048 whatever the ratio.
		{"large uncached prompt goes remote", loose, blocks(100_000, 1000, 64), true, ReasonPolicyDeclined},
		{"small but uncached ratio 1.0 goes remote", isl, blocks(200, 0, 64), true, ReasonPolicyDeclined},
		{"uncached equal to the threshold goes remote", loose, blocks(2048, 0, 64), true, ReasonPolicyDeclined},
		{"empty prompt stays local", isl, blocks(0, 0, 64), false, ReasonDecodeGateOff},
		{"overlap past the prompt clamps to zero uncached", isl, blocks(500, 10, 64), false, ReasonDecodeGateOff},
		{"weighted credit is not rounded up to a block", loose, DisaggInput{PromptTokens: 2100, CachedTokens: 48}, true, ReasonPolicyDeclined},
		{"prefill_load: unknown busy signal is calm", load, withBusy(blocks(1000, 0, 64), nil, nil), true, ReasonPolicyDeclined},
		{"prefill_load: calm prefill worker goes remote", load, withBusy(blocks(1000, 0, 64), boolp(false), nil), true, ReasonPolicyDeclined},
		{"prefill_load: busy prefill worker stays local", load, withBusy(blocks(100_000, 0, 64), boolp(true), nil), false, ReasonDecodeGateOff},
		{"isl_or_load: small and calm stays local via isl", either, withBusy(blocks(1000, 14, 64), boolp(false), nil), false, ReasonDecodeGateOff},
		{"isl_or_load: large and busy stays local via load", either, withBusy(blocks(100_000, 0, 64), boolp(true), nil), false, ReasonDecodeGateOff},
		{"isl_or_load: large and calm goes remote", either, withBusy(blocks(100_000, 0, 64), boolp(false), nil), true, ReasonPolicyDeclined},
		{"decode gate: not busy allows local", gated, withBusy(blocks(1000, 14, 64), nil, boolp(false)), false, ReasonDecodeNotBusy},
		{"decode gate: busy vetoes local", gated, withBusy(blocks(1000, 14, 64), nil, boolp(true)), true, ReasonDecodeBusy},
		{"decode gate: unknown capacity vetoes local", gated, blocks(1000, 14, 64), true, ReasonDecodeBusyUnknown},
		{"decode gate is not consulted when the policy says remote", gated, withBusy(blocks(200, 0, 64), nil, boolp(false)), true, ReasonPolicyDeclined},
	} {
		t.Run(tc.name, func(t *testing.T) {
			remote, reason := tc.p.Decide(tc.in)
			if remote != tc.wantRemote || reason != tc.wantReason {
				t.Errorf("Decide = (remote %v, %q), want (remote %v, %q)", remote, reason, tc.wantRemote, tc.wantReason)
			}
			if ReasonRemote(reason) != remote {
				t.Errorf("ReasonRemote(%q) = %v, but the decision was remote %v", reason, ReasonRemote(reason), remote)
			}
		})
	}
}

func TestDisaggNeedsPrefillBusy(t *testing.T) {
	for _, tc := range []struct {
		p    DisaggPolicy
		want bool
	}{
		{DisaggPolicy{Kind: routerconfig.DisaggPrefillLoad}, false}, // unconditional: no probe
		{DisaggPolicy{Conditional: true, Kind: routerconfig.DisaggISLBounding}, false},
		{DisaggPolicy{Conditional: true, Kind: routerconfig.DisaggPrefillLoad}, true},
		{DisaggPolicy{Conditional: true, Kind: routerconfig.DisaggISLOrLoad}, true},
	} {
		if got := tc.p.NeedsPrefillBusy(); got != tc.want {
			t.Errorf("%+v NeedsPrefillBusy = %v, want %v", tc.p, got, tc.want)
		}
	}
}
