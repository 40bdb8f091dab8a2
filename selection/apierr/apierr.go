// Package apierr is the error type every selection call returns: a Kind,
// which each front maps to its own status space in one table (httpadmin: the
// HTTP status codes of Dynamo's lib/kv-router/src/services/selection/error.rs;
// extproc: immediate-response codes), and the message clients see. Nothing
// ever matches on message text. The selection package re-exports the type as
// selection.Error; the core's subsystems build their errors here so that the
// message a client reads is decided where the failure is understood.
package apierr

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Kind classifies an error.
type Kind uint8

// Error kinds.
const (
	Internal    Kind = iota // 500
	BadRequest              // 400
	NotFound                // 404
	Conflict                // 409
	NotReady                // 503: no schedulable worker, shutting down
	Overloaded              // 429: all eligible workers overloaded, queue limits
	Unavailable             // 503: all eligible workers filtered out
)

var kindNames = [...]string{"internal", "bad_request", "not_found", "conflict", "not_ready", "overloaded", "unavailable"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Error is a classified error. Message is the text clients see (Dynamo's
// wording where Dynamo has one); Details carries structured extras for the
// envelope.
type Error struct {
	Kind    Kind
	Message string
	Details map[string]any
	// RetryAfter, when set, is how long the client should wait before trying
	// again: the fronts send it as Retry-After (whole seconds, at least 1).
	RetryAfter time.Duration
	err        error
}

func (e *Error) Error() string { return e.Message }

// Unwrap exposes the underlying cause for errors.Is / errors.As.
func (e *Error) Unwrap() error { return e.err }

// KindOf returns the kind of err: an *Error's kind, Internal otherwise.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Internal
}

// New is an error of kind k with a formatted message.
func New(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// Wrap classifies cause with kind k, keeping its message.
func Wrap(k Kind, cause error) *Error {
	return &Error{Kind: k, Message: cause.Error(), err: cause}
}

// WithDetails is an error of kind k whose message is message, whose cause is
// cause and whose envelope carries details.
func WithDetails(k Kind, message string, cause error, details map[string]any) *Error {
	return &Error{Kind: k, Message: message, err: cause, Details: details}
}

// RetryAfterHeader is e.RetryAfter as a Retry-After value: whole seconds,
// rounded up, at least 1; "" when e sets none.
func (e *Error) RetryAfterHeader() string {
	if e.RetryAfter <= 0 {
		return ""
	}
	return strconv.Itoa(max(int((e.RetryAfter+time.Second-1)/time.Second), 1))
}
