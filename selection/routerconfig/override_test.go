package routerconfig

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func f64(v float64) *float64 { return &v }
func bptr(v bool) *bool      { return &v }

func TestOverrideValidateRanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Override
		want string // "" = valid
	}{
		{"empty", Override{}, ""},
		{"all valid", Override{OverlapScoreCredit: f64(1.5), PrefillLoadScale: f64(0), OverlapScoreWeight: f64(2), RouterTemperature: f64(0.3), SharedCacheMultiplier: f64(1), AssumeKVReuse: bptr(false), TrackPrefillTokens: bptr(true)}, ""},
		{"negative credit", Override{OverlapScoreCredit: f64(-1)}, "overlap_score_credit=-1: must be a finite number >= 0"},
		{"NaN credit", Override{OverlapScoreCredit: f64(math.NaN())}, "overlap_score_credit=NaN"},
		{"negative scale", Override{PrefillLoadScale: f64(-0.5)}, "prefill_load_scale=-0.5"},
		{"negative weight names the field sent", Override{OverlapScoreWeight: f64(-2)}, "overlap_score_weight=-2"},
		{"negative temperature", Override{RouterTemperature: f64(-0.1)}, "router_temperature=-0.1"},
		{"multiplier above 1", Override{SharedCacheMultiplier: f64(1.1)}, "shared_cache_multiplier=1.1: must be a finite number between 0 and 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

func TestOverrideUsesWireNames(t *testing.T) {
	body := `{"overlap_score_credit":0.5,"prefill_load_scale":2,"overlap_score_weight":3,"router_temperature":0.1,` +
		`"assume_kv_reuse":false,"track_prefill_tokens":true,"shared_cache_multiplier":0.25}`
	var o Override
	if err := json.Unmarshal([]byte(body), &o); err != nil {
		t.Fatal(err)
	}
	want := Override{f64(0.5), f64(2), f64(3), f64(0.1), bptr(false), bptr(true), f64(0.25)}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("decoded %+v", o)
	}
	out, err := json.Marshal(Override{RouterTemperature: f64(0)})
	if err != nil || string(out) != `{"router_temperature":0}` {
		t.Fatalf("Marshal = %s, %v; unset fields must be omitted, a set 0 kept", out, err)
	}
}

func TestApplyGivesPerRequestConfig(t *testing.T) {
	base := Default()
	for _, tc := range []struct {
		name string
		o    Override
		want func(*Config)
	}{
		{"empty override changes nothing", Override{}, func(*Config) {}},
		{"every field", Override{
			OverlapScoreCredit: f64(0.5), PrefillLoadScale: f64(2), RouterTemperature: f64(0.7),
			AssumeKVReuse: bptr(false), TrackPrefillTokens: bptr(false), SharedCacheMultiplier: f64(0.4),
		}, func(c *Config) {
			c.OverlapScoreCredit, c.PrefillLoadScale, c.RouterTemperature = 0.5, 2, 0.7
			c.AssumeKVReuse, c.TrackPrefillTokens, c.SharedCacheMultiplier = false, false, 0.4
		}},
		{"weight sets prefill scale", Override{OverlapScoreWeight: f64(2.5)}, func(c *Config) { c.PrefillLoadScale = 2.5 }},
		{"weight wins over prefill scale", Override{PrefillLoadScale: f64(3), OverlapScoreWeight: f64(2.5)}, func(c *Config) { c.PrefillLoadScale = 2.5 }},
		{"weight 0 zeroes credit too", Override{OverlapScoreWeight: f64(0)}, func(c *Config) { c.PrefillLoadScale, c.OverlapScoreCredit = 0, 0 }},
		{"weight 0 wins over an explicit credit", Override{OverlapScoreCredit: f64(0.5), OverlapScoreWeight: f64(0)}, func(c *Config) { c.PrefillLoadScale, c.OverlapScoreCredit = 0, 0 }},
		{"nonzero weight keeps the explicit credit", Override{OverlapScoreCredit: f64(0.5), OverlapScoreWeight: f64(2)}, func(c *Config) { c.PrefillLoadScale, c.OverlapScoreCredit = 2, 0.5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := base
			tc.want(&want)
			if got := base.Apply(tc.o); got != want {
				t.Fatalf("Apply:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestCanonicalFoldsWeightWithoutTouchingTheOriginal(t *testing.T) {
	credit, weight := 0.5, 0.0
	o := Override{OverlapScoreCredit: &credit, OverlapScoreWeight: &weight}
	c := o.Canonical()
	if c.OverlapScoreWeight != nil || *c.PrefillLoadScale != 0 || *c.OverlapScoreCredit != 0 {
		t.Fatalf("Canonical() = %+v", c)
	}
	if credit != 0.5 || o.OverlapScoreWeight == nil || o.PrefillLoadScale != nil {
		t.Fatal("Canonical modified its receiver or the caller's values")
	}
}
