package server

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/internal/testpki"
)

// Tokens of the black-box suite: one per scope, one for everything, one
// expired, one never issued.
const (
	e2eRead    = "e2e-read-token-0123456789abcdef"
	e2eSelect  = "e2e-select-token-0123456789abcdef"
	e2eAdmin   = "e2e-admin-token-0123456789abcdef"
	e2eAll     = "e2e-all-token-0123456789abcdef"
	e2eExpired = "e2e-expired-token-0123456789abcdef"
	e2eWrong   = "e2e-wrong-token-0123456789abcdef"
)

func e2eTokenFile(withRead bool) string {
	var b strings.Builder
	if withRead {
		b.WriteString(e2eRead + " read name=reader\n")
	}
	b.WriteString(e2eSelect + " select name=selector\n")
	b.WriteString(e2eAdmin + " admin name=operator\n")
	b.WriteString(e2eAll + " read,select,admin name=fixture\n")
	b.WriteString(e2eExpired + " read,select,admin name=old expires=2020-01-01T00:00:00Z\n")
	return b.String()
}

// authServer is a kvselect with every REST authentication source on, over
// TLS, and what a client needs to reach it.
type authServer struct {
	t         *testing.T
	base      string
	tokenFile string
	clients   map[string]*http.Client // by certificate: "", "operator", "ray", "stranger", "rogue"
	ids       atomic.Uint64
}

func startAuthServer(t *testing.T) *authServer {
	t.Helper()
	dir := t.TempDir()
	serverCA, clientCA, rogueCA := testpki.NewCA(t, "server CA"), testpki.NewCA(t, "client CA"), testpki.NewCA(t, "rogue CA")
	certDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	testpki.WriteCertDir(t, certDir, serverCA.ServerCert(t))
	clientCAFile := filepath.Join(dir, "client-ca.pem")
	clientCA.WritePEM(t, clientCAFile)
	tokenFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokenFile, []byte(e2eTokenFile(true)), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "kvselect.yaml")
	if err := os.WriteFile(config, []byte(`auth:
  client_certificates:
    - ou: kvselect-operators
      scopes: [admin]
    - san: spiffe://cluster.local/ns/ray/sa/driver
      scopes: [select]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	b := runInBackground(t, withoutKVEvents, []string{
		"--auth-token-file", tokenFile, "--tls-cert-path", certDir, "--tls-client-ca", clientCAFile,
		"--config", config, "--enable-pprof", "--engine-metrics-interval", "0", "--replica-sync-port", strconv.Itoa(freePort(t)), "--extproc-port", "0",
	})
	s := &authServer{t: t, base: "https://" + b.addrs.REST.String(), tokenFile: tokenFile, clients: map[string]*http.Client{}}
	certs := map[string]*tls.Certificate{
		"":         nil,
		"operator": ptr(clientCA.Issue(t, testpki.Leaf{CommonName: "alice", OUs: []string{"kvselect-operators"}, Client: true})),
		"ray":      ptr(clientCA.Issue(t, testpki.Leaf{URIs: []string{"spiffe://cluster.local/ns/ray/sa/driver"}, Client: true})),
		"stranger": ptr(clientCA.Issue(t, testpki.Leaf{CommonName: "bob", OUs: []string{"elsewhere"}, Client: true})),
		"rogue":    ptr(rogueCA.Issue(t, testpki.Leaf{CommonName: "mallory", OUs: []string{"kvselect-operators"}, Client: true})),
	}
	for name, cert := range certs {
		cfg := &tls.Config{RootCAs: serverCA.Pool()}
		if cert != nil {
			// Sent whatever CAs the server names as acceptable: Go's
			// client would otherwise keep the rogue one to itself.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		s.clients[name] = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// freePort is a TCP port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// answer is one response, read whole.
type answer struct {
	status    int
	challenge string
	body      string
	err       error // the request failed (e.g. the TLS handshake)
}

// do sends one request with a client certificate (by name) and a token
// ("" for none).
func (s *authServer) do(cert, token, method, path string, body any) answer {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := s.clients[cert].Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, challenge: res.Header.Get("WWW-Authenticate"), body: string(raw)}
}

// must sends a fixture request with the all-scopes token and wants a 2xx.
func (s *authServer) must(method, path string, body any) map[string]any {
	s.t.Helper()
	a := s.do("", e2eAll, method, path, body)
	if a.err != nil || a.status/100 != 2 {
		s.t.Fatalf("fixture %s %s: %d %s %v", method, path, a.status, a.body, a.err)
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(a.body), &m)
	return m
}

// state is what a rejected request must leave as it was.
func (s *authServer) state() string {
	s.t.Helper()
	var b strings.Builder
	for _, p := range []string{"/workers", "/loads", "/dump", "/replica_sync/peers"} {
		a := s.do("", e2eRead, "GET", p, nil)
		if a.status != http.StatusOK {
			s.t.Fatalf("GET %s: %d %s %v", p, a.status, a.body, a.err)
		}
		fmt.Fprintf(&b, "%s %s\n", p, a.body)
	}
	return b.String()
}

func (s *authServer) newWorker() uint64 {
	id := 1000 + s.ids.Add(1)
	s.must("POST", "/workers", map[string]any{"worker_id": id, "model_name": "model", "endpoint": fmt.Sprintf("http://worker-%d:8000", id), "block_size": 4})
	return id
}

func (s *authServer) newSelectionID() string { return fmt.Sprintf("sel-%d", s.ids.Add(1)) }

func selectBody(id string) map[string]any {
	return map[string]any{"model_name": "model", "token_ids": []int{1, 2, 3, 4}, "selection_id": id}
}

// e2eRoute is one REST route as the suite expects it to be guarded,
// written down independently of httpadmin's route table.
type e2eRoute struct {
	method, pattern string
	scope           string // "read", "select", "admin"; "" = open
	ok              int    // the status an authorized request gets; 0 = any 2xx
	// request prepares what the route acts on and returns the concrete
	// path and body.
	request func(s *authServer) (string, any)
}

func fixed(path string, body any) func(*authServer) (string, any) {
	return func(*authServer) (string, any) { return path, body }
}

var e2eRoutes = []e2eRoute{
	{"POST", "/select", "select", 200, func(s *authServer) (string, any) { return "/select", selectBody(s.newSelectionID()) }},
	{"POST", "/select_and_reserve", "select", 200, func(s *authServer) (string, any) {
		return "/select_and_reserve", selectBody(s.newSelectionID())
	}},
	{"POST", "/reservations", "select", 201, func(s *authServer) (string, any) {
		id := s.newSelectionID()
		s.must("POST", "/select", selectBody(id))
		return "/reservations", map[string]any{"model_name": "model", "selection_id": id}
	}},
	{"POST", "/reservations/{reservation_id}/prefill_complete", "select", 200, func(s *authServer) (string, any) {
		id := s.newSelectionID()
		s.must("POST", "/select_and_reserve", selectBody(id))
		return "/reservations/" + id + "/prefill_complete", map[string]any{}
	}},
	{"POST", "/reservations/{reservation_id}/output_block", "select", 200, func(s *authServer) (string, any) {
		id := s.newSelectionID()
		s.must("POST", "/select_and_reserve", selectBody(id))
		return "/reservations/" + id + "/output_block", map[string]any{}
	}},
	{"DELETE", "/reservations/{reservation_id}", "select", 200, func(s *authServer) (string, any) {
		id := s.newSelectionID()
		s.must("POST", "/select_and_reserve", selectBody(id))
		return "/reservations/" + id, nil
	}},
	{"POST", "/workers", "admin", 201, func(s *authServer) (string, any) {
		id := 5000 + s.ids.Add(1)
		return "/workers", map[string]any{"worker_id": id, "model_name": "model", "endpoint": fmt.Sprintf("http://worker-%d:8000", id), "block_size": 4}
	}},
	{"GET", "/workers", "read", 200, fixed("/workers", nil)},
	{"PATCH", "/workers/{worker_id}", "admin", 200, func(s *authServer) (string, any) {
		return fmt.Sprintf("/workers/%d", s.newWorker()), map[string]any{"kv_events_topic": "patched"}
	}},
	{"DELETE", "/workers/{worker_id}", "admin", 200, func(s *authServer) (string, any) {
		return fmt.Sprintf("/workers/%d", s.newWorker()), nil
	}},
	{"POST", "/workers/{worker_id}/health_report", "admin", 0, func(s *authServer) (string, any) {
		return fmt.Sprintf("/workers/%d/health_report", s.newWorker()), map[string]any{"ok": false, "detail": "status 502"}
	}},
	{"GET", "/health", "", 200, fixed("/health", nil)},
	{"GET", "/ready", "", 200, fixed("/ready", nil)},
	{"GET", "/loads", "read", 200, fixed("/loads", nil)},
	{"POST", "/potential_loads", "read", 200, fixed("/potential_loads", map[string]any{"model_name": "model", "token_ids": []int{1, 2, 3, 4}})},
	{"POST", "/overlap_scores", "read", 200, fixed("/overlap_scores", map[string]any{"model_name": "model", "token_ids": []int{1, 2, 3, 4}})},
	{"GET", "/dump", "read", 200, fixed("/dump", nil)},
	{"POST", "/replica_sync/register_peer", "admin", 0, func(s *authServer) (string, any) {
		return "/replica_sync/register_peer", map[string]any{"endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", 20000+s.ids.Add(1))}
	}},
	{"POST", "/replica_sync/deregister_peer", "admin", 200, func(s *authServer) (string, any) {
		ep := fmt.Sprintf("tcp://127.0.0.1:%d", 20000+s.ids.Add(1))
		s.must("POST", "/replica_sync/register_peer", map[string]any{"endpoint": ep})
		return "/replica_sync/deregister_peer", map[string]any{"endpoint": ep}
	}},
	{"GET", "/replica_sync/peers", "read", 200, fixed("/replica_sync/peers", nil)},
	// No collector is bound: an authorized request reaches the handler,
	// which says so.
	{"GET", "/kv_events/collector", "read", 404, fixed("/kv_events/collector", nil)},
	{"GET", "/flow", "read", 200, fixed("/flow", nil)},
	{"GET", "/policy", "read", 200, fixed("/policy", nil)},
	{"GET", "/openapi.json", "read", 200, fixed("/openapi.json", nil)},
	{"GET", "/metrics", "read", 200, fixed("/metrics", nil)},
	{"GET", "/debug/pprof", "admin", 200, fixed("/debug/pprof", nil)},
	{"GET", "/debug/pprof/{profile}", "admin", 200, fixed("/debug/pprof/heap?debug=1", nil)},
	{"GET", "/debug/pprof/cmdline", "admin", 200, fixed("/debug/pprof/cmdline", nil)},
}

// e2eCredential is one way a client presents itself, and the scopes it
// holds (nil: it is nobody).
type e2eCredential struct {
	name, cert, token string
	scopes            []string
	invalid           bool // the token is there but is not a valid one
}

var e2eCredentials = []e2eCredential{
	{name: "no credentials"},
	{name: "wrong token", token: e2eWrong, invalid: true},
	{name: "expired token", token: e2eExpired, invalid: true},
	{name: "read token", token: e2eRead, scopes: []string{"read"}},
	{name: "select token", token: e2eSelect, scopes: []string{"select"}},
	{name: "admin token", token: e2eAdmin, scopes: []string{"admin"}},
	{name: "operator certificate", cert: "operator", scopes: []string{"admin"}},
	{name: "ray certificate", cert: "ray", scopes: []string{"select"}},
	{name: "unmapped certificate", cert: "stranger"},
	{name: "ray certificate and read token", cert: "ray", token: e2eRead, scopes: []string{"read", "select"}},
}

// Every route × every kind of credential, over TLS with client
// certificates: 401 with a Bearer challenge without usable credentials, 403
// with insufficient_scope without the route's scope, the handler's answer
// with it; a rejected request changes nothing; the probes are open.
func TestRESTAuthorizationBlackBox(t *testing.T) {
	s := startAuthServer(t)
	s.newWorker() // something for the selections to pick

	// The suite's table covers every route the server documents.
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if a := s.do("", e2eRead, "GET", "/openapi.json", nil); a.status != 200 || json.Unmarshal([]byte(a.body), &doc) != nil {
		t.Fatalf("openapi.json: %d %v", a.status, a.err)
	}
	for p, methods := range doc.Paths {
		for m := range methods {
			if !slices.ContainsFunc(e2eRoutes, func(r e2eRoute) bool { return r.pattern == p && strings.EqualFold(r.method, m) }) {
				t.Errorf("route %s %s is not in the suite", strings.ToUpper(m), p)
			}
		}
	}

	for _, rt := range e2eRoutes {
		for _, c := range e2eCredentials {
			t.Run(rt.method+" "+rt.pattern+"/"+c.name, func(t *testing.T) {
				path, body := rt.request(s)
				mutation := rt.method != "GET"
				before := ""
				if mutation {
					before = s.state()
				}
				a := s.do(c.cert, c.token, rt.method, path, body)
				if a.err != nil {
					t.Fatalf("request failed: %v", a.err)
				}
				allowed := rt.scope == "" || slices.Contains(c.scopes, rt.scope)
				switch {
				case allowed && rt.ok != 0 && a.status != rt.ok, allowed && rt.ok == 0 && a.status/100 != 2:
					t.Fatalf("authorized: status %d %s, want %d", a.status, a.body, rt.ok)
				case allowed:
					return
				case c.invalid:
					wantDenied(t, a, http.StatusUnauthorized, `Bearer realm="kvselect", error="invalid_token"`)
				case len(c.scopes) == 0:
					wantDenied(t, a, http.StatusUnauthorized, `Bearer realm="kvselect"`)
				default:
					wantDenied(t, a, http.StatusForbidden, `Bearer realm="kvselect", error="insufficient_scope", scope="`+rt.scope+`"`)
				}
				if mutation {
					if after := s.state(); after != before {
						t.Fatalf("a rejected %s changed the state:\n%s", rt.method, firstDifference(before, after))
					}
				}
			})
		}
	}

	t.Run("certificate of another CA", func(t *testing.T) {
		if a := s.do("rogue", e2eAll, "GET", "/workers", nil); a.err == nil {
			t.Fatalf("a certificate of an unknown CA was accepted: %d", a.status)
		}
	})
	t.Run("plaintext", func(t *testing.T) {
		res, err := http.Get("http" + strings.TrimPrefix(s.base, "https") + "/health")
		if err == nil {
			defer res.Body.Close()
			if res.StatusCode != http.StatusBadRequest {
				t.Fatalf("plaintext HTTP to the TLS port: %d", res.StatusCode)
			}
		}
	})
	t.Run("rotated token", func(t *testing.T) {
		tmp := s.tokenFile + ".new"
		if err := os.WriteFile(tmp, []byte(e2eTokenFile(false)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, s.tokenFile); err != nil {
			t.Fatal(err)
		}
		proctest.Eventually(t, "the rotated-out read token to be refused", 20*time.Second, func() bool {
			return s.do("", e2eRead, "GET", "/workers", nil).status == http.StatusUnauthorized
		})
		if a := s.do("", e2eAll, "GET", "/workers", nil); a.status != http.StatusOK {
			t.Fatalf("a token kept in the new file: %d %s", a.status, a.body)
		}
	})
}

func wantDenied(t *testing.T, a answer, status int, challenge string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d %s, want %d", a.status, a.body, status)
	}
	if a.challenge != challenge {
		t.Fatalf("WWW-Authenticate %q, want %q", a.challenge, challenge)
	}
	var env map[string]any
	if err := json.Unmarshal([]byte(a.body), &env); err != nil || env["error"] == nil || len(env) != 1 {
		t.Fatalf("body %s is not the {\"error\"} envelope", a.body)
	}
	for _, tok := range []string{e2eRead, e2eSelect, e2eAdmin, e2eAll, e2eExpired, e2eWrong} {
		if strings.Contains(a.body, tok) {
			t.Fatalf("the error shows a token: %s", a.body)
		}
	}
}

// Without authentication the REST API binds loopback unless --host says
// otherwise, and an explicit non-loopback --host is warned about; with
// authentication --host's default (0.0.0.0, Dynamo's) stands.
func TestRESTBindsLoopbackWithoutAuthentication(t *testing.T) {
	const warning = "WITHOUT AUTHENTICATION"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(e2eTokenFile(true)), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantHost string
		warned   bool
	}{
		{"no auth, no --host", nil, "127.0.0.1", false},
		{"no auth, explicit --host", []string{"--host", "0.0.0.0"}, "0.0.0.0", true},
		{"no auth, explicit --host, trusted network", []string{"--host", "0.0.0.0", "--auth-allow-unauthenticated"}, "0.0.0.0", false},
		{"tokens, no --host", []string{"--auth-token-file", tokens}, "0.0.0.0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := runArgsInBackground(t, withoutKVEvents, append([]string{"--port", "0", "--extproc-port", "0", "--log-format", "json"}, tt.args...))
			host, _, err := net.SplitHostPort(b.addrs.REST.String())
			if err != nil || host != tt.wantHost {
				t.Fatalf("REST listens on %s, want host %s", b.addrs.REST, tt.wantHost)
			}
			if got := strings.Contains(b.logs.String(), warning); got != tt.warned {
				t.Fatalf("warning logged = %v, want %v:\n%s", got, tt.warned, b.logs.String())
			}
		})
	}
}

// Bad authentication settings stop the server with a usage error naming the
// flag or file.
func TestAuthConfigurationErrors(t *testing.T) {
	dir := t.TempDir()
	badTokens := filepath.Join(dir, "bad-tokens")
	if err := os.WriteFile(badTokens, []byte("short read\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noRules := filepath.Join(dir, "no-rules.yaml")
	if err := os.WriteFile(noRules, []byte("router: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badRules := filepath.Join(dir, "bad-rules.yaml")
	if err := os.WriteFile(badRules, []byte("auth:\n  client_certificates:\n    - ou: x\n      scopes: [root]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	goodRules := filepath.Join(dir, "good-rules.yaml")
	if err := os.WriteFile(goodRules, []byte("auth:\n  client_certificates:\n    - ou: x\n      scopes: [read]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := testpki.NewCA(t, "ca")
	caFile := filepath.Join(dir, "ca.pem")
	ca.WritePEM(t, caFile)
	certDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	testpki.WriteCertDir(t, certDir, ca.ServerCert(t))
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--auth-token-file", filepath.Join(dir, "missing")}, "--auth-token-file: token file: open"},
		{[]string{"--auth-token-file", badTokens}, "bad-tokens: line 1: token shorter than 16"},
		{[]string{"--tls-client-ca", caFile}, "--tls-client-ca requires --tls-cert-path"},
		{[]string{"--tls-cert-reload"}, "--tls-cert-reload requires --tls-cert-path"},
		{[]string{"--tls-cert-path", certDir, "--tls-client-ca", caFile, "--config", noRules}, "no auth.client_certificates rules"},
		{[]string{"--config", goodRules}, goodRules + ": auth.client_certificates has no effect without --tls-client-ca"},
		{[]string{"--tls-cert-path", certDir, "--tls-client-ca", caFile, "--config", badRules}, `auth.client_certificates[0]: scopes: unknown scope "root"`},
		{[]string{"--tls-cert-path", certDir, "--tls-client-ca", badTokens, "--config", badRules}, `unknown scope`},
		{[]string{"--tls-cert-path", filepath.Join(dir, "none")}, "--tls-cert-path"},
		{[]string{"--auth-kubernetes-namespace", "x"}, "requires --auth-kubernetes"},
		{[]string{"--auth-allow-unauthenticated", "--auth-token-file", badTokens}, "contradicts"},
		{[]string{"--extproc-client-ca", caFile}, "--extproc-client-ca requires --extproc-secure-serving"},
		{[]string{"--tls-cert-path", certDir, "--tls-client-ca", badTokens, "--config", goodRules}, "--tls-client-ca: client CA bundle " + badTokens + ": no PEM certificate"},
		{[]string{"--extproc-port", strconv.Itoa(freePort(t)), "--extproc-secure-serving", "--extproc-client-ca", filepath.Join(dir, "missing.pem")}, "--extproc-client-ca: client CA bundle: open"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var logs logBuffer
			err := runWith(t.Context(), append([]string{"--port", "0", "--extproc-port", "0"}, tt.args...), withoutKVEvents, io.Discard, &logs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
			if _, ok := err.(*UsageError); !ok {
				t.Fatalf("err %T is not a usage error", err)
			}
		})
	}
}

// firstDifference shows where two states part, not all of both.
func firstDifference(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-200)
	return fmt.Sprintf("before …%s…\nafter  …%s…", a[from:min(len(a), i+200)], b[from:min(len(b), i+200)])
}

// Two replicas with the same --replica-sync-key-file share bookings; a
// third with another key is not heard, and a short key stops the start.
func TestReplicaSyncKeyFile(t *testing.T) {
	dir := t.TempDir()
	writeKey := func(name, hex string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(hex+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shared := writeKey("shared", strings.Repeat("ab", 32))
	other := writeKey("other", strings.Repeat("cd", 32))
	short := writeKey("short", "abcd")

	portA, portB, portC := freePort(t), freePort(t), freePort(t)
	peers := fmt.Sprintf("tcp://127.0.0.1:%d,tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", portA, portB, portC)
	start := func(port int, key string) *background {
		return runInBackground(t, withoutKVEvents, []string{"--replica-sync-port", strconv.Itoa(port), "--replica-sync-peers", peers,
			"--replica-sync-key-file", key, "--extproc-port", "0", "--engine-metrics-interval", "0"})
	}
	a, b, c := start(portA, shared), start(portB, shared), start(portC, other)
	for _, srv := range []*background{a, b, c} {
		post(t, srv.rest()+"/workers", `{"worker_id":1,"model_name":"m","endpoint":"http://10.0.0.1:8000","block_size":4}`)
	}
	// Bookings made on A until B mirrors one: the subscriptions connect
	// in the background.
	n := 0
	proctest.Eventually(t, "B to mirror A's booking", 20*time.Second, func() bool {
		n++
		post(t, a.rest()+"/select_and_reserve", fmt.Sprintf(`{"model_name":"m","token_ids":[1,2,3,4],"selection_id":"s%d"}`, n))
		return activeRequests(t, b.rest()) > 0
	})
	// C subscribes to A too, with another key: it counted A's messages as
	// unauthenticated and applied none.
	proctest.Eventually(t, "C to reject A's messages", 20*time.Second, func() bool {
		return strings.Contains(get(t, c.rest()+"/metrics"), `kvselect_replica_sync_rejected_envelopes_total{reason="unauthenticated"}`) &&
			!strings.Contains(get(t, c.rest()+"/metrics"), `kvselect_replica_sync_rejected_envelopes_total{reason="unauthenticated"} 0`)
	})
	if got := activeRequests(t, c.rest()); got != 0 {
		t.Fatalf("C applied %d bookings of a replica with another key", got)
	}

	err := runWith(t.Context(), []string{"--port", "0", "--extproc-port", "0", "--replica-sync-port", strconv.Itoa(freePort(t)), "--replica-sync-key-file", short},
		withoutKVEvents, io.Discard, io.Discard)
	if _, ok := err.(*UsageError); !ok || !strings.Contains(err.Error(), short) {
		t.Fatalf("short key: %v", err)
	}
}

func post(t *testing.T, url, body string) {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		t.Fatalf("POST %s: %d %s", url, res.StatusCode, raw)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return string(raw)
}

// activeRequests sums active_requests over /loads.
func activeRequests(t *testing.T, base string) int {
	t.Helper()
	var loads []struct {
		Loads []struct {
			ActiveRequests int `json:"active_requests"`
		} `json:"loads"`
	}
	if err := json.Unmarshal([]byte(get(t, base+"/loads")), &loads); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range loads {
		for _, l := range p.Loads {
			n += l.ActiveRequests
		}
	}
	return n
}

// The config file's client-certificate rules are reloaded with it (SIGHUP):
// a rule that goes takes its certificates' scopes with it; a broken file
// changes nothing.
func TestClientCertificateRulesReload(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testpki.NewCA(t, "server CA"), testpki.NewCA(t, "client CA")
	certDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	testpki.WriteCertDir(t, certDir, serverCA.ServerCert(t))
	caFile := filepath.Join(dir, "ca.pem")
	clientCA.WritePEM(t, caFile)
	config := filepath.Join(dir, "kvselect.yaml")
	write := func(body string) { writeAtomically(t, config, body) }
	write("auth:\n  client_certificates:\n    - ou: team-a\n      scopes: [read]\n")
	reload := make(chan struct{})
	b := runInBackground(t, withoutKVEvents, []string{"--tls-cert-path", certDir, "--tls-client-ca", caFile, "--config", config,
		"--extproc-port", "0"}, WithReload(reload))
	client := func(ou string) *http.Client {
		cert := clientCA.Issue(t, testpki.Leaf{CommonName: ou, OUs: []string{ou}, Client: true})
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: serverCA.Pool(),
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	a, bb := client("team-a"), client("team-b")
	status := func(c *http.Client) int {
		t.Helper()
		res, err := c.Get("https://" + b.addrs.REST.String() + "/workers")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if sa, sb := status(a), status(bb); sa != http.StatusOK || sb != http.StatusUnauthorized {
		t.Fatalf("before the reload: team-a %d, team-b %d", sa, sb)
	}
	write("auth:\n  client_certificates:\n    - ou: team-b\n      scopes: [read]\n")
	reload <- struct{}{}
	proctest.Eventually(t, "team-b's rule in force", 20*time.Second, func() bool { return status(bb) == http.StatusOK })
	if sa := status(a); sa != http.StatusUnauthorized {
		t.Fatalf("after the reload team-a's certificate still gets %d", sa)
	}
	write("auth:\n  client_certificates:\n    - ou: team-c\n      scopes: [superuser]\n")
	reload <- struct{}{}
	proctest.Eventually(t, "the broken file's reload failure logged", 20*time.Second, func() bool {
		return strings.Contains(b.logs.String(), `unknown scope \"superuser\"`)
	})
	if sb := status(bb); sb != http.StatusOK {
		t.Fatalf("a broken file changed the rules: team-b %d", sb)
	}
}
