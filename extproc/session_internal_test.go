package extproc

import (
	"testing"

	"github.com/kvselect/kvselect/selection"
)

// sessionOfRequest is what readSelectInput made of the request's session:
// its id, parent and final marker, whichever shape it went in.
func sessionOfRequest(req *selection.SelectRequest) (id, parent string, final bool) {
	if sc := req.SessionContext; sc != nil {
		if sc.ParentSessionID != nil {
			parent = *sc.ParentSessionID
		}
		return sc.SessionID, parent, sc.SessionFinal != nil && *sc.SessionFinal
	}
	if req.SessionID != nil {
		return *req.SessionID, "", false
	}
	return "", "", false
}

// TestSessionHeaderPrecedence: the session header list is read in its order
// — kvselect's own header first by default, then Dynamo's; x-correlation-id
// only when configured — then the body's nvext session; Dynamo's parent and
// final headers ride along as session_context.
func TestSessionHeaderPrecedence(t *testing.T) {
	const nvext = `{"model":"m","prompt":[1],"nvext":{"session_control":{"session_id":"from-body"}}}`
	post := []string{":method", "POST", ":path", "/v1/completions", HeaderTokenIDs, "1"}
	cases := []struct {
		name    string
		headers []string
		list    []string // nil: the defaults
		body    string

		session, parent string
		final           bool
	}{
		{name: "kvselect's header", headers: []string{HeaderSessionID, "k"}, session: "k"},
		{name: "Dynamo's header", headers: []string{HeaderDynamoSessionID, "d"}, session: "d"},
		{name: "both: kvselect's wins, whatever their order", headers: []string{HeaderDynamoSessionID, "d", HeaderSessionID, "k"}, session: "k"},
		{name: "the configured order wins", headers: []string{HeaderSessionID, "k", HeaderDynamoSessionID, "d"},
			list: []string{HeaderDynamoSessionID, HeaderSessionID}, session: "d"},
		{name: "an empty value falls through", headers: []string{HeaderSessionID, "  ", HeaderDynamoSessionID, " d "}, session: "d"},
		{name: "x-correlation-id is not a default", headers: []string{HeaderCorrelationID, "c"}},
		{name: "x-correlation-id opted in", headers: []string{HeaderCorrelationID, "c", HeaderSessionID, "k"},
			list: []string{HeaderCorrelationID}, session: "c"},
		{name: "opted in last", headers: []string{HeaderCorrelationID, "c", HeaderDynamoSessionID, "d"},
			list: []string{HeaderSessionID, HeaderDynamoSessionID, HeaderCorrelationID}, session: "d"},
		{name: "a header over the body", headers: []string{HeaderDynamoSessionID, "d"}, body: nvext, session: "d"},
		{name: "the body without a header", body: nvext, session: "from-body"},
		{name: "no session headers: the body alone", headers: []string{HeaderSessionID, "k"}, list: []string{}, body: nvext, session: "from-body"},
		{name: "a parent", headers: []string{HeaderDynamoSessionID, "child", HeaderDynamoParentSessionID, " root "}, session: "child", parent: "root"},
		{name: "a parent equal to the session is none", headers: []string{HeaderDynamoSessionID, "s", HeaderDynamoParentSessionID, "s"}, session: "s"},
		{name: "a parent without a session is nothing", headers: []string{HeaderDynamoParentSessionID, "root"}},
		{name: "final true", headers: []string{HeaderDynamoSessionID, "s", HeaderDynamoSessionFinal, "true"}, session: "s", final: true},
		{name: "final TRUE", headers: []string{HeaderDynamoSessionID, "s", HeaderDynamoSessionFinal, " TRUE "}, session: "s", final: true},
		{name: "final 1", headers: []string{HeaderSessionID, "s", HeaderDynamoSessionFinal, "1"}, session: "s", final: true},
		{name: "final yes", headers: []string{HeaderSessionID, "s", HeaderDynamoSessionFinal, "yes"}, session: "s", final: true},
		{name: "final on", headers: []string{HeaderSessionID, "s", HeaderDynamoSessionFinal, "On"}, session: "s", final: true},
		{name: "final false", headers: []string{HeaderSessionID, "s", HeaderDynamoSessionFinal, "false"}, session: "s"},
		{name: "final garbage is no marker", headers: []string{HeaderSessionID, "s", HeaderDynamoSessionFinal, "maybe"}, session: "s"},
		{name: "final for the body's session", headers: []string{HeaderDynamoSessionFinal, "true"}, body: nvext, session: "from-body", final: true},
		{name: "parent and final", headers: []string{HeaderDynamoSessionID, "c", HeaderDynamoParentSessionID, "p", HeaderDynamoSessionFinal, "true"},
			session: "c", parent: "p", final: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			list := tc.list
			if list == nil {
				list = DefaultSessionHeaders()
			}
			var id identity
			if err := readHeaders(headerMap(append(post, tc.headers...)), &id, list); err != nil {
				t.Fatal(err)
			}
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			in, err := readSelectInput(&id, body, &Options{SessionHeaders: list})
			if err != nil {
				t.Fatal(err)
			}
			s, p, f := sessionOfRequest(&in.req)
			if s != tc.session || p != tc.parent || f != tc.final {
				t.Fatalf("session %q parent %q final %v; want %q %q %v", s, p, f, tc.session, tc.parent, tc.final)
			}
			if in.req.SessionContext != nil && in.req.SessionID != nil {
				t.Fatal("both session shapes set")
			}
		})
	}
}

func TestCheckSessionHeaders(t *testing.T) {
	for _, ok := range [][]string{nil, {}, DefaultSessionHeaders(), {HeaderCorrelationID}, {HeaderRequestID, "x-my_session.id"}} {
		if err := CheckSessionHeaders(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range [][]string{
		{""}, {"X-Session"}, {"x session"}, {"a", "a"}, {HeaderDynamoSessionFinal}, {HeaderDynamoParentSessionID},
		{HeaderTokenIDs}, {HeaderFairnessIDLegacy}, {":path"}, {"a", "b", "c", "d", "e", "f", "g", "h", "i"},
	} {
		if err := CheckSessionHeaders(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
