package bookingend

import (
	"fmt"
	"testing"
	"time"
)

func mustNew(t *testing.T, cfg Config) *Estimator {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestEstimateOutputLengthPrecedence(t *testing.T) {
	e := mustNew(t, Config{MinSamples: 2})
	for range 2 {
		e.Observe("learnt", 100)
	}
	for _, tc := range []struct {
		name, model      string
		expected, limit  int
		wantTokens       int
		wantLifetimeSecs float64
	}{
		{"the default before anything is learnt", "new", 0, 0, DefaultOutputTokens, 0.5 + DefaultOutputTokens*0.01},
		{"the request's expectation first", "learnt", 40, 0, 40, 0.5 + 40*0.01},
		{"the learnt length without one", "learnt", 0, 0, 100, 0.5 + 100*0.01},
		{"never beyond the limit", "learnt", 0, 30, 30, 0.5 + 30*0.01},
		{"the limit caps an expectation too", "new", 500, 20, 20, 0.5 + 20*0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := e.Estimate(tc.model, Request{Expected: tc.expected, Limit: tc.limit, TTFT: 0.5, ITL: 0.01})
			want := time.Duration(tc.wantLifetimeSecs * float64(time.Second))
			if got.Tokens != tc.wantTokens || (got.Lifetime-want).Abs() > time.Microsecond || got.TTFT != 500*time.Millisecond {
				t.Fatalf("estimate = %+v, want %d tokens, lifetime %v, TTFT 500ms", got, tc.wantTokens, want)
			}
		})
	}
}

func TestEstimateIsCappedAndSane(t *testing.T) {
	e := mustNew(t, Config{Max: 10 * time.Second})
	got := e.Estimate("m", Request{Expected: 100000, TTFT: 30, ITL: 1})
	if got.Lifetime != 10*time.Second || got.TTFT != 10*time.Second {
		t.Fatalf("capped estimate = %+v, want lifetime and TTFT at the 10s cap", got)
	}
	for _, bad := range []float64{-1, nanOf(), 1e300} {
		got := e.Estimate("m", Request{Expected: 10, TTFT: bad, ITL: bad})
		if got.Lifetime < 0 || got.Lifetime > 10*time.Second || got.TTFT > got.Lifetime {
			t.Errorf("prediction %v: estimate %+v out of [0, cap]", bad, got)
		}
	}
}

func nanOf() float64 { z := 0.0; return z / z }

func TestLearntLengthFollowsRecentResponses(t *testing.T) {
	e := mustNew(t, Config{MinSamples: 3})
	e.Observe("m", 0) // an uncounted response tells nothing
	e.Observe("m", 100)
	e.Observe("m", 200)
	if _, ok := e.Learnt("m"); ok {
		t.Fatal("learnt before MinSamples ends were seen")
	}
	e.Observe("m", 300)
	if got, ok := e.Learnt("m"); !ok || got != 200 {
		t.Fatalf("learnt = %v, %v; want the plain mean 200 at first", got, ok)
	}
	for range 200 {
		e.Observe("m", 1000)
	}
	if got, _ := e.Learnt("m"); got < 990 || got > 1000 {
		t.Fatalf("learnt = %v after 200 responses of 1000 tokens; want the recent length", got)
	}
}

func TestLearntModelsAreBounded(t *testing.T) {
	e := mustNew(t, Config{MinSamples: 1, MaxModels: 3})
	for i := range 10 {
		e.Observe(fmt.Sprintf("m%d", i), 50)
	}
	if len(e.models) != 3 {
		t.Fatalf("%d models learnt, want the bound 3", len(e.models))
	}
	if _, ok := e.Learnt("m9"); ok {
		t.Fatal("a model beyond the bound was learnt")
	}
}

func TestConfigRefusesNegativeBounds(t *testing.T) {
	if _, err := New(Config{Max: -time.Second}); err == nil {
		t.Fatal("negative max accepted")
	}
}
