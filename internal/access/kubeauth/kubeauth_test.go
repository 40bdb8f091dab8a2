package kubeauth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/metricstest"
)

// fakeAPI answers TokenReviews and SubjectAccessReviews from maps, counting
// them, so the cache's effect on the API server is visible.
type fakeAPI struct {
	mu        sync.Mutex
	users     map[string]authenticationv1.UserInfo // token -> user; others are rejected
	audiences []string                             // status.audiences of an accepted token
	grants    map[string][]string                  // user -> scope names
	tokenErr  error
	accessErr error
	// non-nil: reviews of the kind wait for it to close
	blockToken, blockAccess chan struct{}
	lastTR                  *authenticationv1.TokenReviewSpec
	lastSAR                 *authorizationv1.SubjectAccessReviewSpec

	tokenReviews, accessReviews atomic.Int32
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{users: map[string]authenticationv1.UserInfo{}, grants: map[string][]string{}}
}

func (f *fakeAPI) clientset() *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.tokenReviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		f.mu.Lock()
		block := f.blockToken
		f.mu.Unlock()
		if block != nil {
			<-block
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.lastTR = tr.Spec.DeepCopy()
		if f.tokenErr != nil {
			return true, nil, f.tokenErr
		}
		out := tr.DeepCopy()
		if u, ok := f.users[tr.Spec.Token]; ok {
			out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: f.audiences}
		} else {
			out.Status = authenticationv1.TokenReviewStatus{Error: "[invalid bearer token, token lookup failed]"}
		}
		return true, out, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.accessReviews.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		f.mu.Lock()
		block := f.blockAccess
		f.mu.Unlock()
		if block != nil {
			<-block
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.lastSAR = sar.Spec.DeepCopy()
		if f.accessErr != nil {
			return true, nil, f.accessErr
		}
		out := sar.DeepCopy()
		ra := sar.Spec.ResourceAttributes
		out.Status.Allowed = ra != nil && ra.Group == Group && ra.Resource == Resource && ra.Verb == Verb &&
			slices.Contains(f.grants[sar.Spec.User], ra.Name)
		return true, out, nil
	})
	return cs
}

func (f *fakeAPI) set(fn func(f *fakeAPI)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeAPI) counts() (token, access int32) {
	return f.tokenReviews.Load(), f.accessReviews.Load()
}

// testClock is the injectable clock: tests jump past a TTL instead of
// sleeping through it. It starts at the real time, as tokens from a real API
// server expire in real time and the cache never outlives a token.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Now()} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newChecker(t *testing.T, api *fakeAPI, clock *testClock, edit func(*Config)) *Checker {
	t.Helper()
	cfg := Config{Client: api.clientset(), Namespace: "llm", Now: clock.Now}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// metric reads a counter of a Checker through a registry, as /metrics would;
// labels are name, value pairs.
func metric(t *testing.T, c prometheus.Collector, name string, labels ...string) float64 {
	t.Helper()
	var ls []string
	for i := 0; i+1 < len(labels); i += 2 {
		ls = append(ls, labels[i]+"="+labels[i+1])
	}
	slices.Sort(ls)
	key := name
	if len(ls) > 0 {
		key += "{" + strings.Join(ls, ",") + "}"
	}
	v, ok := metricstest.Series(t, c)[key]
	if !ok {
		t.Fatalf("no metric %s", key)
	}
	return v
}

// wantAllowed, wantForbidden and wantInvalid check one CheckToken outcome.
func wantAllowed(t *testing.T, c *Checker, token string, need access.Scope, subject string) {
	t.Helper()
	id, err := c.CheckToken(context.Background(), token, need)
	if err != nil {
		t.Fatalf("%s for %s: %v, want allowed", need, subject, err)
	}
	if id != (access.Identity{Method: Method, Subject: subject}) {
		t.Fatalf("%s: identity %v, want kubernetes %s", need, id, subject)
	}
}

func wantForbidden(t *testing.T, c *Checker, token string, need access.Scope, subject string) {
	t.Helper()
	id, err := c.CheckToken(context.Background(), token, need)
	var d *access.Denied
	if !errors.As(err, &d) || !errors.Is(err, access.ErrForbidden) {
		t.Fatalf("%s for %s: %v, want forbidden", need, subject, err)
	}
	want := access.Identity{Method: Method, Subject: subject}
	if id != want || d.Identity != want || d.Need != need {
		t.Fatalf("%s: identity %v, denied %+v; want %v", need, id, d, want)
	}
}

func wantInvalid(t *testing.T, c *Checker, token string, need access.Scope, reason string) *access.Denied {
	t.Helper()
	id, err := c.CheckToken(context.Background(), token, need)
	var d *access.Denied
	if !errors.As(err, &d) || !errors.Is(err, access.ErrInvalidCredentials) {
		t.Fatalf("%s: %v, want invalid credentials", need, err)
	}
	if id.Method != "" && !strings.Contains(reason, "access review failed") {
		t.Fatalf("invalid token with identity %v", id)
	}
	if !strings.Contains(d.Reason, reason) {
		t.Fatalf("reason %q, want it to contain %q", d.Reason, reason)
	}
	if strings.Contains(err.Error(), token) {
		t.Fatalf("the error %q shows the token", err)
	}
	return d
}

const readerName = "system:serviceaccount:llm:reader"

func readerAPI() *fakeAPI {
	api := newFakeAPI()
	api.users["reader-token"] = authenticationv1.UserInfo{
		Username: readerName,
		UID:      "uid-1",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:llm", "system:authenticated"},
		Extra:    map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"gw-0"}},
	}
	api.grants[readerName] = []string{"read"}
	return api
}

// TestReviewRequests checks the questions put to the API server and the
// answers made of them.
func TestReviewRequests(t *testing.T) {
	api := readerAPI()
	c := newChecker(t, api, newTestClock(), nil)

	wantAllowed(t, c, "reader-token", access.Read, readerName)
	if api.lastTR.Token != "reader-token" || api.lastTR.Audiences != nil {
		t.Errorf("TokenReview spec %+v", api.lastTR)
	}
	want := authorizationv1.SubjectAccessReviewSpec{
		User:   readerName,
		UID:    "uid-1",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:llm", "system:authenticated"},
		Extra:  map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"gw-0"}},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: "llm", Verb: "use", Group: "kvselect.io", Resource: "scopes", Name: "read",
		},
	}
	if got := api.lastSAR; got == nil || fmt.Sprint(*got) != fmt.Sprint(want) {
		t.Errorf("SubjectAccessReview spec\n got %+v\nwant %+v", got, want)
	}

	wantForbidden(t, c, "reader-token", access.Select, readerName)
	if api.lastSAR.ResourceAttributes.Name != "select" {
		t.Errorf("SubjectAccessReview for %q, want select", api.lastSAR.ResourceAttributes.Name)
	}
	wantForbidden(t, c, "reader-token", access.Admin, readerName)
	wantInvalid(t, c, "garbage", access.Read, "kubernetes rejected the token: [invalid bearer token")

	// One TokenReview for the reader's three scopes, one for the garbage.
	if tr, sar := api.counts(); tr != 2 || sar != 3 {
		t.Errorf("%d token reviews, %d access reviews; want 2, 3", tr, sar)
	}
	for _, m := range []struct {
		kind, result string
		want         float64
	}{{"token", "allowed", 1}, {"token", "denied", 1}, {"token", "error", 0},
		{"access", "allowed", 1}, {"access", "denied", 2}, {"access", "error", 0}} {
		if got := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", m.kind, "result", m.result); got != m.want {
			t.Errorf("reviews_total{kind=%q,result=%q} = %v, want %v", m.kind, m.result, got, m.want)
		}
	}

	if _, err := c.CheckToken(context.Background(), "reader-token", access.Scope(8)); !errors.Is(err, access.ErrInvalidCredentials) {
		t.Errorf("unknown scope: %v", err)
	}
}

// TestCacheTTLs: allowed outcomes are reused for CacheTTL, denied and
// invalid ones for the shorter NegativeCacheTTL; then the API server is
// asked again and a revoked grant takes effect.
func TestCacheTTLs(t *testing.T) {
	api := readerAPI()
	clock := newTestClock()
	c := newChecker(t, api, clock, nil)

	wantAllowed(t, c, "reader-token", access.Read, readerName)
	wantForbidden(t, c, "reader-token", access.Select, readerName)
	wantInvalid(t, c, "garbage", access.Read, "rejected")
	if tr, sar := api.counts(); tr != 2 || sar != 2 {
		t.Fatalf("%d token reviews, %d access reviews; want 2, 2", tr, sar)
	}

	clock.Advance(DefaultNegativeCacheTTL - time.Millisecond)
	wantAllowed(t, c, "reader-token", access.Read, readerName)
	wantForbidden(t, c, "reader-token", access.Select, readerName)
	wantInvalid(t, c, "garbage", access.Read, "rejected")
	if tr, sar := api.counts(); tr != 2 || sar != 2 {
		t.Fatalf("within every TTL: %d token reviews, %d access reviews; want 2, 2", tr, sar)
	}
	if got := metric(t, c, "kvselect_auth_kubernetes_cache_hits_total"); got != 3 {
		t.Errorf("cache hits %v, want 3", got)
	}

	// Past the negative TTL: the denial and the invalid token are asked
	// about again, the allowed read is not.
	clock.Advance(time.Millisecond)
	api.set(func(f *fakeAPI) { f.grants[readerName] = []string{"read", "select"} })
	wantAllowed(t, c, "reader-token", access.Read, readerName)
	wantAllowed(t, c, "reader-token", access.Select, readerName)
	wantInvalid(t, c, "garbage", access.Read, "rejected")
	if tr, sar := api.counts(); tr != 3 || sar != 3 {
		t.Fatalf("past the negative TTL: %d token reviews, %d access reviews; want 3, 3", tr, sar)
	}

	// The grant is revoked: it holds until the positive TTL ends, then the
	// token is reviewed again and the scopes with it.
	api.set(func(f *fakeAPI) { f.grants[readerName] = nil })
	clock.Advance(DefaultCacheTTL - DefaultNegativeCacheTTL - time.Millisecond)
	wantAllowed(t, c, "reader-token", access.Read, readerName)
	clock.Advance(time.Millisecond)
	wantForbidden(t, c, "reader-token", access.Read, readerName)
	if tr, sar := api.counts(); tr != 4 || sar != 4 {
		t.Fatalf("past the TTL: %d token reviews, %d access reviews; want 4, 4", tr, sar)
	}
	// The select decision was made for the previous TokenReview: gone too.
	wantForbidden(t, c, "reader-token", access.Select, readerName)
	if _, sar := api.counts(); sar != 5 {
		t.Fatalf("%d access reviews, want 5", sar)
	}
}

// TestCacheDisabled: a negative CacheTTL asks the API server every time.
func TestCacheDisabled(t *testing.T) {
	api := readerAPI()
	c := newChecker(t, api, newTestClock(), func(cfg *Config) { cfg.CacheTTL = -1 })
	for range 3 {
		wantAllowed(t, c, "reader-token", access.Read, readerName)
		wantInvalid(t, c, "garbage", access.Read, "rejected")
	}
	if tr, sar := api.counts(); tr != 6 || sar != 3 {
		t.Fatalf("%d token reviews, %d access reviews; want 6, 3", tr, sar)
	}
	if n := c.CacheLen(); n != 0 {
		t.Fatalf("%d entries cached", n)
	}
}

// TestTokenExpiryBoundsTheCache: a JWT accepted 10 s before its exp is not
// vouched for after it, whatever the TTL.
func TestTokenExpiryBoundsTheCache(t *testing.T) {
	api := readerAPI()
	clock := newTestClock()
	claims := fmt.Sprintf(`{"iss":"https://kubernetes.default.svc","exp":%d}`, clock.Now().Add(10*time.Second).Unix())
	jwt := "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".c2ln"
	api.users[jwt] = api.users["reader-token"]
	c := newChecker(t, api, clock, nil)

	wantAllowed(t, c, jwt, access.Read, readerName)
	clock.Advance(9 * time.Second)
	wantAllowed(t, c, jwt, access.Read, readerName)
	if tr, _ := api.counts(); tr != 1 {
		t.Fatalf("%d token reviews before exp, want 1", tr)
	}
	clock.Advance(time.Second)
	api.set(func(f *fakeAPI) { delete(f.users, jwt) }) // the API server's view at exp
	wantInvalid(t, c, jwt, access.Read, "rejected")
	if tr, _ := api.counts(); tr != 2 {
		t.Fatalf("%d token reviews after exp, want 2", tr)
	}
}

// TestConcurrentChecksShareOneReview: with the cache off, so only the
// sharing can explain it, many requests for one token and scope cost one
// TokenReview and one SubjectAccessReview; a request that gives up does not
// fail the others.
func TestConcurrentChecksShareOneReview(t *testing.T) {
	api := readerAPI()
	api.blockToken, api.blockAccess = make(chan struct{}), make(chan struct{})
	c := newChecker(t, api, newTestClock(), func(cfg *Config) { cfg.CacheTTL = -1 })
	key := sha256.Sum256([]byte("reader-token"))

	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := c.CheckToken(context.Background(), "reader-token", access.Read)
			errs <- err
		})
	}
	// One more request gives up while the review runs.
	ctx, cancel := context.WithCancel(context.Background())
	quitter := make(chan error, 1)
	go func() {
		_, err := c.CheckToken(ctx, "reader-token", access.Read)
		quitter <- err
	}()
	waitFor(t, "every request to join the token review", func() bool {
		c.authn.mu.Lock()
		defer c.authn.mu.Unlock()
		cl := c.authn.m[key]
		return cl != nil && cl.waiters == n+1
	})
	cancel()
	if err := <-quitter; !errors.Is(err, access.ErrInvalidCredentials) || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("the request that gave up: %v", err)
	}
	close(api.blockToken)
	waitFor(t, "every request to join the access review", func() bool {
		c.authz.mu.Lock()
		defer c.authz.mu.Unlock()
		cl := c.authz.m[scopeKey{key, access.Read}]
		return cl != nil && cl.waiters == n
	})
	close(api.blockAccess)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a waiting request: %v", err)
		}
	}
	if tr, sar := api.counts(); tr != 1 || sar != 1 {
		t.Fatalf("%d token reviews, %d access reviews for %d concurrent requests; want 1, 1", tr, sar, n+1)
	}
}

// TestAPIServerFailuresAreNotCached: a review the API server cannot answer
// refuses the request as unauthenticated, says why without the error's
// details, is counted, logged at most every 10 s, and asked again next time.
func TestAPIServerFailuresAreNotCached(t *testing.T) {
	api := readerAPI()
	clock := newTestClock()
	var logs bytes.Buffer
	c := newChecker(t, api, clock, func(cfg *Config) { cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })

	api.tokenErr = apierrors.NewInternalError(errors.New("etcd at 10.0.0.7 is gone"))
	for range 3 {
		d := wantInvalid(t, c, "reader-token", access.Read, "kubernetes token review failed: the API server failed; try again")
		if strings.Contains(d.Reason, "10.0.0.7") {
			t.Fatalf("the reason %q shows the API server's error", d.Reason)
		}
	}
	api.set(func(f *fakeAPI) {
		f.tokenErr = apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("no RBAC"))
	})
	wantInvalid(t, c, "reader-token", access.Read, "kvselect may not create tokenreviews (it needs system:auth-delegator)")
	if tr, _ := api.counts(); tr != 4 {
		t.Fatalf("%d token reviews, want 4: failures are not cached", tr)
	}
	if got := metric(t, c, "kvselect_auth_kubernetes_reviews_total", "kind", "token", "result", "error"); got != 4 {
		t.Errorf("token review errors %v, want 4", got)
	}
	if n := strings.Count(logs.String(), "kubernetes review failed"); n != 1 {
		t.Errorf("%d log lines in 10 s, want 1:\n%s", n, logs.String())
	}
	clock.Advance(logEvery)
	wantInvalid(t, c, "reader-token", access.Read, "token review failed")
	if !strings.Contains(logs.String(), "failures_not_logged=3") {
		t.Errorf("the second log line does not count the 3 failures not logged:\n%s", logs.String())
	}

	// The token is reviewed, the access review fails: the identity is known,
	// the request still refused, and nothing cached.
	api.set(func(f *fakeAPI) { f.tokenErr, f.accessErr = nil, apierrors.NewServiceUnavailable("etcd") })
	for range 2 {
		d := wantInvalid(t, c, "reader-token", access.Read, "kubernetes access review failed: the API server is unavailable")
		if d.Identity.Subject != readerName {
			t.Errorf("identity %v, want %s", d.Identity, readerName)
		}
	}
	api.set(func(f *fakeAPI) { f.accessErr = nil })
	wantAllowed(t, c, "reader-token", access.Read, readerName)
	if tr, sar := api.counts(); tr != 6 || sar != 3 {
		t.Fatalf("%d token reviews, %d access reviews; want 6, 3", tr, sar)
	}
}

// TestCacheIsBounded: MaxCacheEntries tokens at most, the least recently
// used evicted first, so a flood of new tokens does not push out one in use.
func TestCacheIsBounded(t *testing.T) {
	api := readerAPI()
	for i := range 10 {
		api.users[fmt.Sprint("token-", i)] = authenticationv1.UserInfo{Username: fmt.Sprint("user-", i)}
	}
	c := newChecker(t, api, newTestClock(), func(cfg *Config) { cfg.MaxCacheEntries = 3 })
	for i := range 10 {
		wantAllowed(t, c, "reader-token", access.Read, readerName)
		wantForbidden(t, c, fmt.Sprint("token-", i), access.Read, fmt.Sprint("user-", i))
		if n := c.CacheLen(); n > 3 {
			t.Fatalf("%d entries cached, bound 3", n)
		}
	}
	if tr, sar := api.counts(); tr != 11 || sar != 11 {
		t.Fatalf("%d token reviews, %d access reviews; want 11, 11 (reader's cached throughout)", tr, sar)
	}
	wantForbidden(t, c, "token-0", access.Read, "user-0") // evicted long ago
	if tr, _ := api.counts(); tr != 12 {
		t.Fatalf("%d token reviews, want 12", tr)
	}
}

// TestAudiences: spec.audiences is sent, and an answer that does not
// confirm one of them is not taken for a yes.
func TestAudiences(t *testing.T) {
	api := readerAPI()
	clock := newTestClock()
	c := newChecker(t, api, clock, func(cfg *Config) { cfg.Audiences = []string{"kvselect", "kvselect.llm"} })

	api.audiences = []string{"kvselect.llm"}
	wantAllowed(t, c, "reader-token", access.Read, readerName)
	if got := api.lastTR.Audiences; !slices.Equal(got, []string{"kvselect", "kvselect.llm"}) {
		t.Errorf("spec.audiences %q", got)
	}
	clock.Advance(DefaultCacheTTL)
	api.set(func(f *fakeAPI) { f.audiences = nil })
	wantInvalid(t, c, "reader-token", access.Read, "did not confirm the token's audience is kvselect or kvselect.llm")
}

func TestNewValidates(t *testing.T) {
	cs := fake.NewClientset()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no client", Config{Namespace: "llm"}},
		{"no namespace", Config{Client: cs}},
		{"empty audience", Config{Client: cs, Namespace: "llm", Audiences: []string{""}}},
		{"negative bound", Config{Client: cs, Namespace: "llm", MaxCacheEntries: -1}},
	} {
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	c, err := New(Config{Client: cs, Namespace: "llm", CacheTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if c.ttl != 2*time.Second || c.nttl != 2*time.Second || c.max != DefaultMaxCacheEntries {
		t.Errorf("ttl %v, negative %v, max %d", c.ttl, c.nttl, c.max)
	}
}

func TestJWTExpiry(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		token string
		want  int64 // 0: none
	}{
		{"h." + enc(`{"exp":1900000000}`) + ".s", 1900000000},
		{"h." + enc(`{"exp":1.9e9}`) + ".s", 1900000000},
		{"h." + enc(`{"sub":"x"}`) + ".s", 0},
		{"h." + enc(`{"exp":"soon"}`) + ".s", 0},
		{"h." + enc(`not json`) + ".s", 0},
		{"h.!!!.s", 0},
		{"opaque-token", 0},
	} {
		exp, ok := jwtExpiry(tc.token)
		if (tc.want == 0) == ok || ok && exp.Unix() != tc.want {
			t.Errorf("jwtExpiry(%q) = %v, %v; want %d", tc.token, exp, ok, tc.want)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
