package httpadmin

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"

	"github.com/kvselect/kvselect/selection"
)

// kindStatus is the one table from selection error kinds to HTTP status codes,
// as Dynamo's lib/kv-router/src/services/selection/error.rs (commit 015c9303)
// maps them: overload, deadline and queue rejection are 429 (older Dynamo
// answered 503 for a queue rejection), policy-filter rejection 503.
var kindStatus = map[selection.Kind]int{
	selection.KindBadRequest:  http.StatusBadRequest,
	selection.KindNotFound:    http.StatusNotFound,
	selection.KindConflict:    http.StatusConflict,
	selection.KindNotReady:    http.StatusServiceUnavailable,
	selection.KindOverloaded:  http.StatusTooManyRequests,
	selection.KindUnavailable: http.StatusServiceUnavailable,
	selection.KindInternal:    http.StatusInternalServerError,
}

// statusOf maps a Service (or PeerManager) error to its status; an error
// without a kind, or of a kind this table does not know, is a 500.
func statusOf(err error) int {
	if st, ok := kindStatus[selection.KindOf(err)]; ok {
		return st
	}
	return http.StatusInternalServerError
}

// errorBody is Dynamo's error envelope. Details carries a *selection.Error's
// structured extras: Dynamo's policy-class queue rejection adds
// "details": {policy_class, limit_kind, current, limit}.
type errorBody struct {
	Error   string         `json:"error"`
	Details map[string]any `json:"details,omitempty"`
}

// statusOK is the body of every payload-less success.
var statusOK = struct {
	Status string `json:"status"`
}{"ok"}

// fail answers a Service error with its mapped status and envelope.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	st := statusOf(err)
	var details map[string]any
	var se *selection.Error
	if errors.As(err, &se) {
		details = se.Details
		if v := se.RetryAfterHeader(); v != "" {
			w.Header().Set("Retry-After", v)
		}
	}
	if st >= 500 {
		s.log.Warn("httpadmin: request failed", "method", r.Method, "path", r.URL.Path, "status", st, "error", err)
	}
	writeError(w, st, err.Error(), details)
}

func writeError(w http.ResponseWriter, status int, msg string, details map[string]any) {
	writeJSON(w, status, errorBody{Error: msg, Details: details})
}

var encPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// writeJSON writes v as the whole response. HTML characters are not escaped, as
// serde_json does not escape them; no trailing newline, as axum's Json has none.
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := encPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 1<<20 {
			encPool.Put(buf)
		}
	}()
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only a non-finite float can get here; the Service never produces one.
		buf.Reset()
		status = http.StatusInternalServerError
		buf.WriteString(`{"error":"failed to encode the response"}`)
	} else {
		buf.Truncate(buf.Len() - 1)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}
