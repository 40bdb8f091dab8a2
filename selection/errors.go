package selection

import "github.com/kvselect/kvselect/selection/apierr"

// Kind classifies a selection error. Each front maps kinds to its own status
// space in one table (httpadmin: the HTTP status codes of Dynamo's
// lib/kv-router/src/services/selection/error.rs; extproc: immediate-response
// codes); nothing ever matches on message text.
type Kind = apierr.Kind

// Error kinds.
const (
	KindInternal    = apierr.Internal    // 500
	KindBadRequest  = apierr.BadRequest  // 400
	KindNotFound    = apierr.NotFound    // 404
	KindConflict    = apierr.Conflict    // 409
	KindNotReady    = apierr.NotReady    // 503: no schedulable worker, shutting down
	KindOverloaded  = apierr.Overloaded  // 429: all eligible workers overloaded, queue limits
	KindUnavailable = apierr.Unavailable // 503: all eligible workers filtered out
)

// Error is the error type of every Service method. Message is the text
// clients see (Dynamo's wording where Dynamo has one); Details carries
// structured extras for the envelope.
type Error = apierr.Error

// KindOf returns the kind of err: an *Error's kind, KindInternal otherwise.
func KindOf(err error) Kind { return apierr.KindOf(err) }
