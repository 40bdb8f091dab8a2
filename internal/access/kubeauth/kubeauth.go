// Package kubeauth is the access.TokenChecker for Kubernetes ServiceAccount
// tokens: a bearer token the token file does not hold is sent to the API
// server in a TokenReview (authentication.k8s.io/v1), and the user it names
// is checked for the scope in a SubjectAccessReview (authorization.k8s.io/v1).
// Who may do what is then ordinary RBAC, managed with the cluster's tools,
// audited by the API server, and revoked by deleting a binding or the
// ServiceAccount.
//
// # Granting a scope
//
// A scope is the RBAC verb "use" on the resource "scopes" of the API group
// "kvselect.io", named like the scope ("read", "select", "admin"), in the
// namespace kvselect runs in (Config.Namespace). No CustomResourceDefinition
// exists or is needed: RBAC authorizes any group, resource, name and verb it
// is asked about, and nothing is ever stored. A client that may select:
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: Role
//	metadata:
//	  name: kvselect-select
//	  namespace: llm          # kvselect's namespace
//	rules:
//	- apiGroups: ["kvselect.io"]
//	  resources: ["scopes"]
//	  resourceNames: ["select"] # or "read", "admin"; several grant several
//	  verbs: ["use"]
//	---
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: RoleBinding
//	metadata:
//	  name: gateway-may-select
//	  namespace: llm
//	subjects:
//	- kind: ServiceAccount
//	  name: gateway
//	  namespace: gateway-system # the client's own namespace
//	roleRef:
//	  apiGroup: rbac.authorization.k8s.io
//	  kind: Role
//	  name: kvselect-select
//
// The client sends its ServiceAccount token as "Authorization: Bearer
// <token>", preferably a projected token whose audience is one of
// Config.Audiences, so a token stolen from kvselect's side is of no use
// against the API server or other services, and the other way round.
//
// Why a resource rule and not a nonResourceURLs rule (as the kube-rbac-proxy
// convention for /metrics has it): non-resource URLs are cluster-wide — only
// a ClusterRole bound by a ClusterRoleBinding grants them — so granting a
// client access to one kvselect would need cluster-admin rights and would
// grant it on every kvselect in the cluster. A resource rule is namespaced:
// the namespace's owner grants scopes with a Role and RoleBinding in
// kvselect's namespace, two kvselect deployments in two namespaces have
// separate grants, and resourceNames lists exactly the scopes granted, with
// no URL prefix matching to reason about. (A ClusterRole bound by a
// ClusterRoleBinding still grants a scope in every namespace, and a rule with
// wildcards — cluster-admin, or a Role allowing "*" on "*" — grants all three:
// subjects that can rewrite kvselect's Deployment anyway.)
//
// # What kvselect itself needs
//
// Creating TokenReviews and SubjectAccessReviews. They are cluster-scoped
// resources, so it takes a ClusterRoleBinding, to the built-in ClusterRole
// system:auth-delegator, whose rules are exactly these:
//
//	rules:
//	- apiGroups: ["authentication.k8s.io"]
//	  resources: ["tokenreviews"]
//	  verbs: ["create"]
//	- apiGroups: ["authorization.k8s.io"]
//	  resources: ["subjectaccessreviews"]
//	  verbs: ["create"]
//	---
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: ClusterRoleBinding
//	metadata:
//	  name: kvselect-auth-delegator # one per kvselect namespace
//	subjects:
//	- kind: ServiceAccount
//	  name: kvselect
//	  namespace: llm
//	roleRef:
//	  apiGroup: rbac.authorization.k8s.io
//	  kind: ClusterRole
//	  name: system:auth-delegator
//
// Both are questions, not powers: creating them stores and changes nothing.
// They do let kvselect learn who a token belongs to and what any user may
// do, which is what the built-in role is for: servers that delegate their
// authentication and authorization to the API server.
//
// # Caching
//
// Every request with a Kubernetes token would otherwise cost two API calls.
// Outcomes are cached under the SHA-256 digest of the token (the token
// itself is never kept): the TokenReview's user, and per scope the
// SubjectAccessReview's decision. Allowed outcomes live Config.CacheTTL
// (30 s), denied ones NegativeCacheTTL (5 s: a client whose binding was just
// created should not wait long), none beyond the token's own expiry (its
// JWT exp claim, read once the API server has accepted it). So a revoked
// grant keeps working for at most CacheTTL, and a deleted ServiceAccount's
// token for at most CacheTTL plus the API server's own cache of successful
// token authentications (10 s in kube-apiserver). Concurrent requests with
// the same token share one review instead of stampeding the API server, and
// the cache holds at most MaxCacheEntries tokens, the least recently used
// evicted first. The client's QPS and Burst (client-go defaults: 5 and 10)
// bound the reviews per second, which also caps what a flood of made-up
// tokens can cost the API server.
//
// When the API server cannot be asked (unreachable, timeout, 5xx, kvselect
// lacking the RBAC above) the request is refused as unauthenticated — never
// allowed — the failure is logged (at most every 10 s) and counted, and
// nothing is cached, so the next request asks again.
package kubeauth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvselect/kvselect/internal/access"
)

// The resource attributes of the SubjectAccessReview for a scope: the verb
// Verb on Resource of Group, named by the scope (access.Scope.String).
const (
	Group    = "kvselect.io"
	Resource = "scopes"
	Verb     = "use"
)

// Method is the access.Identity method of the identities this package makes.
const Method = "kubernetes"

// Defaults of Config.
const (
	DefaultCacheTTL         = 30 * time.Second
	DefaultNegativeCacheTTL = 5 * time.Second
	DefaultMaxCacheEntries  = 10000
)

// reviewTimeout bounds one TokenReview or SubjectAccessReview. The review
// runs detached from the request that started it (others may be waiting on
// it), so it needs a bound of its own.
const reviewTimeout = 10 * time.Second

// logEvery bounds how often review failures are logged: an API server outage
// fails every request, and one line per request would bury everything else.
const logEvery = 10 * time.Second

// Config configures a Checker.
type Config struct {
	// Client talks to the API server as kvselect's ServiceAccount, which
	// needs system:auth-delegator (see the package documentation). Required.
	Client kubernetes.Interface
	// Namespace is where scopes are granted: the namespace of the
	// SubjectAccessReview, normally kvselect's own. Required: with none,
	// only ClusterRoleBindings would grant, and RoleBindings would silently
	// do nothing.
	Namespace string
	// Audiences, when set, are the TokenReview's spec.audiences: only tokens
	// issued for one of them are accepted.
	Audiences []string
	// CacheTTL is how long an allowed outcome is reused; zero is
	// DefaultCacheTTL, negative disables the cache (every request asks the
	// API server; concurrent identical ones still share a review).
	CacheTTL time.Duration
	// NegativeCacheTTL is how long a denied or invalid outcome is reused;
	// zero is DefaultNegativeCacheTTL (capped at CacheTTL), negative caches
	// no denial.
	NegativeCacheTTL time.Duration
	// MaxCacheEntries bounds the tokens cached; zero is
	// DefaultMaxCacheEntries.
	MaxCacheEntries int
	// Now is the clock of the cache; nil is time.Now.
	Now func() time.Time
	// Logger receives review failures; nil discards them.
	Logger *slog.Logger
}

// Checker is an access.TokenChecker backed by the Kubernetes API server. It
// is a prometheus.Collector of its review and cache counters. Safe for
// concurrent use.
type Checker struct {
	client    kubernetes.Interface
	namespace string
	audiences []string
	ttl, nttl time.Duration
	max       int
	now       func() time.Time
	log       *slog.Logger

	mu      sync.Mutex
	entries map[digest]*entry
	lru     list.List // of *entry, least recently used first

	authn flights[digest, *entry]
	authz flights[scopeKey, decision]

	logMu      sync.Mutex
	lastLog    time.Time
	suppressed int

	reviews   *prometheus.CounterVec
	cacheHits prometheus.Counter
}

var _ access.TokenChecker = (*Checker)(nil)

type digest = [sha256.Size]byte

type scopeKey struct {
	token digest
	scope access.Scope
}

// entry is what is known about one token: its TokenReview outcome and,
// authenticated, the SubjectAccessReview outcome per scope. A new
// TokenReview replaces the entry, and with it the scope decisions made for
// the previous user information.
type entry struct {
	key   digest
	elem  *list.Element // nil: not (or no longer) in the cache
	until time.Time     // the TokenReview outcome expires
	user  *authenticationv1.UserInfo
	// reason is why the token is invalid (user == nil); never the token.
	reason string
	scopes [3]decision // by scopeIndex
}

// decision is a SubjectAccessReview outcome.
type decision struct {
	until   time.Time // zero: none cached
	allowed bool
}

// New returns a Checker for cfg.
func New(cfg Config) (*Checker, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubeauth: no Kubernetes client")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubeauth: no namespace to check scopes in")
	}
	for _, a := range cfg.Audiences {
		if a == "" {
			return nil, errors.New("kubeauth: an empty audience")
		}
	}
	if cfg.MaxCacheEntries < 0 {
		return nil, fmt.Errorf("kubeauth: MaxCacheEntries %d is negative", cfg.MaxCacheEntries)
	}
	c := &Checker{
		client:    cfg.Client,
		namespace: cfg.Namespace,
		audiences: slices.Clone(cfg.Audiences),
		ttl:       cfg.CacheTTL,
		nttl:      cfg.NegativeCacheTTL,
		max:       cfg.MaxCacheEntries,
		now:       cfg.Now,
		log:       cfg.Logger,
		entries:   make(map[digest]*entry),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvselect_auth_kubernetes_reviews_total",
			Help: "Reviews kvselect asked the Kubernetes API server for, by kind (token: TokenReview, access: SubjectAccessReview) and result (allowed, denied, error: the API server could not be asked).",
		}, []string{"kind", "result"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvselect_auth_kubernetes_cache_hits_total",
			Help: "Kubernetes token checks answered from the cache without asking the API server.",
		}),
	}
	if c.ttl == 0 {
		c.ttl = DefaultCacheTTL
	}
	if c.nttl == 0 {
		c.nttl = min(DefaultNegativeCacheTTL, max(c.ttl, 0))
	}
	if c.max == 0 {
		c.max = DefaultMaxCacheEntries
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.authn.m = make(map[digest]*call[*entry])
	c.authz.m = make(map[scopeKey]*call[decision])
	// All series from the start, so a rate() sees the first review.
	for _, kind := range []string{"token", "access"} {
		for _, result := range []string{"allowed", "denied", "error"} {
			c.reviews.WithLabelValues(kind, result)
		}
	}
	return c, nil
}

func scopeIndex(s access.Scope) (int, bool) {
	switch s {
	case access.Read:
		return 0, true
	case access.Select:
		return 1, true
	case access.Admin:
		return 2, true
	}
	return 0, false
}

// CheckToken implements access.TokenChecker.
func (c *Checker) CheckToken(ctx context.Context, token string, need access.Scope) (access.Identity, error) {
	idx, ok := scopeIndex(need)
	if !ok {
		return access.Identity{}, &access.Denied{Err: access.ErrInvalidCredentials, Need: need,
			Reason: fmt.Sprintf("kubeauth: unknown scope %v", need)}
	}
	key := sha256.Sum256([]byte(token))

	now := c.now()
	c.mu.Lock()
	e := c.lookupLocked(key, now)
	if e != nil {
		if e.user == nil {
			c.mu.Unlock()
			c.cacheHits.Inc()
			return access.Identity{}, invalid(need, e.reason)
		}
		if d := e.scopes[idx]; now.Before(d.until) {
			c.mu.Unlock()
			c.cacheHits.Inc()
			return verdict(e, need, d.allowed)
		}
	}
	c.mu.Unlock()

	if e == nil {
		var err error
		e, err = c.authn.do(ctx, key, func(rctx context.Context) (*entry, error) {
			return c.reviewToken(rctx, key, token)
		})
		if err != nil {
			return access.Identity{}, failed(need, access.Identity{}, "token", err)
		}
		if e.user == nil {
			return access.Identity{}, invalid(need, e.reason)
		}
	}
	d, err := c.authz.do(ctx, scopeKey{key, need}, func(rctx context.Context) (decision, error) {
		return c.reviewAccess(rctx, e, idx, need)
	})
	if err != nil {
		return identity(e), failed(need, identity(e), "access", err)
	}
	return verdict(e, need, d.allowed)
}

func identity(e *entry) access.Identity {
	return access.Identity{Method: Method, Subject: e.user.Username}
}

func verdict(e *entry, need access.Scope, allowed bool) (access.Identity, error) {
	id := identity(e)
	if allowed {
		return id, nil
	}
	return id, &access.Denied{Err: access.ErrForbidden, Need: need, Identity: id}
}

func invalid(need access.Scope, reason string) error {
	return &access.Denied{Err: access.ErrInvalidCredentials, Need: need, Reason: reason}
}

// failed is the refusal when the API server could not be asked. Its reason
// says what kind of failure it was but not the error itself, which may name
// cluster addresses or kvselect's account; that goes to the log.
func failed(need access.Scope, id access.Identity, kind string, err error) error {
	what, resource := "token review", "tokenreviews"
	if kind == "access" {
		what, resource = "access review", "subjectaccessreviews"
	}
	var class string
	switch {
	case errors.Is(err, context.Canceled):
		class = "the request was canceled"
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		class = "the API server did not answer in time"
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		class = "kvselect may not create " + resource + " (it needs system:auth-delegator)"
	case apierrors.IsTooManyRequests(err):
		class = "the API server is overloaded"
	case apierrors.IsServiceUnavailable(err):
		class = "the API server is unavailable"
	default:
		var nerr net.Error
		if errors.As(err, &nerr) {
			class = "the API server is unreachable"
		} else {
			class = "the API server failed"
		}
	}
	return &access.Denied{Err: access.ErrInvalidCredentials, Need: need, Identity: id,
		Reason: "kubernetes " + what + " failed: " + class + "; try again"}
}

// lookupLocked returns key's entry if its TokenReview outcome is still
// fresh, marking it recently used; an expired one is dropped.
func (c *Checker) lookupLocked(key digest, now time.Time) *entry {
	e := c.entries[key]
	if e == nil {
		return nil
	}
	if !now.Before(e.until) {
		c.removeLocked(e)
		return nil
	}
	c.lru.MoveToBack(e.elem)
	return e
}

func (c *Checker) removeLocked(e *entry) {
	if e.elem == nil {
		return
	}
	c.lru.Remove(e.elem)
	e.elem = nil
	if c.entries[e.key] == e {
		delete(c.entries, e.key)
	}
}

// storeLocked caches e in place of any entry of the same token, evicting
// the least recently used entries beyond the bound. Most evicted entries
// are expired ones: an entry that is not used goes to the front.
func (c *Checker) storeLocked(e *entry) {
	if old := c.entries[e.key]; old != nil {
		c.removeLocked(old)
	}
	for len(c.entries) >= c.max {
		c.removeLocked(c.lru.Front().Value.(*entry))
	}
	c.entries[e.key] = e
	e.elem = c.lru.PushBack(e)
}

// ttlFor is how long an outcome is cached; zero or less: not at all.
func (c *Checker) ttlFor(allowed bool) time.Duration {
	if allowed {
		return c.ttl
	}
	return c.nttl
}

// reviewToken asks for a TokenReview and caches its outcome. err is set only
// when the API server could not be asked; a token it rejects is an entry
// with no user.
func (c *Checker) reviewToken(ctx context.Context, key digest, token string) (*entry, error) {
	tr, err := c.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: c.audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		c.reviews.WithLabelValues("token", "error").Inc()
		c.logFailure("token", err)
		return nil, err
	}
	now := c.now()
	e := &entry{key: key}
	st := tr.Status
	switch {
	case !st.Authenticated:
		e.reason = "kubernetes rejected the token"
		if st.Error != "" {
			e.reason += ": " + st.Error
		}
	case st.User.Username == "":
		e.reason = "kubernetes accepted the token but named no user"
	case len(c.audiences) > 0 && !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(c.audiences, a) }):
		// The API reference asks clients that set spec.audiences to check
		// that the status names one: an authenticator that ignores
		// audiences answers with none, and its yes would be for the API
		// server's own audience, not ours.
		e.reason = "kubernetes did not confirm the token's audience is " + strings.Join(c.audiences, " or ")
	default:
		user := st.User
		e.user = &user
	}
	allowed := e.user != nil
	c.reviews.WithLabelValues("token", result(allowed)).Inc()

	e.until = now.Add(c.ttlFor(allowed))
	if exp, ok := jwtExpiry(token); ok && allowed && exp.Before(e.until) {
		// Never vouch for a token past its expiry. The claim is only read
		// after the API server verified the token's signature.
		e.until = exp
	}
	if e.until.After(now) {
		c.mu.Lock()
		c.storeLocked(e)
		c.mu.Unlock()
	}
	return e, nil
}

// reviewAccess asks for the SubjectAccessReview of e's user for need and
// caches the decision in e.
func (c *Checker) reviewAccess(ctx context.Context, e *entry, idx int, need access.Scope) (decision, error) {
	u := e.user
	var extra map[string]authorizationv1.ExtraValue
	if len(u.Extra) > 0 {
		extra = make(map[string]authorizationv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	sar, err := c.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   u.Username,
			Groups: u.Groups,
			UID:    u.UID,
			Extra:  extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: c.namespace,
				Verb:      Verb,
				Group:     Group,
				Resource:  Resource,
				Name:      need.String(),
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		c.reviews.WithLabelValues("access", "error").Inc()
		c.logFailure("access", err)
		return decision{}, err
	}
	// status.evaluationError with allowed false is still RBAC's answer (a
	// binding to a missing role, say): denied, cached briefly, like any no.
	allowed := sar.Status.Allowed && !sar.Status.Denied
	c.reviews.WithLabelValues("access", result(allowed)).Inc()
	if !allowed && (sar.Status.Reason != "" || sar.Status.EvaluationError != "") {
		c.log.Debug("kubernetes access review denied", "user", u.Username, "scope", need.String(),
			"reason", sar.Status.Reason, "evaluation_error", sar.Status.EvaluationError)
	}
	d := decision{allowed: allowed}
	now := c.now()
	if until := now.Add(c.ttlFor(allowed)); until.After(now) {
		// Not past the token's own entry: a decision is about the user
		// that TokenReview named.
		d.until = until
		if e.until.Before(until) {
			d.until = e.until
		}
		c.mu.Lock()
		e.scopes[idx] = d
		c.mu.Unlock()
	}
	return d, nil
}

func result(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// logFailure logs a review the API server could not answer, at most once per
// logEvery, with the number of failures not logged since.
func (c *Checker) logFailure(kind string, err error) {
	c.logMu.Lock()
	now := c.now()
	if !c.lastLog.IsZero() && now.Sub(c.lastLog) < logEvery {
		c.suppressed++
		c.logMu.Unlock()
		return
	}
	suppressed := c.suppressed
	c.lastLog, c.suppressed = now, 0
	c.logMu.Unlock()
	c.log.Warn("kubernetes review failed; requests with Kubernetes tokens are refused until it answers",
		"kind", kind, "err", err, "failures_not_logged", suppressed)
}

// jwtExpiry reads the exp claim of a JWT without verifying it; the caller
// must know the token is genuine. ok is false for anything else.
func jwtExpiry(token string) (exp time.Time, ok bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	secs, err := claims.Exp.Float64()
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(int64(secs), 0), true
}

// CacheLen is the number of tokens cached, for tests and debugging.
func (c *Checker) CacheLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Describe implements prometheus.Collector.
func (c *Checker) Describe(ch chan<- *prometheus.Desc) {
	c.reviews.Describe(ch)
	c.cacheHits.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Checker) Collect(ch chan<- prometheus.Metric) {
	c.reviews.Collect(ch)
	c.cacheHits.Collect(ch)
}

// flights shares one review among the concurrent requests that need it. The
// review runs in a goroutine of its own, detached from the request that
// started it, so a client that hangs up does not fail the others waiting;
// each waiter still gives up when its own context ends.
type flights[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]*call[V]
}

type call[V any] struct {
	done    chan struct{}
	val     V
	err     error
	waiters int // requests that joined, under flights.mu; for tests
}

func (g *flights[K, V]) do(ctx context.Context, key K, fn func(context.Context) (V, error)) (V, error) {
	g.mu.Lock()
	cl := g.m[key]
	if cl == nil {
		cl = &call[V]{done: make(chan struct{})}
		g.m[key] = cl
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		go func() {
			defer cancel()
			cl.val, cl.err = fn(rctx)
			// fn cached its outcome before the flight ends, so a request
			// arriving now finds either the flight or the cache.
			g.mu.Lock()
			delete(g.m, key)
			g.mu.Unlock()
			close(cl.done)
		}()
	}
	cl.waiters++
	g.mu.Unlock()
	select {
	case <-cl.done:
		return cl.val, cl.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}
