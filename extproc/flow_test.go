package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/metricstest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// flowHarness is one worker behind a flow-controlled picker, busy once more
// than 4 prefill tokens are booked (budget 0.5 × 8).
func flowHarness(t testing.TB, fc flow.Config, objectives *flow.Objectives) *harness {
	t.Helper()
	w := worker(1, "10.0.0.1:8000")
	w.MaxNumBatchedTokens = ptr(uint64(8))
	return start(t, setup{
		opts:    extproc.Options{DefaultModel: model, Objectives: objectives},
		router:  func(c *routerconfig.Config) { c.QueueThreshold = routerconfig.Some(0.5) },
		workers: []catalog.Record{w}, flow: &fc,
	})
}

// prompt is a completions body of n distinct tokens from base: 8 of them
// keep the worker busy.
func prompt(base, n int) []byte {
	toks := make([]string, n)
	for i := range toks {
		toks[i] = fmt.Sprint(base + i)
	}
	return fmt.Appendf(nil, `{"model":%q,"prompt":[%s]}`, model, strings.Join(toks, ","))
}

func header(k, v string) envoysim.Header { return envoysim.Header{Key: k, Value: v} }

func queued(h *harness) map[string]int {
	out := map[string]int{}
	for _, p := range h.svc.Inspect().FlowState() {
		for _, b := range p.Bands {
			for _, t := range b.Tenants {
				if t.Queued > 0 {
					out[fmt.Sprintf("%d/%s", b.Priority, t.Tenant)] += t.Queued
				}
			}
		}
	}
	return out
}

func TestFlowHeadersRejectBadInput(t *testing.T) {
	h := flowHarness(t, flow.Config{}, nil)
	for _, tc := range []struct {
		h    envoysim.Header
		frag string
	}{
		{header(extproc.HeaderPriority, "high"), "is not an integer"},
		{header(extproc.HeaderPriority, "1000001"), "out of range"},
		{header(extproc.HeaderPriority, "-99999999999999999999"), "is not an integer"},
		{header(extproc.HeaderFairnessID, strings.Repeat("x", flow.MaxTenantLen+1)), "257 bytes long"},
		{header(extproc.HeaderFairnessID, "a\tb"), "control character"},
	} {
		_, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(1, 2), Headers: []envoysim.Header{tc.h}})
		if d.Immediate == nil || d.Immediate.Status != 400 || !strings.Contains(string(d.Immediate.Body), tc.frag) ||
			!strings.Contains(string(d.Immediate.Body), tc.h.Key) {
			t.Errorf("%s: %q: %+v, want a 400 naming the header and %q", tc.h.Key, tc.h.Value, d.Immediate, tc.frag)
		}
	}
	h.idle(t)
}

// The objective's priority and the fairness id place a waiting request in
// the queue; an unknown objective is priority 0, counted; a sheddable one is
// shed while the pool is busy; the control headers never reach the worker;
// the higher band gets the worker first.
func TestFlowHeadersReachTheQueue(t *testing.T) {
	objectives := new(flow.Objectives)
	objectives.Set(flow.SourceFile, map[string]int{"premium": 7})
	h := flowHarness(t, flow.Config{}, objectives)
	blocker, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(1000, 8),
		Headers: []envoysim.Header{header(extproc.HeaderObjective, "premium"), header(extproc.HeaderFairnessID, "t0")}})
	for _, k := range []string{extproc.HeaderObjective, extproc.HeaderFairnessID, extproc.HeaderPriority} {
		if !slices.Contains(d.RemovedHeaders, k) {
			t.Errorf("%s is not removed from the request (removed %v)", k, d.RemovedHeaders)
		}
	}
	type picked struct {
		name string
		x    *envoysim.Exchange
	}
	got := make(chan picked, 2)
	send := func(name string, hs ...envoysim.Header) {
		go func() {
			x, d, err := h.client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: prompt(len(name)*100, 8), Headers: hs})
			if err != nil || d.Immediate != nil {
				t.Errorf("%s: %v %+v", name, err, d)
			}
			got <- picked{name, x}
		}()
	}
	send("unknown", header(extproc.HeaderObjective, "nope"), header(extproc.HeaderFairnessID, "t1"))
	eventually(t, "the unknown objective queued at 0", func() bool { return queued(h)["0/t1"] == 1 })
	send("premium", header(extproc.HeaderObjective, "premium"))
	eventually(t, "premium queued at 7", func() bool { return queued(h)["7/"+flow.DefaultTenant] == 1 })

	_, d = h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(5000, 2),
		Headers: []envoysim.Header{header(extproc.HeaderPriority, "-1"), header(extproc.HeaderObjective, "premium")}})
	if d.Immediate == nil || d.Immediate.Status != 429 || !strings.Contains(string(d.Immediate.Body), "sheddable") {
		t.Errorf("sheddable while busy: %+v, want 429", d.Immediate)
	}
	if n := metricstest.Series(t, h.srv)["kvselect_extproc_unknown_objectives_total"]; n != 1 {
		t.Errorf("unknown objectives counted %v, want 1", n)
	}

	blocker.Close()
	first := <-got
	if first.name != "premium" {
		t.Errorf("%s got the worker first, want premium", first.name)
	}
	first.x.Close()
	(<-got).x.Close()
	h.idle(t)
}

// Thousands of queued streams, aborted at random moments while the worker
// frees and books: nothing stays queued or booked, and the picker's
// goroutines go back to what they were.
func TestQueuedStreamsAbortWithoutLeaks(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 300
	}
	h := flowHarness(t, flow.Config{MaxTenants: 16}, nil)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	var routed, refused sync.Map
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rnd := rand.New(rand.NewPCG(uint64(i), 5))
			wait := time.Duration(rnd.IntN(200)) * time.Millisecond
			if i%50 == 0 {
				// A few patient streams, so that some get through however
				// slowly a loaded machine serves the rest.
				wait = time.Minute
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			x, d, err := h.client.Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(10*i, 5),
				Headers: []envoysim.Header{header(extproc.HeaderFairnessID, fmt.Sprint("tenant-", i%40)), header(extproc.HeaderPriority, fmt.Sprint(rnd.IntN(3)-1))}})
			deadline, _ := ctx.Deadline()
			switch {
			case err != nil: // aborted while queued
			case d.Immediate != nil && d.Immediate.Status == 503 && !time.Now().Before(deadline):
				// Also aborted while queued: the picker's stream carries the
				// client's deadline (gRPC propagates it), and on a loaded
				// machine the picker can see it pass and answer the expired
				// stream before the client's own context reports it.
			case d.Immediate != nil:
				refused.Store(i, d.Immediate.Status)
			default:
				routed.Store(i, true)
				if rnd.IntN(2) == 0 {
					x.Abort()
				} else {
					x.Close()
				}
			}
		}()
	}
	wg.Wait()
	h.idle(t)
	eventually(t, "an empty queue", func() bool { return len(queued(h)) == 0 })
	refused.Range(func(k, v any) bool {
		if v != 429 {
			t.Errorf("request %v refused with %v", k, v)
		}
		return true
	})
	eventually(t, "the goroutines to go back", func() bool { return runtime.NumGoroutine() <= before+5 })
	nRouted := 0
	routed.Range(func(any, any) bool { nRouted++; return true })
	if nRouted == 0 {
		t.Error("no request got through")
	}
	nRefused := 0
	refused.Range(func(any, any) bool { nRefused++; return true })
	t.Logf("%d streams: %d routed, %d refused, the rest aborted", n, nRouted, nRefused)
	if st := h.svc.Inspect().FlowState(); len(st) != 1 || st[0].Queued != 0 || st[0].QueuedBytes != 0 {
		t.Errorf("flow state %+v", st)
	}
	_ = selection.FlowDispatched
}

// TestDeprecatedFlowHeadersOverThePicker: the deprecated objective and
// fairness names still place a request in its band and flow, the current
// names win when both are sent, every name is stripped before the worker,
// and each deprecated name sent is counted.
func TestDeprecatedFlowHeadersOverThePicker(t *testing.T) {
	objectives := new(flow.Objectives)
	objectives.Set(flow.SourceFile, map[string]int{"premium": 7, "batch": 2})
	h := flowHarness(t, flow.Config{}, objectives)
	blocker, d := h.start(t, &envoysim.Request{Modes: envoysim.GIE, Body: prompt(1000, 8)})
	wantRemoved := []string{extproc.HeaderObjective, extproc.HeaderFairnessID, extproc.HeaderObjectiveLegacy, extproc.HeaderFairnessIDLegacy}
	for _, k := range wantRemoved {
		if !slices.Contains(d.RemovedHeaders, k) {
			t.Errorf("%s is not removed from the request (removed %v)", k, d.RemovedHeaders)
		}
	}
	waiting := make(chan *envoysim.Exchange, 2)
	send := func(base int, hs ...envoysim.Header) {
		go func() {
			x, d, err := h.client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: prompt(base, 8), Headers: hs})
			if err != nil || d.Immediate != nil {
				t.Errorf("%v %+v", err, d)
			}
			waiting <- x
		}()
	}
	send(2000, header(extproc.HeaderObjectiveLegacy, "batch"), header(extproc.HeaderFairnessIDLegacy, "old-tenant"))
	eventually(t, "the deprecated names queued at 2/old-tenant", func() bool { return queued(h)["2/old-tenant"] == 1 })
	send(3000, header(extproc.HeaderObjectiveLegacy, "batch"), header(extproc.HeaderObjective, "premium"),
		header(extproc.HeaderFairnessIDLegacy, "old-tenant"), header(extproc.HeaderFairnessID, "new-tenant"))
	eventually(t, "both names queued at 7/new-tenant", func() bool { return queued(h)["7/new-tenant"] == 1 })
	got := metricstest.Series(t, h.srv)
	for k, v := range map[string]float64{
		`kvselect_extproc_deprecated_headers_total{header=x-gateway-inference-objective}`:   2,
		`kvselect_extproc_deprecated_headers_total{header=x-gateway-inference-fairness-id}`: 2,
		`kvselect_extproc_deprecated_headers_total{header=x-slo-ttft-ms}`:                   0,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	blocker.Close()
	for range 2 {
		(<-waiting).Close()
	}
	h.idle(t)
}
