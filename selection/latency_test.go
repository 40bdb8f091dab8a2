package selection

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/scheduler"
)

// latencyService is a service running predicted-latency over two workers,
// with every latency event recorded.
func latencyService(t *testing.T) (*Service, *fakeClock, func() []LatencyEvent) {
	t.Helper()
	s, clock := newService(t, nil)
	var mu sync.Mutex
	var events []LatencyEvent
	s.onLatency = func(ev LatencyEvent) { mu.Lock(); events = append(events, ev); mu.Unlock() }
	pol, err := scheduler.New(scheduler.PredictedLatencyPolicyName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	return s, clock, func() []LatencyEvent { mu.Lock(); defer mu.Unlock(); return append([]LatencyEvent(nil), events...) }
}

func TestLatencyModelLearnsFromTheLifecycle(t *testing.T) {
	s, clock, events := latencyService(t)
	// Each request: booked, first token 40 ms later, 9 more tokens at 5 ms.
	for i := range 40 {
		id := fmt.Sprintf("r%d", i)
		tokens := make([]uint32, 64)
		for j := range tokens {
			tokens[j] = uint32(i*1000 + j)
		}
		if _, err := s.SelectAndReserve(bg, selReq(id, tokens...)); err != nil {
			t.Fatal(err)
		}
		clock.Add(40 * time.Millisecond)
		if err := s.PrefillComplete(bg, id); err != nil {
			t.Fatal(err)
		}
		if err := s.PrefillComplete(bg, id); err != nil { // repeated: 200, observed once
			t.Fatal(err)
		}
		clock.Add(45 * time.Millisecond)
		if _, err := s.OutputTokens(bg, id, 10); err != nil {
			t.Fatal(err)
		}
		if err := s.Free(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	var first, ends int
	for _, ev := range events() {
		switch ev.Kind {
		case LatencyFirstToken:
			first++
			if ev.ObservedTTFT != 0.04 {
				t.Fatalf("observed TTFT %v, want 0.04", ev.ObservedTTFT)
			}
		case LatencyEnd:
			ends++
			if d := ev.ObservedITL - 0.005; d > 1e-9 || d < -1e-9 {
				t.Fatalf("observed ITL %v, want 0.005 (45 ms over 9 tokens)", ev.ObservedITL)
			}
		}
	}
	if first != 40 || ends != 40 {
		t.Fatalf("%d first-token and %d end events, want 40 each", first, ends)
	}
	v := s.Inspect().LatencyModel()
	if len(v.Workers) != 2 || v.Errors.Observed != 40 {
		t.Fatalf("model view: %d workers, %d observed predictions; want 2 and 40", len(v.Workers), v.Errors.Observed)
	}
	// The requests were alike: the fit predicts their TTFT closely now.
	c := s.latency.Coeffs(v.Workers[0].Key)
	f := s.latency.View().Workers[0]
	if c.Source == "prior" {
		t.Fatalf("still on the prior after 40 observations: %+v", f)
	}
	pred := c.PredictTTFT(scheduler.LatencyFeatures(&scheduler.Request{}, &scheduler.Candidate{}, 64))
	if pred < 0.03 || pred > 0.05 {
		t.Errorf("predicted TTFT of a like request %v, want ≈ 0.04", pred)
	}
	if _, err := s.DeleteWorker(bg, 1); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Inspect().LatencyModel().Workers); got != 1 {
		t.Errorf("after deleting worker 1 the model holds %d workers, want 1", got)
	}
}

func TestUntimedResponseIsNotFitted(t *testing.T) {
	s, clock, events := latencyService(t)
	if _, err := s.SelectAndReserve(bg, selReq("a", 1, 2, 3, 4, 5)); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Second)
	if err := s.ResponseBegan(bg, "a", false); err != nil {
		t.Fatal(err)
	}
	if evs := events(); len(evs) != 0 {
		t.Errorf("a whole JSON answer's first byte was fitted as a TTFT: %+v", evs)
	}
	if l := loadOf(t, s); l.PotentialPrefillTokens != 0 {
		t.Errorf("prefill not cleared: %+v", l)
	}
}

func TestSLOFields(t *testing.T) {
	s, _, events := latencyService(t)
	for _, bad := range []float64{0, -5} {
		req := selReq("", 1, 2, 3)
		req.SLOTTFTMs = &bad
		_, err := s.Select(bg, req)
		wantKind(t, err, KindBadRequest, "slo_ttft_ms must be a positive number")
	}
	// A sheddable request whose TTFT objective no worker can meet (the
	// prior predicts ≥ 25 µs a token: 4,000 tokens are ≥ 100 ms).
	tokens := make([]uint32, 4000)
	req := selReq("shed", tokens...)
	req.SLOTTFTMs, req.Priority = ptr(1.0), ptr(-1)
	_, err := s.SelectAndReserve(bg, req)
	wantKind(t, err, KindOverloaded, "no worker is predicted to meet")
	var e *Error
	if !errors.As(err, &e) || e.RetryAfterHeader() != "1" {
		t.Errorf("err = %#v, want Retry-After 1", err)
	}
	if evs := events(); len(evs) != 1 || evs[0].Kind != LatencyShed {
		t.Errorf("events %+v, want one shed", evs)
	}
	if l := loadOf(t, s); l.ActiveRequests != 0 {
		t.Errorf("a shed request was booked: %+v", l)
	}
	// Not sheddable: served.
	req = selReq("kept", tokens...)
	req.SLOTTFTMs = ptr(1.0)
	if _, err := s.SelectAndReserve(bg, req); err != nil {
		t.Errorf("a request that may not be shed was refused: %v", err)
	}
}

func TestOtherPoliciesStillFitTheModel(t *testing.T) {
	s, clock := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	for i := range 3 {
		id := fmt.Sprint(i)
		if _, err := s.SelectAndReserve(bg, selReq(id, 1, 2, 3, 4)); err != nil {
			t.Fatal(err)
		}
		clock.Add(10 * time.Millisecond)
		if err := s.PrefillComplete(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if v := s.Inspect().LatencyModel(); v.Errors.Observed != 3 || len(v.Workers) != 1 {
		t.Errorf("kv-cost's bookings did not feed the model: %+v", v)
	}
}

// BenchmarkLifecyclePredictedLatency is BenchmarkLifecycle under the
// predicted-latency policy: the candidates' model lookup and the scoring
// it adds to kv-cost's.
func BenchmarkLifecyclePredictedLatency(b *testing.B) {
	s, prompts := benchService(b, 64)
	pol, err := scheduler.New(scheduler.PredictedLatencyPolicyName, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.SetPolicy(pol); err != nil {
		b.Fatal(err)
	}
	benchLifecycle(b, s, prompts)
}
