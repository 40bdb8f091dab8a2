package routerconfig

import "errors"

// Override is the per-request router_config_override of the selection API
// (RouterConfigOverride in Dynamo's lib/kv-router/src/scheduling/config.rs). A nil field keeps the
// service's value. JSON names are the wire names.
type Override struct {
	OverlapScoreCredit *float64 `json:"overlap_score_credit,omitempty"`
	PrefillLoadScale   *float64 `json:"prefill_load_scale,omitempty"`
	// OverlapScoreWeight is the deprecated alias of PrefillLoadScale; see Canonical.
	OverlapScoreWeight    *float64 `json:"overlap_score_weight,omitempty"`
	RouterTemperature     *float64 `json:"router_temperature,omitempty"`
	AssumeKVReuse         *bool    `json:"assume_kv_reuse,omitempty"`
	TrackPrefillTokens    *bool    `json:"track_prefill_tokens,omitempty"`
	SharedCacheMultiplier *float64 `json:"shared_cache_multiplier,omitempty"`
}

// Validate checks the ranges Dynamo's selection API enforces: overlap_score_credit,
// prefill_load_scale, overlap_score_weight and router_temperature finite and
// >= 0, shared_cache_multiplier in [0, 1]. Dynamo checks the weight as the
// prefill_load_scale it becomes; kvselect names the field the client sent.
// The REST front maps the error to 422. All violations are reported.
func (o Override) Validate() error {
	var errs []error
	for _, f := range []struct {
		name  string
		v     *float64
		check func(float64) string
	}{
		{"overlap_score_credit", o.OverlapScoreCredit, checkNonNegative},
		{"prefill_load_scale", o.PrefillLoadScale, checkNonNegative},
		{"overlap_score_weight", o.OverlapScoreWeight, checkNonNegative},
		{"router_temperature", o.RouterTemperature, checkNonNegative},
		{"shared_cache_multiplier", o.SharedCacheMultiplier, checkUnit},
	} {
		if f.v == nil {
			continue
		}
		if r := f.check(*f.v); r != "" {
			errs = append(errs, floatError(f.name, *f.v, r))
		}
	}
	return errors.Join(errs...)
}

// Canonical folds the deprecated overlap_score_weight into the fields it
// stands for, as Dynamo does when it decodes the override: the weight wins over
// prefill_load_scale, and a weight of 0 also sets overlap_score_credit to 0
// (the legacy "ignore prefix overlap" setting). The result never has
// OverlapScoreWeight set; o is not modified.
func (o Override) Canonical() Override {
	if o.OverlapScoreWeight == nil {
		return o
	}
	w := *o.OverlapScoreWeight
	o.PrefillLoadScale = &w
	if w == 0 {
		zero := 0.0
		o.OverlapScoreCredit = &zero
	}
	o.OverlapScoreWeight = nil
	return o
}

// Apply returns the effective configuration for one request: c with every
// field o sets replaced (after Canonical). Validate o first; Apply does not.
func (c Config) Apply(o Override) Config {
	o = o.Canonical()
	if o.OverlapScoreCredit != nil {
		c.OverlapScoreCredit = *o.OverlapScoreCredit
	}
	if o.PrefillLoadScale != nil {
		c.PrefillLoadScale = *o.PrefillLoadScale
	}
	if o.RouterTemperature != nil {
		c.RouterTemperature = *o.RouterTemperature
	}
	if o.AssumeKVReuse != nil {
		c.AssumeKVReuse = *o.AssumeKVReuse
	}
	if o.TrackPrefillTokens != nil {
		c.TrackPrefillTokens = *o.TrackPrefillTokens
	}
	if o.SharedCacheMultiplier != nil {
		c.SharedCacheMultiplier = *o.SharedCacheMultiplier
	}
	return c
}
