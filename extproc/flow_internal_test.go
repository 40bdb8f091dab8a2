package extproc

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// FuzzFlowHeaders: any priority header is an integer within bounds or an
// error naming the header; any fairness id is accepted exactly when it is
// short printable UTF-8. The session headers: the session is the trimmed
// header value, the final marker holds exactly for Dynamo's true spellings,
// a parent is never the session itself, and a session becomes the tenant
// (SessionAsFairnessID) exactly when it is a valid one. Never a panic.
func FuzzFlowHeaders(f *testing.F) {
	for _, s := range []string{"0", "-1", " 7 ", "1000000", "-1000001", "1e3", "", "0x10", "９", "9223372036854775808", "+5"} {
		f.Add(s, "tenant-"+s, "session-"+s, s)
	}
	f.Add("1", strings.Repeat("é", 200), " s ", " TRUE ")
	f.Add("1", "s", "s", "on")
	f.Add("1", "p", strings.Repeat("x", 300), "yes")
	f.Add("1", "", "a\x01b", "false")
	f.Fuzz(func(t *testing.T, prio, tenant, session, final string) {
		fuzzSessionHeaders(t, tenant, session, final)
		p, err := parsePriority(prio)
		if err != nil {
			if !strings.Contains(err.Error(), HeaderPriority) {
				t.Fatalf("error without the header's name: %v", err)
			}
		} else {
			if p < flow.MinPriority || p > flow.MaxPriority {
				t.Fatalf("%q accepted as %d, out of range", prio, p)
			}
			if want, _ := strconv.Atoi(strings.TrimSpace(prio)); want != p {
				t.Fatalf("%q parsed as %d", prio, p)
			}
		}
		err = selection.CheckTenant(tenant)
		printable := utf8.ValidString(tenant) && !strings.ContainsFunc(tenant, func(r rune) bool { return r < 0x20 || r == 0x7f })
		if ok := len(tenant) <= flow.MaxTenantLen && printable; ok != (err == nil) {
			t.Fatalf("tenant %q: err %v", tenant, err)
		}
	})
}

// fuzzSessionHeaders checks the session headers' reading: session as
// Dynamo's session header, parent the fuzzed tenant, final the marker.
func fuzzSessionHeaders(t *testing.T, parent, session, final string) {
	var id identity
	hm := headerMap([]string{HeaderDynamoSessionID, session, HeaderDynamoParentSessionID, parent, HeaderDynamoSessionFinal, final})
	if err := readHeaders(hm, &id, DefaultSessionHeaders()); err != nil {
		t.Fatalf("session headers refused: %v", err)
	}
	var req selection.SelectRequest
	s := sessionFields(&id, "", &req)
	gotS, gotP, gotF := sessionOfRequest(&req)
	if s != strings.TrimSpace(session) || gotS != s {
		t.Fatalf("session %q read as %q (request %q)", session, s, gotS)
	}
	switch strings.ToLower(strings.TrimSpace(final)) {
	case "true", "1", "yes", "on":
		if gotF != (s != "") {
			t.Fatalf("final %q for session %q read as %v", final, s, gotF)
		}
	default:
		if gotF {
			t.Fatalf("final %q read as true", final)
		}
	}
	if gotP != "" && (gotP == s || gotP != strings.TrimSpace(parent)) {
		t.Fatalf("parent %q of session %q read as %q", parent, s, gotP)
	}
	if _, err := flowFields(&id, &Options{SessionAsFairnessID: true}, s, &req); err != nil {
		t.Fatalf("no fairness header, yet %v", err)
	}
	if want := selection.CheckTenant(s) == nil; (req.Tenant == s && s != "") != (want && s != "") {
		t.Fatalf("session %q as tenant: got %q", s, req.Tenant)
	}
}

// TestFlowHeaderAliases: llm-d's x-llm-d-* names are read, the deprecated
// x-gateway-* names too when the current one is absent (the current one wins
// when both are sent), each deprecated name sent is flagged for the counter,
// and with SessionAsFairnessID the session is the tenant when no fairness
// id is sent.
func TestFlowHeaderAliases(t *testing.T) {
	objectives := new(flow.Objectives)
	objectives.Set(flow.SourceFile, map[string]int{"new": 7, "old": 3})
	post := []string{":method", "POST", ":path", "/v1/completions", HeaderTokenIDs, "1"}
	cases := []struct {
		name       string
		headers    []string
		asTenant   bool
		priority   int // -100: none
		tenant     string
		deprecated uint8
		err        string
	}{
		{name: "current names", headers: []string{HeaderObjective, "new", HeaderFairnessID, "t-new"}, priority: 7, tenant: "t-new"},
		{name: "deprecated names", headers: []string{HeaderObjectiveLegacy, "old", HeaderFairnessIDLegacy, "t-old"}, priority: 3, tenant: "t-old",
			deprecated: sentObjectiveLegacy | sentFairnessIDLegacy},
		{name: "both: the current name wins", headers: []string{HeaderObjectiveLegacy, "old", HeaderObjective, "new",
			HeaderFairnessIDLegacy, "t-old", HeaderFairnessID, "t-new"}, priority: 7, tenant: "t-new",
			deprecated: sentObjectiveLegacy | sentFairnessIDLegacy},
		{name: "deprecated latency names flagged", headers: []string{HeaderSLOTTFTLegacy, "100", HeaderSLOTPOTLegacy, "10"}, priority: -100,
			deprecated: sentSLOTTFTLegacy | sentSLOTPOTLegacy},
		{name: "a bad deprecated fairness id names its header", headers: []string{HeaderFairnessIDLegacy, "a\x01b"}, deprecated: sentFairnessIDLegacy, err: HeaderFairnessIDLegacy},
		{name: "session as tenant", headers: []string{HeaderDynamoSessionID, "agent-7"}, asTenant: true, priority: -100, tenant: "agent-7"},
		{name: "session as tenant: a fairness id wins", headers: []string{HeaderDynamoSessionID, "agent-7", HeaderFairnessIDLegacy, "t"},
			asTenant: true, priority: -100, tenant: "t", deprecated: sentFairnessIDLegacy},
		{name: "session as tenant: off by default", headers: []string{HeaderDynamoSessionID, "agent-7"}, priority: -100},
		{name: "session as tenant: an invalid tenant is the default flow", headers: []string{HeaderSessionID, strings.Repeat("s", flow.MaxTenantLen+1)},
			asTenant: true, priority: -100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var id identity
			opts := Options{Objectives: objectives, SessionHeaders: DefaultSessionHeaders(), SessionAsFairnessID: tc.asTenant}
			if err := readHeaders(headerMap(append(post, tc.headers...)), &id, opts.SessionHeaders); err != nil {
				t.Fatal(err)
			}
			if id.deprecated != tc.deprecated {
				t.Errorf("deprecated bits %b, want %b", id.deprecated, tc.deprecated)
			}
			in, err := readSelectInput(&id, nil, &opts)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := -100
			if in.req.Priority != nil {
				got = *in.req.Priority
			}
			if got != tc.priority || in.req.Tenant != tc.tenant {
				t.Fatalf("priority %d tenant %q; want %d %q", got, in.req.Tenant, tc.priority, tc.tenant)
			}
		})
	}
}
