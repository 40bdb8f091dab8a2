package extproc

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/kvselect/kvselect/selection"
)

// Request headers of agent sessions besides kvselect's own HeaderSessionID.
// The three x-dynamo-* names are the ones NVIDIA Dynamo's frontend reads
// (lib/llm/src/protocols/agents.rs: HEADER_DYNAMO_SESSION_ID,
// HEADER_DYNAMO_PARENT_SESSION_ID, HEADER_DYNAMO_SESSION_FINAL), which
// clients built for it (agent harnesses, aiperf's session replays) send.
const (
	// HeaderDynamoSessionID is Dynamo's session id header: one of the
	// default session headers (DefaultSessionHeaders).
	HeaderDynamoSessionID = "x-dynamo-session-id"
	// HeaderDynamoParentSessionID names the session a subagent's session
	// was started from: a child without a binding of its own starts on its
	// parent's worker while the parent's binding is live.
	HeaderDynamoParentSessionID = "x-dynamo-parent-session-id"
	// HeaderDynamoSessionFinal, when true (true, 1, yes or on, any case),
	// marks the session's last request: it routes by the binding, which
	// ends when its booking does.
	HeaderDynamoSessionFinal = "x-dynamo-session-final"
	// HeaderCorrelationID is the request-correlation header benchmark
	// clients such as aiperf keep constant across a conversation. Not a
	// default session header: many clients send a fresh one per request,
	// which would fill the affinity table with one-request sessions.
	HeaderCorrelationID = "x-correlation-id"
)

// MaxSessionHeaders bounds Options.SessionHeaders.
const MaxSessionHeaders = 8

// DefaultSessionHeaders are the session headers of Options.SessionHeaders
// nil: kvselect's own first — a client that sends it means it for this
// picker — then Dynamo's.
func DefaultSessionHeaders() []string {
	return []string{HeaderSessionID, HeaderDynamoSessionID}
}

// CheckSessionHeaders validates an ordered session header list: at most
// MaxSessionHeaders distinct, lower-case HTTP header names (Envoy hands the
// picker lower-cased keys, so an upper-case name would never match), none
// of them a header the picker reads for something else.
func CheckSessionHeaders(names []string) error {
	if len(names) > MaxSessionHeaders {
		return fmt.Errorf("%d session headers: at most %d", len(names), MaxSessionHeaders)
	}
	for i, n := range names {
		if n == "" || strings.ContainsFunc(n, func(r rune) bool { return !isTokenChar(r) }) {
			return fmt.Errorf("session header %q is not an HTTP header name", n)
		}
		if n != strings.ToLower(n) {
			return fmt.Errorf("session header %q: write it in lower case", n)
		}
		for _, prev := range names[:i] {
			if prev == n {
				return fmt.Errorf("session header %q listed twice", n)
			}
		}
		if reservedSessionHeader(n) {
			return fmt.Errorf("session header %q: the picker reads it for something else", n)
		}
	}
	return nil
}

// reservedSessionHeader: headers with another meaning to the picker, which
// cannot also name a session (readHeaders reads each key once).
func reservedSessionHeader(n string) bool {
	switch n {
	case HeaderDynamoParentSessionID, HeaderDynamoSessionFinal, HeaderBlockHashes, HeaderSequenceHashes,
		HeaderISLTokens, HeaderTokenIDs, HeaderModelName, HeaderRoutingGroup, HeaderLoraName, HeaderCacheSalt,
		HeaderExpectedOutputTokens, HeaderSelectionID, HeaderObjective, HeaderFairnessID, HeaderObjectiveLegacy,
		HeaderFairnessIDLegacy, HeaderPriority, HeaderSLOTTFT, HeaderSLOTPOT, HeaderSLOTTFTLegacy, HeaderSLOTPOTLegacy:
		return true
	}
	return strings.HasPrefix(n, ":")
}

// isTokenChar reports whether r may appear in an HTTP field name (RFC 9110
// token).
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// sessionIndex is the position of header k in the session header list, or
// -1. The list is short (MaxSessionHeaders): a scan beats a map.
func sessionIndex(names []string, k string) int {
	for i, n := range names {
		if n == k {
			return i
		}
	}
	return -1
}

// sessionFields puts the request's session into req: the first session
// header of the list that carries a value (readHeaders), else the body's
// nvext.session_control.session_id. With a parent or the final marker the
// session goes as session_context (the REST front's shape), else as the flat
// session id. A session header value is trimmed, and a parent equal to the
// session is no parent, as Dynamo's frontend reads them; a final marker
// that is not true is no marker. It returns the session id.
func sessionFields(id *identity, bodySession string, req *selection.SelectRequest) string {
	s := cmp.Or(id.session, bodySession)
	if s == "" {
		return ""
	}
	parent := strings.TrimSpace(id.parentSession)
	if parent == s {
		parent = ""
	}
	final := truthy(id.sessionFinal)
	if parent == "" && !final {
		req.SessionID = &s
		return s
	}
	sc := &selection.SessionContext{SessionID: s}
	if parent != "" {
		sc.ParentSessionID = &parent
	}
	if final {
		sc.SessionFinal = &final
	}
	req.SessionContext = sc
	return s
}

// truthy is Dynamo's reading of a boolean header (dynamo_runtime's
// is_truthy): true, 1, yes or on, in any case, around spaces.
func truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "1", "yes", "on":
		return true
	}
	return false
}
