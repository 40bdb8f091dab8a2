package mockworker

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Faults are the failure modes a worker can be switched into, at start
// (Config.Faults, the command line's --fail-rate, --hang, --hang-after and
// --fail-health) or while it runs (POST /admin/faults), so that a benchmark
// can make one worker of a fleet fail mid-run without restarting it.
//
// They touch only the generation endpoints (/v1/completions and
// /v1/chat/completions) and, with FailHealth, /health. /health otherwise
// stays 200 whatever the other faults, as vLLM's does while its engine
// process lives even when every request errors: health checks and request
// outcomes are two separate signals, and a benchmark of ejection on outcomes
// must not be helped by the health check.
type Faults struct {
	// FailRate is the fraction (0..1) of generation requests answered 500
	// with an OpenAI-style error body. Which ones is drawn from a random
	// source seeded with Config.FaultSeed, so a single-client run fails the
	// same requests every time.
	FailRate float64
	// Hang makes generation requests wait, unanswered, until the client goes
	// away (or the worker closes: 503), as an engine whose scheduler is stuck.
	Hang bool
	// HangAfter, when positive, turns Hang on that long after the faults were
	// set (at New, or by the admin request that set it).
	HangAfter time.Duration
	// FailHealth answers /health with 503.
	FailHealth bool
}

func (f Faults) validate() error {
	if !(f.FailRate >= 0 && f.FailRate <= 1) || math.IsNaN(f.FailRate) {
		return fmt.Errorf("fail rate must be a fraction in [0, 1], got %v", f.FailRate)
	}
	if f.HangAfter < 0 {
		return fmt.Errorf("hang-after must not be negative, got %s", f.HangAfter)
	}
	return nil
}

// faultState is a worker's current faults. A leaf lock.
type faultState struct {
	mu      sync.Mutex
	f       Faults
	hangAt  time.Time // when HangAfter turns Hang on; zero when it does not
	rng     *rand.Rand
	now     func() time.Time
	hanging int    // requests hanging right now
	failed  uint64 // requests answered with an injected 500
}

func newFaultState(f Faults, seed, workerID uint64, now func() time.Time) *faultState {
	s := &faultState{rng: rand.New(rand.NewPCG(seed, workerID^0xfa017)), now: now}
	s.set(f)
	return s
}

// set replaces the faults; a HangAfter starts counting now.
func (s *faultState) set(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(f)
}

func (s *faultState) setLocked(f Faults) {
	s.f = f
	s.hangAt = time.Time{}
	if f.HangAfter > 0 {
		s.hangAt = s.now().Add(f.HangAfter)
		s.f.Hang = false
	}
}

// decide says what to do with one generation request: hang, fail, or serve.
func (s *faultState) decide() (hang, fail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.hangAt.IsZero() && !s.now().Before(s.hangAt) {
		s.f.Hang, s.hangAt = true, time.Time{}
	}
	if s.f.Hang {
		s.hanging++
		return true, false
	}
	// Draw only when failures are on, so that switching them on later starts
	// from the seed's first draw.
	if s.f.FailRate > 0 && (s.f.FailRate >= 1 || s.rng.Float64() < s.f.FailRate) {
		s.failed++
		return false, true
	}
	return false, false
}

// FaultStatus is GET /admin/faults: the faults in force and what they did.
type FaultStatus struct {
	FailRate   float64 `json:"fail_rate"`
	Hang       bool    `json:"hang"`
	HangAfter  string  `json:"hang_after,omitempty"` // until it fires, what is left of it
	FailHealth bool    `json:"fail_health"`
	Hanging    int     `json:"hanging"`
	Failed     uint64  `json:"failed"`
}

func (s *faultState) status() FaultStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := FaultStatus{FailRate: s.f.FailRate, Hang: s.f.Hang, FailHealth: s.f.FailHealth, Hanging: s.hanging, Failed: s.failed}
	if !s.hangAt.IsZero() {
		st.HangAfter = max(s.hangAt.Sub(s.now()), 0).String()
	}
	return st
}

// Faults returns the faults in force.
func (w *Worker) Faults() FaultStatus { return w.faults.status() }

// SetFaults replaces the faults in force.
func (w *Worker) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("mockworker: %w", err)
	}
	w.faults.set(f)
	return nil
}

// injectFault applies the faults to one generation request before it is
// read; true means the request was answered (or abandoned) here.
func (w *Worker) injectFault(rw http.ResponseWriter, req *http.Request) bool {
	hang, fail := w.faults.decide()
	if hang || fail {
		// Read the body first, as a real server does before it answers: the
		// client never sees a reset mid-upload, and net/http notices a
		// client that goes away (cancelling the request's context) only once
		// the body is consumed.
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(rw, req.Body, maxBody))
	}
	switch {
	case hang:
		defer func() {
			w.faults.mu.Lock()
			w.faults.hanging--
			w.faults.mu.Unlock()
		}()
		select {
		case <-req.Context().Done():
		case <-w.closeCtx.Done():
			writeError(rw, &apiError{http.StatusServiceUnavailable, "ServiceUnavailableError", "mockworker: closing"})
		}
		return true
	case fail:
		writeError(rw, &apiError{http.StatusInternalServerError, "InternalServerError",
			"mockworker: injected failure (fail rate " + fmt.Sprint(w.faults.status().FailRate) + ")"})
		return true
	}
	return false
}

func (w *Worker) serveHealth(rw http.ResponseWriter, _ *http.Request) {
	w.faults.mu.Lock()
	sick := w.faults.f.FailHealth
	w.faults.mu.Unlock()
	if sick {
		rw.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	rw.WriteHeader(http.StatusOK)
}

// faultsRequest is POST /admin/faults: the fields present change, the others
// keep their value. hang_after is a Go duration ("2s").
type faultsRequest struct {
	FailRate   *float64 `json:"fail_rate"`
	Hang       *bool    `json:"hang"`
	HangAfter  *string  `json:"hang_after"`
	FailHealth *bool    `json:"fail_health"`
}

func (w *Worker) serveFaults(rw http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodGet {
		writeJSON(rw, http.StatusOK, w.faults.status())
		return
	}
	var body faultsRequest
	if err := decodeBody(rw, req, &body); err != nil {
		writeError(rw, err)
		return
	}
	s := w.faults
	s.mu.Lock()
	f := s.f
	if !s.hangAt.IsZero() {
		// A pending hang-after stays pending unless this request changes it.
		f.HangAfter = max(s.hangAt.Sub(s.now()), time.Nanosecond)
	}
	if body.FailRate != nil {
		f.FailRate = *body.FailRate
	}
	if body.Hang != nil {
		f.Hang, f.HangAfter = *body.Hang, 0
	}
	if body.HangAfter != nil {
		d, err := time.ParseDuration(*body.HangAfter)
		if err != nil {
			s.mu.Unlock()
			writeError(rw, badRequest("hang_after: %v", err))
			return
		}
		f.HangAfter = d
	}
	if body.FailHealth != nil {
		f.FailHealth = *body.FailHealth
	}
	if err := f.validate(); err != nil {
		s.mu.Unlock()
		writeError(rw, badRequest("%v", err))
		return
	}
	s.setLocked(f)
	s.mu.Unlock()
	w.log.Info("faults changed", "fail_rate", f.FailRate, "hang", f.Hang, "hang_after", f.HangAfter, "fail_health", f.FailHealth)
	writeJSON(rw, http.StatusOK, w.faults.status())
}
