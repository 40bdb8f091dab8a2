package access

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Chain is the Authorizer of the REST API: a verified client certificate
// first, then the bearer token — looked up in the token file, then, if it is
// not there, handed to the TokenChecker. A request whose certificate and token
// both identify it is granted when either grants the scope.
type Chain struct {
	tokens  *TokenFile   // nil: no token file
	checker TokenChecker // nil: tokens outside the file are invalid
	certs   atomic.Pointer[CertRules]

	decisions *prometheus.CounterVec
	// counters holds decisions' children by method and result, resolved
	// once: WithLabelValues hashes its labels at every call.
	counters [len(methods)][3]prometheus.Counter
}

// methods are the decisions' method labels; results its result labels.
var (
	methods = [...]string{"none", "token", "kubernetes", "client-certificate"}
	results = [...]string{"allowed", "unauthenticated", "forbidden"}
)

// NewChain returns an Authorizer over the given sources; any may be nil.
func NewChain(tokens *TokenFile, checker TokenChecker, certs *CertRules) *Chain {
	c := &Chain{tokens: tokens, checker: checker,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_auth_decisions_total",
			Help: "REST authorization decisions, by how the client was identified (token, kubernetes, client-certificate, none) and the result (allowed, unauthenticated, forbidden).",
		}, []string{"method", "result"}),
	}
	c.certs.Store(certs)
	for i, m := range methods {
		for j, r := range results {
			c.counters[i][j] = c.decisions.WithLabelValues(m, r)
		}
	}
	return c
}

// SetCertRules replaces the client-certificate rules (a configuration
// reload); nil removes them.
func (c *Chain) SetCertRules(r *CertRules) { c.certs.Store(r) }

// Authorize implements Authorizer.
func (c *Chain) Authorize(ctx context.Context, r *http.Request, need Scope) (Identity, error) {
	id, err := c.authorize(ctx, r, need)
	result := 0 // allowed
	switch {
	case errors.Is(err, ErrForbidden):
		result = 2
	case err != nil:
		result = 1
	}
	method := 0 // none
	for i, m := range methods {
		if id.Method == m {
			method = i
		}
	}
	c.counters[method][result].Inc()
	return id, err
}

func (c *Chain) authorize(ctx context.Context, r *http.Request, need Scope) (Identity, error) {
	var forbidden *Denied
	if leaf := verifiedClientCert(r); leaf != nil {
		if rules := c.certs.Load(); rules != nil {
			if id, scopes, ok := rules.Match(leaf); ok {
				if scopes.Has(need) {
					return id, nil
				}
				forbidden = &Denied{Err: ErrForbidden, Need: need, Identity: id}
			}
		}
	}
	token, present, err := BearerToken(r.Header)
	switch {
	case err != nil:
		return Identity{}, &Denied{Err: ErrInvalidCredentials, Need: need, Reason: err.Error()}
	case !present && forbidden != nil:
		return forbidden.Identity, forbidden
	case !present:
		return Identity{}, &Denied{Err: ErrNoCredentials, Need: need}
	}
	if c.tokens != nil {
		if id, scopes, found, reason := c.tokens.Lookup(token); found {
			if reason != "" {
				return Identity{}, &Denied{Err: ErrInvalidCredentials, Need: need, Reason: reason}
			}
			if scopes.Has(need) {
				return id, nil
			}
			return id, &Denied{Err: ErrForbidden, Need: need, Identity: id}
		}
	}
	if c.checker != nil {
		id, err := c.checker.CheckToken(ctx, token, need)
		if err == nil {
			return id, nil
		}
		var d *Denied
		if !errors.As(err, &d) {
			d = &Denied{Err: ErrInvalidCredentials, Need: need, Identity: id, Reason: err.Error()}
			if errors.Is(err, ErrForbidden) {
				d.Err = ErrForbidden
			}
		}
		return d.Identity, d
	}
	return Identity{}, &Denied{Err: ErrInvalidCredentials, Need: need, Reason: "unknown token"}
}

// verifiedClientCert is the client's leaf certificate if the TLS layer
// verified it against the client CA; an unverified certificate (the server
// asks for one but does not require it) identifies nobody.
func verifiedClientCert(r *http.Request) *x509.Certificate {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	return r.TLS.VerifiedChains[0][0]
}

// maxTokenBytes bounds a bearer token; Kubernetes' projected ServiceAccount
// tokens are around 1 KB.
const maxTokenBytes = 8 << 10

// BearerToken reads the Authorization header: present is false when there is
// none; a header of another scheme, several Authorization headers, or a token
// outside RFC 6750's b64token syntax is an error.
func BearerToken(h http.Header) (token string, present bool, err error) {
	vals := h.Values("Authorization")
	switch len(vals) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, errors.New("more than one Authorization header")
	}
	scheme, rest, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", true, errors.New(`the Authorization header must be "Bearer <token>"`)
	}
	token = strings.TrimLeft(rest, " ")
	if err := checkTokenSyntax(token); err != nil {
		return "", true, err
	}
	return token, true, nil
}

// checkTokenSyntax enforces RFC 6750's b64token: 1*( ALPHA / DIGIT / "-" /
// "." / "_" / "~" / "+" / "/" ) *"=".
func checkTokenSyntax(token string) error {
	if token == "" {
		return errors.New("empty bearer token")
	}
	if len(token) > maxTokenBytes {
		return errors.New("bearer token longer than 8 KiB")
	}
	body := strings.TrimRight(token, "=")
	if body == "" {
		return errors.New("bearer token is only padding")
	}
	for i := 0; i < len(body); i++ {
		switch ch := body[i]; {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9':
		case ch == '-', ch == '.', ch == '_', ch == '~', ch == '+', ch == '/':
		default:
			return errors.New("bearer token has a character outside RFC 6750's token syntax")
		}
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *Chain) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	if c.tokens != nil {
		c.tokens.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Chain) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	if c.tokens != nil {
		c.tokens.Collect(ch)
	}
}
