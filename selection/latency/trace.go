package latency

import (
	"sync/atomic"
	"time"
)

// Trace is what a booking remembers to check its prediction: the features
// and predictions at the decision, when it was booked, and what the response
// path reported since. It lives in the booking's reservation row; its
// response-side fields are atomic because the first byte, the output count
// and the end arrive on different goroutines.
type Trace struct {
	Key Key
	// Features and Running (requests on the rank, this one included) as the
	// decision saw them.
	Features Features
	Running  float64
	// Decoding is the requests on the rank past their first token at the
	// decision: all running at once, a lower bound of its concurrency.
	Decoding int
	// PredictedTTFT and PredictedITL are the model's predictions at the
	// decision, in seconds.
	PredictedTTFT, PredictedITL float64
	// SLOTTFT and SLOTPOT are the request's objectives in seconds (0: none).
	SLOTTFT, SLOTPOT float64
	// Booked is when the booking was made: TTFT is measured from it.
	Booked time.Time

	firstByte atomic.Int64 // unix nanoseconds, 0 until the first token
	generated atomic.Int64 // output tokens streamed so far
}

// Valid reports whether t was filled (a booking made before this model
// existed, or by a path that does not trace, has a zero Trace).
func (t *Trace) Valid() bool { return !t.Booked.IsZero() }

// FirstToken records the first token at now and returns the observed TTFT
// in seconds; ok is false when it was recorded before (a repeated
// prefill_complete) or the trace is empty.
func (t *Trace) FirstToken(now time.Time) (ttft float64, ok bool) {
	if !t.Valid() || !t.firstByte.CompareAndSwap(0, max(now.UnixNano(), 1)) {
		return 0, false
	}
	return max(now.Sub(t.Booked).Seconds(), 0), true
}

// Generated records that the response has streamed n output tokens in all.
func (t *Trace) Generated(n int) {
	for {
		cur := t.generated.Load()
		if int64(n) <= cur || t.generated.CompareAndSwap(cur, int64(n)) {
			return
		}
	}
}

// MeanITL is the observed mean inter-token latency at the response's end
// (now), in seconds: the time since the first token over the tokens after
// it. ok is false without a first token or with fewer than two tokens.
func (t *Trace) MeanITL(now time.Time) (itl float64, ok bool) {
	fb, n := t.firstByte.Load(), t.generated.Load()
	if fb == 0 || n < 2 {
		return 0, false
	}
	return max(now.Sub(time.Unix(0, fb)).Seconds(), 0) / float64(n-1), true
}

// Tokens is the output tokens the response reported streaming so far (0
// when no response path counted them).
func (t *Trace) Tokens() int { return int(t.generated.Load()) }
