package selection

import (
	"testing"
	"time"
)

func fail(t testing.TB, s *Service, id uint64, n int) HealthTransition {
	t.Helper()
	var last HealthTransition
	for range n {
		tr, err := s.ReportOutcome(id, Outcome{Detail: "status 503", Source: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if tr != HealthUnchanged {
			last = tr
		}
	}
	return last
}

func succeed(t testing.TB, s *Service, id uint64) HealthTransition {
	t.Helper()
	tr, err := s.ReportOutcome(id, Outcome{OK: true, Source: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func healthOf(s *Service, id uint64) string {
	for _, r := range s.Workers(nil, nil) {
		if r.WorkerID == id && r.Health != nil {
			return r.Health.State
		}
	}
	return HealthHealthy
}

func TestConsecutiveFailuresEject(t *testing.T) {
	tests := []struct {
		name    string
		steps   func(t *testing.T, s *Service, c *fakeClock)
		ejected bool
	}{
		{"four failures", func(t *testing.T, s *Service, c *fakeClock) { fail(t, s, 1, 4) }, false},
		{"five failures", func(t *testing.T, s *Service, c *fakeClock) { fail(t, s, 1, 5) }, true},
		{"a success between", func(t *testing.T, s *Service, c *fakeClock) {
			fail(t, s, 1, 3)
			succeed(t, s, 1)
			fail(t, s, 1, 4)
		}, false},
		{"failures further apart than the window", func(t *testing.T, s *Service, c *fakeClock) {
			fail(t, s, 1, 4)
			c.Add(31 * time.Second)
			fail(t, s, 1, 4)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := newService(t, nil)
			mustUpsert(t, s, workerRec(1))
			mustUpsert(t, s, workerRec(2))
			tt.steps(t, s, c)
			got := picks(t, s, 20, nil)
			if tt.ejected != (got[1] == 0) {
				t.Fatalf("ejected = %v, picks = %v", tt.ejected, got)
			}
			if want := map[bool]string{true: HealthEjected, false: HealthHealthy}[tt.ejected]; healthOf(s, 1) != want {
				t.Fatalf("health = %s, want %s", healthOf(s, 1), want)
			}
		})
	}
}

func TestEjectionProbationAndRestoration(t *testing.T) {
	s, c := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	// A booking made before the ejection stays through it.
	if _, err := s.SelectAndReserve(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
		PromptRequest: PromptRequest{TokenIDs: []uint32{9, 9, 9}}, PinnedWorker: &WorkerRank{WorkerID: 1}, SelectionID: ptr("before")}); err != nil {
		t.Fatal(err)
	}
	if tr := fail(t, s, 1, 5); tr != HealthEjection {
		t.Fatalf("transition = %v, want ejection", tr)
	}
	rec := s.Workers(nil, nil)[0]
	if rec.Health == nil || rec.Health.State != HealthEjected || rec.Health.Ejections != 1 || rec.Health.EjectedUntil == nil ||
		!rec.Health.EjectedUntil.Equal(c.Now().Add(5*time.Second)) || len(rec.NotSchedulableReasons) != 1 ||
		rec.NotSchedulableReasons[0] != "ejected: 5 consecutive failures" {
		t.Fatalf("record = %+v health %+v", rec, rec.Health)
	}
	if got := loadOf(t, s); got.WorkerID != 1 || got.ActiveRequests != 1 {
		t.Fatalf("the ejection dropped a booking: %+v", got)
	}
	// A late success of a request booked before the ejection does not cut it short.
	if tr := succeed(t, s, 1); tr != HealthUnchanged || healthOf(s, 1) != HealthEjected {
		t.Fatalf("late success: %v, %s", tr, healthOf(s, 1))
	}
	if err := s.Free(bg, "before"); err != nil {
		t.Fatal(err)
	}

	// Probation: one trial goes through, then the worker waits for its outcome.
	c.Add(5 * time.Second)
	if healthOf(s, 1) != HealthProbation {
		t.Fatalf("after 5 s: %s", healthOf(s, 1))
	}
	if got := picks(t, s, 20, nil); got[1] != 1 {
		t.Fatalf("probation picks = %v, want exactly one trial on worker 1", got)
	}
	// The trial fails: ejected again, for twice as long.
	if tr := fail(t, s, 1, 1); tr != HealthEjection {
		t.Fatalf("failed trial: %v", tr)
	}
	if h := s.Inspect().WorkerHealth(1); h.Ejections != 2 || !h.EjectedUntil.Equal(c.Now().Add(10*time.Second)) {
		t.Fatalf("second ejection = %+v", h)
	}
	c.Add(10 * time.Second)
	if got := picks(t, s, 20, nil); got[1] != 1 {
		t.Fatalf("second probation picks = %v", got)
	}
	if tr := succeed(t, s, 1); tr != HealthRestoration {
		t.Fatalf("successful trial: %v", tr)
	}
	if s.Inspect().WorkerHealth(1) != nil {
		t.Fatalf("restored worker keeps health state %+v", s.Inspect().WorkerHealth(1))
	}
	if got := picks(t, s, 40, nil); got[1] == 0 {
		t.Fatalf("restored worker never picked: %v", got)
	}
	st := s.Inspect().HealthStats()
	if st.Ejections != 2 || st.Restorations != 1 || st.Ejected != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestEjectionGrowsToTheCap(t *testing.T) {
	s, c := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	fail(t, s, 1, 5)
	want := 5 * time.Second
	for i := range 10 {
		h := s.Inspect().WorkerHealth(1)
		if got := h.EjectedUntil.Sub(c.Now()); got != want {
			t.Fatalf("ejection %d lasts %s, want %s", i+1, got, want)
		}
		c.Add(want)
		fail(t, s, 1, 1)
		want = min(2*want, 5*time.Minute)
	}
}

func TestTrialWithoutOutcomeIsGivenUp(t *testing.T) {
	s, c := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	fail(t, s, 1, 5)
	c.Add(5 * time.Second)
	if got := picks(t, s, 10, nil); got[1] != 1 {
		t.Fatalf("picks = %v", got)
	}
	c.Add(5 * time.Second) // the trial's outcome never came
	if got := picks(t, s, 10, nil); got[1] != 1 {
		t.Fatalf("after the trial timeout picks = %v, want one more trial", got)
	}
}

func TestEveryWorkerEjectedIs503WithTheReason(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	mustUpsert(t, s, workerRec(2))
	fail(t, s, 1, 5)
	fail(t, s, 2, 5)
	_, err := s.SelectAndReserve(bg, selReq("x", 1, 2, 3))
	wantKind(t, err, KindUnavailable, "worker 1 ejected: 5 consecutive failures; worker 2 ejected: 5 consecutive failures")
	if st := s.Inspect().HealthStats(); st.Ejected != 2 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestEjectionOffAndUnknownWorkers(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	_, err := s.ReportOutcome(7, Outcome{})
	wantKind(t, err, KindNotFound, "worker 7 not found")

	cfg := DefaultEngineConfig()
	cfg.Health.EjectAfter = 0
	off, err := New(Config{Router: s.router, Engine: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, off, workerRec(1))
	fail(t, off, 1, 50)
	if _, err := off.Select(bg, selReq("", 1, 2)); err != nil {
		t.Fatalf("ejection off: %v", err)
	}

	bad := DefaultEngineConfig()
	bad.Health.Max = time.Second
	if _, err := New(Config{Router: s.router, Engine: &bad}); err == nil {
		t.Fatal("a maximum ejection below the base was accepted")
	}
}

func TestDeletedWorkerForgetsItsHealth(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	fail(t, s, 1, 5)
	if _, err := s.DeleteWorker(bg, 1); err != nil {
		t.Fatal(err)
	}
	mustUpsert(t, s, workerRec(1))
	if _, err := s.Select(bg, selReq("", 1, 2)); err != nil {
		t.Fatalf("re-registered worker still ejected: %v", err)
	}
}

// A session bound to a worker that the health check ejects moves to the
// worker its next request is booked on, as it would if the worker had left
// the catalog, instead of each request failing with a session conflict (400)
// until the ejection ends; the new binding then holds.
func TestEjectedWorkerReleasesItsSessions(t *testing.T) {
	s, _ := sessionService(t)
	req := func(id string, tokens ...uint32) *SelectRequest { return sessionReq("sess", id, tokens...) }
	first, err := s.SelectAndReserve(bg, req("a", 1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	s.Free(bg, "a")
	if tr := fail(t, s, first.WorkerID, 5); tr != HealthEjection {
		t.Fatalf("worker %d not ejected: %v", first.WorkerID, tr)
	}
	moved, err := s.SelectAndReserve(bg, req("b", 1, 2, 3, 4))
	if err != nil {
		t.Fatalf("session request while its worker is ejected: %v", err)
	}
	if moved.WorkerID == first.WorkerID {
		t.Fatalf("booked on the ejected worker %d", moved.WorkerID)
	}
	s.Free(bg, "b")
	again, err := s.SelectAndReserve(bg, req("c", 9, 9, 9, 9))
	if err != nil || again.WorkerID != moved.WorkerID {
		t.Fatalf("the session's next request went to %d (%v), want its new worker %d", again.WorkerID, err, moved.WorkerID)
	}
}
