package selection

import (
	"errors"
	"fmt"
)

// Kind classifies a selection error. Each front maps kinds to its own status space
// in one table (httpadmin: the HTTP status codes of Dynamo's
// lib/kv-router/src/services/selection/error.rs; extproc:
// immediate-response codes); nothing ever matches on message text.
type Kind uint8

// Error kinds.
const (
	KindInternal    Kind = iota // 500
	KindBadRequest              // 400
	KindNotFound                // 404
	KindConflict                // 409
	KindNotReady                // 503: no schedulable worker, shutting down
	KindOverloaded              // 429: all eligible workers overloaded, queue limits
	KindUnavailable             // 503: all eligible workers filtered out
)

var kindNames = [...]string{"internal", "bad_request", "not_found", "conflict", "not_ready", "overloaded", "unavailable"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Error is the error type of every Service method. Message is the text clients
// see (Dynamo's wording where Dynamo has one); Details carries structured
// extras for the envelope.
type Error struct {
	Kind    Kind
	Message string
	Details map[string]any
	err     error
}

func (e *Error) Error() string { return e.Message }

// Unwrap exposes the underlying cause for errors.Is / errors.As.
func (e *Error) Unwrap() error { return e.err }

// KindOf returns the kind of err: an *Error's kind, KindInternal otherwise.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

func newError(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// wrapError classifies cause with kind, keeping its message.
func wrapError(k Kind, cause error) *Error {
	return &Error{Kind: k, Message: cause.Error(), err: cause}
}

// errShuttingDown is returned by mutating and selection calls once Shutdown ran.
func errShuttingDown() *Error {
	return newError(KindNotReady, "selection service is shutting down")
}
