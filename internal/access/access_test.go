package access

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvselect/kvselect/internal/testpki"
)

const (
	readToken   = "read-token-0123456789abcdef"
	selectToken = "select-token-0123456789abcdef"
	adminToken  = "admin-token-0123456789abcdef"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		name, file string
		want       int    // entries
		err        string // substring; "" = valid
	}{
		{"empty", "", 0, ""},
		{"comments and blanks", "# tokens\n\n   \n# more\n", 0, ""},
		{"one", readToken + " read\n", 1, ""},
		{"scopes and options", readToken + " read,select name=ray expires=2030-01-01T00:00:00Z\n" + adminToken + "\tadmin\n", 2, ""},
		{"no scope", readToken + "\n", 0, "line 1: want"},
		{"unknown scope", "# c\n" + readToken + " write\n", 0, `line 2: unknown scope "write"`},
		{"empty scope in list", readToken + " read,\n", 0, `unknown scope ""`},
		{"short token", "abc read\n", 0, "shorter than 16"},
		{"bad character", "tok\"en-0123456789abcdef read\n", 0, "outside RFC 6750"},
		{"duplicate", readToken + " read\n" + readToken + " admin\n", 0, "line 2: the same token as line 1"},
		{"bad expires", readToken + " read expires=tomorrow\n", 0, "expires:"},
		{"unknown option", readToken + " read color=blue\n", 0, "unknown or repeated option"},
		{"repeated option", readToken + " read name=a name=b\n", 0, "unknown or repeated option"},
		{"bare option", readToken + " read name=\n", 0, "want name="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTokens([]byte(tt.file))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want {
				t.Fatalf("%d entries, want %d", len(got), tt.want)
			}
		})
	}
}

func TestParseTokensKeepsNoSecret(t *testing.T) {
	got, err := ParseTokens([]byte(adminToken + " admin\n"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got[0].name, adminToken[:8]) {
		t.Fatalf("the default name %q shows the token", got[0].name)
	}
	if !strings.HasPrefix(got[0].name, "sha256:") {
		t.Fatalf("default name %q, want a digest prefix", got[0].name)
	}
}

func TestBearerToken(t *testing.T) {
	tests := []struct {
		name    string
		values  []string
		token   string
		present bool
		err     string
	}{
		{"none", nil, "", false, ""},
		{"bearer", []string{"Bearer " + readToken}, readToken, true, ""},
		{"scheme case-insensitive", []string{"bearer " + readToken}, readToken, true, ""},
		{"padding", []string{"Bearer abc=="}, "abc==", true, ""},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, "", true, "must be"},
		{"no token", []string{"Bearer"}, "", true, "must be"},
		{"empty token", []string{"Bearer "}, "", true, "empty"},
		{"space inside", []string{"Bearer ab cd"}, "", true, "outside RFC 6750"},
		{"only padding", []string{"Bearer =="}, "", true, "only padding"},
		{"two headers", []string{"Bearer a", "Bearer b"}, "", true, "more than one"},
		{"huge", []string{"Bearer " + strings.Repeat("a", maxTokenBytes+1)}, "", true, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Authorization", v)
			}
			tok, present, err := BearerToken(h)
			if present != tt.present {
				t.Fatalf("present = %v, want %v", present, tt.present)
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || tok != tt.token {
				t.Fatalf("= %q, %v; want %q", tok, err, tt.token)
			}
		})
	}
}

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestTokenFileReloadsAndKeepsTheLastGoodVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, path, readToken+" read name=reader\n")
	clk := &clock{time.Unix(1_000_000, 0)}
	f, err := OpenTokenFile(path, nil, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(tok string) (Scopes, bool) {
		_, sc, found, _ := f.Lookup(tok)
		return sc, found
	}
	if sc, ok := lookup(readToken); !ok || sc != Scopes(Read) {
		t.Fatalf("reader: %v %v", sc, ok)
	}
	if _, ok := lookup(adminToken); ok {
		t.Fatal("admin token found before it was added")
	}

	// Rotation: the reader's token goes, the admin's comes. A new size is a
	// change whatever the file system's time resolution.
	writeFile(t, path, adminToken+" admin,read name=operator\n")
	if _, ok := lookup(readToken); !ok {
		t.Fatal("the file was re-read before the check interval ended")
	}
	clk.t = clk.t.Add(tokenFileCheckEvery)
	if _, ok := lookup(readToken); ok {
		t.Fatal("a rotated-out token still works")
	}
	if sc, ok := lookup(adminToken); !ok || !sc.Has(Admin) || !sc.Has(Read) || sc.Has(Select) {
		t.Fatalf("operator: %v %v", sc, ok)
	}

	// A broken version is counted once and changes nothing.
	writeFile(t, path, adminToken+" admin\nbroken line with a bad scope\n")
	for range 3 {
		clk.t = clk.t.Add(tokenFileCheckEvery)
		if _, ok := lookup(adminToken); !ok {
			t.Fatal("a broken file replaced the good one")
		}
	}
	if got := value(t, f.reloadErrors); got != 1 {
		t.Fatalf("reload errors = %v, want 1", got)
	}
	// So is a file that disappears.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(tokenFileCheckEvery)
	if _, ok := lookup(adminToken); !ok {
		t.Fatal("a missing file dropped the tokens")
	}
	if got := value(t, f.reloadErrors); got != 2 {
		t.Fatalf("reload errors = %v, want 2", got)
	}
	if got := value(t, f.reloads); got != 1 {
		t.Fatalf("reloads = %v, want 1", got)
	}
}

func TestTokenFileExpiry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, path, readToken+" read name=temp expires=2026-01-01T00:00:00Z\n")
	clk := &clock{time.Date(2025, 12, 31, 23, 59, 59, 0, time.UTC)}
	f, err := OpenTokenFile(path, nil, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	if _, sc, found, invalid := f.Lookup(readToken); !found || invalid != "" || !sc.Has(Read) {
		t.Fatalf("before expiry: %v %v %q", sc, found, invalid)
	}
	clk.t = clk.t.Add(time.Second)
	if _, _, found, invalid := f.Lookup(readToken); !found || !strings.Contains(invalid, "temp expired") {
		t.Fatalf("at expiry: found=%v invalid=%q", found, invalid)
	}
}

func TestOpenTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenTokenFile(filepath.Join(dir, "missing"), nil, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	writeFile(t, bad, "short read\n")
	if _, err := OpenTokenFile(bad, nil, nil); err == nil || !strings.Contains(err.Error(), bad+": line 1") {
		t.Fatalf("bad file: %v", err)
	}
}

// checkerFunc is a TokenChecker of a test.
type checkerFunc func(token string, need Scope) (Identity, error)

func (f checkerFunc) CheckToken(_ context.Context, token string, need Scope) (Identity, error) {
	return f(token, need)
}

func TestChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeFile(t, path, readToken+" read name=reader\n"+selectToken+" select name=selector\n"+adminToken+" admin,read name=admin\n")
	tokens, err := OpenTokenFile(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const kubeToken = "kube-token-0123456789abcdef"
	kube := checkerFunc(func(token string, need Scope) (Identity, error) {
		id := Identity{Method: "kubernetes", Subject: "system:serviceaccount:ns:ray"}
		switch {
		case token != kubeToken:
			return Identity{}, &Denied{Err: ErrInvalidCredentials, Need: need, Reason: "token review: not authenticated"}
		case need == Select:
			return id, nil
		}
		return id, &Denied{Err: ErrForbidden, Need: need, Identity: id}
	})
	ca := testpki.NewCA(t, "clients")
	rules, err := NewCertRules([]CertRule{{OU: "operators", Scopes: []string{"admin"}}, {SAN: "spiffe://test/ray", Scopes: []string{"select"}}})
	if err != nil {
		t.Fatal(err)
	}
	chain := NewChain(tokens, kube, rules)
	operator := ca.Issue(t, testpki.Leaf{CommonName: "alice", OUs: []string{"operators"}, Client: true}).Leaf
	ray := ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://test/ray"}, Client: true}).Leaf
	stranger := ca.Issue(t, testpki.Leaf{CommonName: "bob", Client: true}).Leaf

	tests := []struct {
		name   string
		auth   string            // Authorization header
		cert   *x509.Certificate // verified client certificate
		need   Scope
		want   error // nil, or the sentinel
		method string
	}{
		{"nothing", "", nil, Read, ErrNoCredentials, "none"},
		{"reader reads", "Bearer " + readToken, nil, Read, nil, "token"},
		{"reader cannot select", "Bearer " + readToken, nil, Select, ErrForbidden, "token"},
		{"admin administers", "Bearer " + adminToken, nil, Admin, nil, "token"},
		{"admin cannot select", "Bearer " + adminToken, nil, Select, ErrForbidden, "token"},
		{"unknown token goes to kubernetes and fails", "Bearer unknown-token-0123456789", nil, Read, ErrInvalidCredentials, "none"},
		{"kubernetes token selects", "Bearer " + kubeToken, nil, Select, nil, "kubernetes"},
		{"kubernetes token cannot read", "Bearer " + kubeToken, nil, Read, ErrForbidden, "kubernetes"},
		{"malformed header", "Basic Zm9vOmJhcg==", nil, Read, ErrInvalidCredentials, "none"},
		{"operator certificate", "", operator, Admin, nil, "client-certificate"},
		{"operator certificate cannot select", "", operator, Select, ErrForbidden, "client-certificate"},
		{"operator certificate and a select token", "Bearer " + selectToken, operator, Select, nil, "token"},
		{"spiffe certificate selects", "", ray, Select, nil, "client-certificate"},
		{"unmapped certificate is nobody", "", stranger, Read, ErrNoCredentials, "none"},
		{"unmapped certificate with a token", "Bearer " + readToken, stranger, Read, nil, "token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/x", nil)
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			if tt.cert != nil {
				r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{tt.cert, ca.Cert}}}
			}
			before := value(t, chain.decisions.WithLabelValues(tt.method, resultOf(tt.want)))
			id, err := chain.Authorize(context.Background(), r, tt.need)
			switch {
			case tt.want == nil && err != nil:
				t.Fatalf("denied: %v", err)
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if err != nil {
				var d *Denied
				if !errors.As(err, &d) || d.Need != tt.need {
					t.Fatalf("err %#v is not a *Denied for %v", err, tt.need)
				}
				for _, secret := range []string{readToken, selectToken, adminToken, kubeToken} {
					if strings.Contains(err.Error(), secret) {
						t.Fatalf("the error shows a token: %v", err)
					}
				}
			}
			if tt.want == nil && id.Method != tt.method {
				t.Fatalf("identity %v, want method %s", id, tt.method)
			}
			if after := value(t, chain.decisions.WithLabelValues(tt.method, resultOf(tt.want))); after != before+1 {
				t.Fatalf("decisions{%s,%s} went %v → %v", tt.method, resultOf(tt.want), before, after)
			}
		})
	}
}

func resultOf(err error) string {
	switch {
	case err == nil:
		return "allowed"
	case errors.Is(err, ErrForbidden):
		return "forbidden"
	}
	return "unauthenticated"
}

func TestNewCertRulesErrors(t *testing.T) {
	tests := []struct {
		rule CertRule
		err  string
	}{
		{CertRule{Scopes: []string{"read"}}, "exactly one of san, ou and cn"},
		{CertRule{SAN: "a", OU: "b", Scopes: []string{"read"}}, "exactly one"},
		{CertRule{CN: "a"}, "name at least one"},
		{CertRule{CN: "a", Scopes: []string{"root"}}, `unknown scope "root"`},
	}
	for _, tt := range tests {
		if _, err := NewCertRules([]CertRule{{CN: "ok", Scopes: []string{"read"}}, tt.rule}); err == nil || !strings.Contains(err.Error(), "client_certificates[1]") || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%+v: err = %v, want %q", tt.rule, err, tt.err)
		}
	}
}

// value reads one counter.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// BenchmarkChainAuthorize is the cost a bearer token adds to each REST
// request: parse the header, hash the token, compare it with every entry of a
// 16-token file, count the decision.
func BenchmarkChainAuthorize(b *testing.B) {
	path := filepath.Join(b.TempDir(), "tokens")
	var lines strings.Builder
	lines.WriteString(selectToken + " select name=bench\n")
	for i := range 15 {
		fmt.Fprintf(&lines, "other-token-%04d-0123456789 read\n", i)
	}
	if err := os.WriteFile(path, []byte(lines.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	tokens, err := OpenTokenFile(path, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	chain := NewChain(tokens, nil, nil)
	r := httptest.NewRequest("POST", "/select_and_reserve", nil)
	r.Header.Set("Authorization", "Bearer "+selectToken)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := chain.Authorize(ctx, r, Select); err != nil {
			b.Fatal(err)
		}
	}
}
