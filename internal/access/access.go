// Package access decides who may call kvselect's REST API: it turns a
// request's credentials — a bearer token, a verified TLS client certificate —
// into an identity and the scopes it holds, and says whether those scopes
// cover what the route needs.
//
// Dynamo's selection service has no authentication and must sit on a trusted
// network; anyone who reaches it can register a worker that points at their own
// server and so receive other tenants' prompts. kvselect's REST front asks an
// Authorizer before it runs a route. Three sources of identity exist:
//
//   - a token file (TokenFile): one "token scope[,scope]" line per client,
//     re-read when it changes, only the tokens' SHA-256 digests kept in memory;
//   - Kubernetes (a TokenChecker, see internal/access/kubeauth): a
//     ServiceAccount token checked with a TokenReview, its scope with a
//     SubjectAccessReview, as GIE's endpoint picker guards /metrics;
//   - mTLS (CertRules): a client certificate the TLS layer verified, mapped to
//     scopes by its subject alternative names, organizational units or common
//     name.
//
// The scopes are coarse on purpose, one per kind of harm: read (GET routes,
// /metrics, /dump: what the service knows), select (selections and the
// reservation lifecycle: load bookings), admin (the worker catalog, replica
// peers, pprof: where prompts go).
package access

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Scope is one permission of the REST API.
type Scope uint8

// The scopes. Each route needs exactly one; none implies another.
const (
	Read   Scope = 1 << iota // GET routes, POST /potential_loads and /overlap_scores, /metrics, /dump
	Select                   // /select, /select_and_reserve, /reservations/...
	Admin                    // /workers mutations and health reports, /replica_sync/*, /debug/pprof
)

// String is the scope's name as the token file spells it.
func (s Scope) String() string {
	switch s {
	case Read:
		return "read"
	case Select:
		return "select"
	case Admin:
		return "admin"
	}
	return fmt.Sprintf("scope(%d)", uint8(s))
}

// Scopes is a set of scopes.
type Scopes uint8

// Has reports whether the set holds s.
func (s Scopes) Has(need Scope) bool { return s&Scopes(need) != 0 }

// String lists the set as the token file spells it ("read,select").
func (s Scopes) String() string {
	var names []string
	for _, sc := range allScopes {
		if s.Has(sc) {
			names = append(names, sc.String())
		}
	}
	return strings.Join(names, ",")
}

var allScopes = [...]Scope{Read, Select, Admin}

// ParseScope reads one scope name.
func ParseScope(name string) (Scope, error) {
	for _, sc := range allScopes {
		if name == sc.String() {
			return sc, nil
		}
	}
	return 0, fmt.Errorf("unknown scope %q (want read, select or admin)", name)
}

// ParseScopes reads a comma-separated list of scope names; it must name at
// least one.
func ParseScopes(list string) (Scopes, error) {
	var set Scopes
	for name := range strings.SplitSeq(list, ",") {
		sc, err := ParseScope(strings.TrimSpace(name))
		if err != nil {
			return 0, err
		}
		set |= Scopes(sc)
	}
	return set, nil
}

// Identity is who a request's credentials say it comes from, for logs and
// errors. It never holds the secret itself.
type Identity struct {
	// Method is how it was established: "token", "kubernetes" or
	// "client-certificate".
	Method string
	// Subject names the client: the token's name= (or its digest's first
	// bytes), the Kubernetes user name, the certificate's subject.
	Subject string
}

func (id Identity) String() string { return id.Method + " " + id.Subject }

// The outcomes of Authorize other than success. The REST front answers the
// first two 401 and the last 403, each with a WWW-Authenticate challenge
// (RFC 6750 section 3).
var (
	// ErrNoCredentials: the request carries neither a bearer token nor a
	// verified client certificate that any rule knows.
	ErrNoCredentials = errors.New("authentication required")
	// ErrInvalidCredentials: a bearer token that is malformed, unknown,
	// expired or rejected by Kubernetes.
	ErrInvalidCredentials = errors.New("invalid credentials")
	// ErrForbidden: the client is known but lacks the scope.
	ErrForbidden = errors.New("insufficient scope")
)

// Denied is the error Authorize returns: one of the three sentinels (errors.Is
// finds it), the scope that was needed, and, when known, who asked.
type Denied struct {
	Err      error // ErrNoCredentials, ErrInvalidCredentials or ErrForbidden
	Need     Scope
	Identity Identity // zero unless the client was identified
	Reason   string   // for the error message, never a secret
}

func (d *Denied) Error() string {
	msg := d.Err.Error()
	if d.Err == ErrForbidden {
		msg = fmt.Sprintf("%s: %s lacks scope %q", msg, d.Identity, d.Need)
	}
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	return msg
}

func (d *Denied) Unwrap() error { return d.Err }

// Authorizer says whether a request may run a route that needs a scope.
type Authorizer interface {
	// Authorize returns the caller's identity when its credentials grant
	// need, else a *Denied. It must be safe for concurrent use.
	Authorize(ctx context.Context, r *http.Request, need Scope) (Identity, error)
}

// TokenChecker decides on a bearer token the token file does not hold, e.g.
// a Kubernetes ServiceAccount token. It returns ErrInvalidCredentials when
// the token is not one it accepts (or it cannot tell), ErrForbidden (wrapped,
// with the identity) when it is but lacks the scope.
type TokenChecker interface {
	CheckToken(ctx context.Context, token string, need Scope) (Identity, error)
}
