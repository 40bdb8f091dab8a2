package routerconfig

import (
	"errors"
	"strconv"
	"time"
)

// ErrInvalid is wrapped by every error this package returns, so callers can
// map all of them to one kind (startup failure, HTTP 422) with errors.Is.
var ErrInvalid = errors.New("invalid router configuration")

// Error names one offending setting and its value. Name is the environment
// variable (FromEnv), the config key (Config.Validate) or the wire field
// (Override.Validate).
type Error struct {
	Name   string
	Value  string // as given: quoted for raw environment text
	Reason string
}

func (e *Error) Error() string { return e.Name + "=" + e.Value + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *Error) Unwrap() error { return ErrInvalid }

func envError(name, raw, reason string) error {
	return &Error{Name: name, Value: strconv.Quote(raw), Reason: reason}
}

func floatError(name string, v float64, reason string) error {
	return &Error{Name: name, Value: formatFloat(v), Reason: reason}
}

func boolError(name string, v bool, reason string) error {
	return &Error{Name: name, Value: strconv.FormatBool(v), Reason: reason}
}

func stringError(name, v, reason string) error {
	return &Error{Name: name, Value: strconv.Quote(v), Reason: reason}
}

func secondsError(name string, d time.Duration, reason string) error {
	return floatError(name, d.Seconds(), reason)
}

// formatFloat prints plain decimals (31536001, not 3.1536001e+07) up to the
// size where exponents read better.
func formatFloat(v float64) string {
	if finite(v) && v > -1e21 && v < 1e21 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Range checks shared by FromEnv, Config.Validate and Override.Validate; each
// returns "" when v is acceptable, else the reason.

const (
	reasonNonNegative = "must be a finite number >= 0"
	reasonUnit        = "must be a finite number between 0 and 1"
)

func checkNonNegative(v float64) string {
	if !finite(v) || v < 0 {
		return reasonNonNegative
	}
	return ""
}

func checkUnit(v float64) string {
	if !finite(v) || v < 0 || v > 1 {
		return reasonUnit
	}
	return ""
}

func finite(v float64) bool { return v-v == 0 } // false for NaN and ±Inf
