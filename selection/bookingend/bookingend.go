// Package bookingend estimates when a booking ends when nobody will say so:
// a gateway that never sends the ext_proc response phase (NGINX Gateway
// Fabric's endpoint-picker shim ends the stream right after the decision)
// leaves a booking whose response runs on unseen. Its estimated lifetime is
// the predicted time to first token plus its expected output tokens at the
// predicted inter-token latency, capped; the output length is what the
// request states, else what this model's responses have been (learnt from
// the bookings whose end was seen), else a default.
//
// The package does no I/O and keeps no clock: the service passes its
// predictions in and turns the lifetime into an expiry time on the
// reservation row, which its periodic upkeep acts on.
package bookingend

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Defaults.
const (
	// DefaultMax caps an estimated lifetime: Dynamo's active-request expiry
	// (300 s), past which the upkeep reclaims any booking anyway.
	DefaultMax = 300 * time.Second
	// DefaultOutputTokens is the expected output of a request that states
	// none, of a model whose responses have not been seen enough yet.
	DefaultOutputTokens = 256
	// DefaultMinSamples is how many seen ends a model needs before its
	// learnt output length replaces DefaultOutputTokens.
	DefaultMinSamples = 8
	// DefaultMaxModels bounds the models whose output lengths are learnt: a
	// stream of invented model names must not grow the table without end.
	DefaultMaxModels = 1024
	// weight is the exponential moving average's weight of a new length once
	// 1/weight of them were seen (before that, the plain mean): about the
	// last 20 responses count.
	weight = 0.05
)

// Config tunes the estimate; the zero value takes the defaults.
type Config struct {
	// Max caps an estimated lifetime (DefaultMax when zero).
	Max time.Duration
	// OutputTokens is the default expected output (DefaultOutputTokens
	// when zero).
	OutputTokens int
	// MinSamples and MaxModels bound the learnt lengths (DefaultMinSamples,
	// DefaultMaxModels when zero).
	MinSamples, MaxModels int
}

func (c Config) withDefaults() Config {
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = DefaultOutputTokens
	}
	if c.MinSamples == 0 {
		c.MinSamples = DefaultMinSamples
	}
	if c.MaxModels == 0 {
		c.MaxModels = DefaultMaxModels
	}
	return c
}

// Validate refuses negative bounds.
func (c Config) Validate() error {
	if c.Max < 0 || c.OutputTokens < 0 || c.MinSamples < 0 || c.MaxModels < 0 {
		return fmt.Errorf("booking end: negative bound in %+v", c)
	}
	return nil
}

// Request is what one estimate reads of the booking.
type Request struct {
	// Expected is the output tokens the request expects (0: none stated);
	// Limit its output limit, max_tokens (0: none).
	Expected, Limit int
	// TTFT and ITL are the latency model's predictions for the booking's
	// rank, in seconds.
	TTFT, ITL float64
}

// Estimate is an estimated course: the first token after TTFT, the end
// after Lifetime, both from the booking's start; Tokens is the output length
// it assumed, ITL the inter-token latency.
type Estimate struct {
	TTFT, Lifetime, ITL time.Duration
	Tokens              int
}

// Estimator learns each model's output lengths and estimates lifetimes.
// Safe for concurrent use; its mutex is a leaf.
type Estimator struct {
	cfg Config

	mu     sync.Mutex
	models map[string]*length
}

// length is a model's learnt output length.
type length struct {
	mean float64
	n    int
}

// New returns an estimator; cfg must be valid.
func New(cfg Config) (*Estimator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Estimator{cfg: cfg.withDefaults(), models: make(map[string]*length)}, nil
}

// Config is the configuration in effect, defaults filled in.
func (e *Estimator) Config() Config { return e.cfg }

// Observe learns that a response of model streamed tokens output tokens (a
// booking whose end was seen). Zero tells nothing: the response path did
// not count its tokens. A model beyond MaxModels is not learnt.
func (e *Estimator) Observe(model string, tokens int) {
	if tokens <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.models[model]
	if l == nil {
		if len(e.models) >= e.cfg.MaxModels {
			return
		}
		l = &length{}
		e.models[model] = l
	}
	l.n++
	w := max(1/float64(l.n), weight)
	l.mean += w * (float64(tokens) - l.mean)
}

// Learnt returns model's learnt output length; ok is false until MinSamples
// ends were seen.
func (e *Estimator) Learnt(model string) (tokens float64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.models[model]
	if l == nil || l.n < e.cfg.MinSamples {
		return 0, false
	}
	return l.mean, true
}

// Estimate is r's course on model: output tokens as the request expects,
// else as the model's responses have been, else the default, never beyond
// its limit; the lifetime TTFT + tokens × ITL, capped at Max, with the first
// token no later than the end.
func (e *Estimator) Estimate(model string, r Request) Estimate {
	tokens := float64(e.cfg.OutputTokens)
	switch learnt, ok := e.Learnt(model); {
	case r.Expected > 0:
		tokens = float64(r.Expected)
	case ok:
		tokens = learnt
	}
	if r.Limit > 0 {
		tokens = min(tokens, float64(r.Limit))
	}
	ttft, itl := finite(r.TTFT), finite(r.ITL)
	life := min(seconds(ttft+tokens*itl), e.cfg.Max)
	return Estimate{TTFT: min(seconds(ttft), life), Lifetime: life, ITL: seconds(itl), Tokens: int(math.Round(tokens))}
}

// finite is a non-negative finite prediction, 0 for anything else.
func finite(x float64) float64 {
	if !(x >= 0) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// seconds converts without overflowing: anything past a century is a
// century, far beyond any Max.
func seconds(s float64) time.Duration {
	const century = 100 * 365 * 24 * time.Hour
	if s >= century.Seconds() {
		return century
	}
	return time.Duration(s * float64(time.Second))
}
