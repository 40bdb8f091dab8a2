package rest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Environment variables read by the suite.
const (
	envURL      = "KVSELECT_URL"
	envCacheTTL = "KVSELECT_SELECTION_CACHE_TTL_SECS"

	// assumedCacheTTL is the --selection-cache-ttl-secs the suite expects when envCacheTTL
	// is unset (package doc, README).
	assumedCacheTTL = 2 * time.Second

	// bodyLimit is the request body limit of every route (8 MiB in Dynamo's server).
	bodyLimit = 8 << 20
)

const skipMessage = envURL + " is not set: the REST conformance suite needs a running selection service. " +
	"Run it with e.g. `" + envURL + "=http://127.0.0.1:8092 go test -count=1 -v ./conformance/rest` " +
	"against a server started with DYN_ROUTER_USE_KV_EVENTS=false --selection-cache-ttl-secs 2 " +
	"(see conformance/rest/README.md)"

func TestMain(m *testing.M) {
	if os.Getenv(envURL) == "" {
		fmt.Fprintln(os.Stderr, "conformance/rest: skipping every test: "+skipMessage)
	}
	os.Exit(m.Run())
}

// server is the service under test plus the per-run naming that keeps this run's workers,
// models and selection ids apart from anyone else's.
type server struct {
	base   string
	client *http.Client
	// expect is a client that sends `Expect: 100-continue` bodies, so an early 413 arrives
	// before the body is written (the 413 test).
	expect *http.Client
	run    string
	seq    atomic.Uint64
	idBase uint64
}

var (
	suiteOnce sync.Once
	suite     *server
	suiteErr  error
)

// conformance returns the server under test, skipping the test when KVSELECT_URL is unset
// and failing it when the server does not answer GET /health.
func conformance(t *testing.T) *server {
	t.Helper()
	base := strings.TrimRight(os.Getenv(envURL), "/")
	if base == "" {
		t.Skip(skipMessage)
	}
	suiteOnce.Do(func() {
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			suiteErr = fmt.Errorf("%s=%q is not an http(s) base URL", envURL, base)
			return
		}
		s := &server{
			base:   base,
			client: &http.Client{Timeout: 60 * time.Second},
			expect: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
				ExpectContinueTimeout: 5 * time.Second,
				DisableKeepAlives:     true,
			}},
			run: fmt.Sprintf("%08x", rand.Uint32()),
			// Worker ids are service-wide, not per partition: start from a random base well inside
			// 2^53 so any JSON decoder keeps them exact, and count up within the run.
			idBase: 1<<40 + rand.Uint64N(1<<50),
		}
		resp, err := s.client.Get(base + "/health")
		if err != nil {
			suiteErr = fmt.Errorf("GET %s/health: %v", base, err)
			return
		}
		resp.Body.Close()
		suite = s
	})
	if suiteErr != nil {
		t.Fatalf("selection service unreachable: %v", suiteErr)
	}
	return suite
}

// obj is a JSON object request body.
type obj = map[string]any

// reply is one HTTP exchange.
type reply struct {
	method, path string
	status       int
	header       http.Header
	body         []byte
}

func (r *reply) String() string {
	return fmt.Sprintf("%s %s → %d %s", r.method, r.path, r.status, truncate(r.body, 600))
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// noBody marks a request sent without a body and without a Content-Type.
var noBody = struct{}{}

// rawBody is a request body sent as is, with an explicit Content-Type ("" = none).
type rawBody struct {
	contentType string
	data        []byte
}

func (s *server) do(t *testing.T, method, path string, body any) *reply {
	t.Helper()
	return s.doWith(t, s.client, method, path, body, nil)
}

func (s *server) doWith(t *testing.T, c *http.Client, method, path string, body any, header http.Header) *reply {
	t.Helper()
	var rd io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil, struct{}:
	case rawBody:
		rd, contentType = bytes.NewReader(b.data), b.contentType
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encode %s %s body: %v", method, path, err)
		}
		rd, contentType = bytes.NewReader(data), "application/json"
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return &reply{method: method, path: path, status: resp.StatusCode, header: resp.Header, body: data}
}

func (s *server) get(t *testing.T, path string) *reply { t.Helper(); return s.do(t, "GET", path, nil) }
func (s *server) post(t *testing.T, path string, body any) *reply {
	t.Helper()
	return s.do(t, "POST", path, body)
}
func (s *server) patch(t *testing.T, path string, body any) *reply {
	t.Helper()
	return s.do(t, "PATCH", path, body)
}
func (s *server) del(t *testing.T, path string) *reply {
	t.Helper()
	return s.do(t, "DELETE", path, nil)
}

// want fails the test unless the status is code.
func (r *reply) want(t *testing.T, code int) *reply {
	t.Helper()
	if r.status != code {
		t.Fatalf("want %d: %v", code, r)
	}
	return r
}

// decode unmarshals the body into v.
func (r *reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %T: %v (%v)", v, err, r)
	}
}

// fields is the body as a JSON object, for presence and absence checks.
func (r *reply) fields(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	r.decode(t, &m)
	return m
}

// wantError checks status code and the error envelope {"error": "<text>"} every error uses,
// and that the text contains every fragment.
func (r *reply) wantError(t *testing.T, code int, fragments ...string) string {
	t.Helper()
	r.want(t, code)
	var env struct {
		Error *string `json:"error"`
	}
	if err := json.Unmarshal(r.body, &env); err != nil || env.Error == nil {
		t.Fatalf("want error envelope {\"error\": …}: %v", r)
	}
	for _, f := range fragments {
		if !strings.Contains(*env.Error, f) {
			t.Fatalf("error text %q does not contain %q (%v)", *env.Error, f, r)
		}
	}
	return *env.Error
}

// wantOK checks a payload-less success: 200 {"status":"ok"}.
func (r *reply) wantOK(t *testing.T) {
	t.Helper()
	r.wantStatusOK(t, http.StatusOK)
}

// wantStatusOK checks a payload-less success with another code (201 of register_peer).
func (r *reply) wantStatusOK(t *testing.T, code int) {
	t.Helper()
	r.want(t, code)
	var ok struct {
		Status string `json:"status"`
	}
	r.decode(t, &ok)
	if ok.Status != "ok" {
		t.Fatalf(`want {"status":"ok"}: %v`, r)
	}
}

// wantKeys fails unless every key is present in m.
func wantKeys(t *testing.T, what string, m map[string]json.RawMessage, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s: missing field %q", what, k)
		}
	}
}

// wantNoKeys fails if any key is present in m.
func wantNoKeys(t *testing.T, what string, m map[string]json.RawMessage, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := m[k]; ok {
			t.Errorf("%s: field %q must be absent, got %s", what, k, v)
		}
	}
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// --- naming ---------------------------------------------------------------------------

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// model returns a model name owned by this test in this run. Names never contain ':' so the
// /dump key "<model>:<group>" stays unambiguous.
func (s *server) model(t *testing.T, suffix ...string) string {
	name := "conf-" + s.run + "-" + unsafeName.ReplaceAllString(t.Name(), "-")
	for _, x := range suffix {
		name += "-" + x
	}
	return name
}

// selectionID returns a selection id unique to this run.
func (s *server) selectionID(tag string) string {
	return fmt.Sprintf("conf-%s-%s-%d", s.run, tag, s.seq.Add(1))
}

// workerID returns a worker id unique to this run; ids increase within a run.
func (s *server) workerID() uint64 { return s.idBase + s.seq.Add(1) }

// --- workers ---------------------------------------------------------------------------

// workerRecord is the subset of Dynamo's WorkerCatalogRecord the tests read.
type workerRecord struct {
	WorkerID              uint64            `json:"worker_id"`
	ModelName             string            `json:"model_name"`
	RoutingGroup          string            `json:"routing_group"`
	Lifecycle             string            `json:"lifecycle"`
	Endpoint              *string           `json:"endpoint"`
	BlockSize             *uint32           `json:"block_size"`
	DataParallelStartRank *uint32           `json:"data_parallel_start_rank"`
	DataParallelSize      *uint32           `json:"data_parallel_size"`
	MaxNumBatchedTokens   *uint64           `json:"max_num_batched_tokens"`
	TotalKVBlocks         *uint64           `json:"total_kv_blocks"`
	Taints                []string          `json:"taints"`
	TopologyDomains       map[string]string `json:"topology_domains"`
	NotSchedulableReasons []string          `json:"not_schedulable_reasons"`
}

// workerBody is the minimal schedulable worker of Dynamo's HTTP tests (their worker helper in
// lib/kv-router/src/services/selection/tests.rs): endpoint and block size 4, nothing else.
func workerBody(id uint64, model string) obj {
	return obj{
		"worker_id":  id,
		"model_name": model,
		"endpoint":   fmt.Sprintf("http://conf-worker-%d:8000", id),
		"block_size": 4,
	}
}

// putWorker POSTs /workers, wants 201 and registers a cleanup that deletes the worker.
func (s *server) putWorker(t *testing.T, body obj) workerRecord {
	t.Helper()
	id, ok := body["worker_id"].(uint64)
	if !ok {
		t.Fatalf("putWorker: body needs a uint64 worker_id: %v", body)
	}
	r := s.post(t, "/workers", body).want(t, http.StatusCreated)
	var rec workerRecord
	r.decode(t, &rec)
	if rec.WorkerID != id {
		t.Fatalf("POST /workers echoed worker_id %d, want %d", rec.WorkerID, id)
	}
	s.cleanupWorker(t, id)
	return rec
}

// cleanupWorker deletes the worker when the test ends (404 = already gone).
func (s *server) cleanupWorker(t *testing.T, id uint64) {
	t.Cleanup(func() {
		r := s.do(t, "DELETE", fmt.Sprintf("/workers/%d", id), nil)
		if r.status != http.StatusOK && r.status != http.StatusNotFound {
			t.Logf("cleanup: %v", r)
		}
	})
}

// addWorker registers a worker that must come out schedulable. A worker that is incomplete
// for a reason the assumed configuration rules out skips the test with that reason.
func (s *server) addWorker(t *testing.T, body obj) workerRecord {
	t.Helper()
	rec := s.putWorker(t, body)
	if rec.Lifecycle != "schedulable" {
		skipOnConfigReasons(t, rec.NotSchedulableReasons)
		t.Fatalf("worker %d: lifecycle %q, reasons %q; want schedulable", rec.WorkerID, rec.Lifecycle, rec.NotSchedulableReasons)
	}
	return rec
}

func skipOnConfigReasons(t *testing.T, reasons []string) {
	t.Helper()
	for _, r := range reasons {
		switch {
		case strings.Contains(r, "kv_events endpoint is required"):
			t.Skipf("precondition: the server consumes KV events itself (worker reason %q); "+
				"this suite registers workers without KV event endpoints: start it with DYN_ROUTER_USE_KV_EVENTS=false", r)
		case strings.Contains(r, "max_num_batched_tokens is required"):
			t.Skipf("precondition: the server runs with queueing enabled (worker reason %q); "+
				"start it without DYN_ROUTER_QUEUE_THRESHOLD / DYN_ROUTER_POLICY_CONFIG", r)
		}
	}
}

// addSimpleWorker registers workerBody(new id, model) and returns its id.
func (s *server) addSimpleWorker(t *testing.T, model string) uint64 {
	t.Helper()
	id := s.workerID()
	s.addWorker(t, workerBody(id, model))
	return id
}

// anchor registers a schedulable worker in a partition of its own, so that "no schedulable
// worker anywhere" cannot hold while the test runs and partition-level 503s carry the
// partition-specific text ("no schedulable workers for …", not "… are available").
func (s *server) anchor(t *testing.T) uint64 {
	t.Helper()
	return s.addSimpleWorker(t, s.model(t, "anchor"))
}

// wantPartitionNotReady checks the 503 of a selection call on a partition without schedulable
// workers while other partitions have some.
func wantPartitionNotReady(t *testing.T, r *reply, model string) {
	t.Helper()
	r.wantError(t, http.StatusServiceUnavailable, "no schedulable workers for", model)
}

// --- selection -------------------------------------------------------------------------

type overlap struct {
	LongestMatched uint64            `json:"longest_matched"`
	GPU            uint64            `json:"gpu"`
	DP             map[string]uint64 `json:"dp"`
	CPU            uint64            `json:"cpu"`
	Disk           uint64            `json:"disk"`
}

type workerLoad struct {
	ActivePrefillTokens  uint64  `json:"active_prefill_tokens"`
	PrefillTokenCapacity *uint64 `json:"prefill_token_capacity"`
	TotalKVBlocks        *uint64 `json:"total_kv_blocks"`
	PrefillBusy          *bool   `json:"prefill_busy"`
}

// selectResponse is Dynamo's SelectResponse.
type selectResponse struct {
	SelectionID            *string     `json:"selection_id"`
	SequenceHashes         []int64     `json:"sequence_hashes"`
	ISLTokens              *uint64     `json:"isl_tokens"`
	TrackPrefillTokens     *bool       `json:"track_prefill_tokens"`
	ModelName              string      `json:"model_name"`
	RoutingGroup           string      `json:"routing_group"`
	WorkerID               uint64      `json:"worker_id"`
	DPRank                 uint32      `json:"dp_rank"`
	Endpoint               string      `json:"endpoint"`
	BlockSize              uint32      `json:"block_size"`
	Overlap                overlap     `json:"overlap"`
	EffectivePrefillTokens uint64      `json:"effective_prefill_tokens"`
	PotentialDecodeBlocks  uint64      `json:"potential_decode_blocks"`
	DecodeBusy             *bool       `json:"decode_busy"`
	WorkerLoad             *workerLoad `json:"worker_load"`
}

// reservationResponse is the 201 body of POST /reservations.
type reservationResponse struct {
	SelectionID  string `json:"selection_id"`
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
	WorkerID     uint64 `json:"worker_id"`
	DPRank       uint32 `json:"dp_rank"`
	Endpoint     string `json:"endpoint"`
}

// tokens returns n token ids starting at first.
func tokens(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

// selectOK POSTs /select and wants 200.
func (s *server) selectOK(t *testing.T, body obj) selectResponse {
	t.Helper()
	var resp selectResponse
	s.post(t, "/select", body).want(t, http.StatusOK).decode(t, &resp)
	return resp
}

// reserveOK POSTs /select_and_reserve, wants 200 and frees the booking when the test ends.
func (s *server) reserveOK(t *testing.T, body obj) selectResponse {
	t.Helper()
	var resp selectResponse
	s.post(t, "/select_and_reserve", body).want(t, http.StatusOK).decode(t, &resp)
	if resp.SelectionID == nil {
		t.Fatalf("select_and_reserve response without selection_id")
	}
	s.cleanupReservation(t, *resp.SelectionID)
	return resp
}

// book POSTs /reservations, wants 201 and frees the booking when the test ends.
func (s *server) book(t *testing.T, body obj) reservationResponse {
	t.Helper()
	var resp reservationResponse
	s.post(t, "/reservations", body).want(t, http.StatusCreated).decode(t, &resp)
	s.cleanupReservation(t, resp.SelectionID)
	return resp
}

// cleanupReservation frees the reservation when the test ends (404 = already freed).
func (s *server) cleanupReservation(t *testing.T, id string) {
	t.Cleanup(func() {
		r := s.do(t, "DELETE", "/reservations/"+url.PathEscape(id), nil)
		if r.status != http.StatusOK && r.status != http.StatusNotFound {
			t.Logf("cleanup: %v", r)
		}
	})
}

// replay is the cached-selection replay form of POST /reservations: the id and the partition,
// nothing else.
func replay(id, model string) obj {
	return obj{"selection_id": id, "model_name": model, "routing_group": "default"}
}

// --- loads -----------------------------------------------------------------------------

type potentialLoad struct {
	WorkerID               uint64 `json:"worker_id"`
	DPRank                 uint32 `json:"dp_rank"`
	PotentialPrefillTokens uint64 `json:"potential_prefill_tokens"`
	PotentialDecodeBlocks  uint64 `json:"potential_decode_blocks"`
	ActiveRequests         uint64 `json:"active_requests"`
}

type partitionLoads struct {
	ModelName        string          `json:"model_name"`
	RoutingGroup     string          `json:"routing_group"`
	Loads            []potentialLoad `json:"loads"`
	PendingCount     *uint64         `json:"pending_count"`
	PendingISLTokens *uint64         `json:"pending_isl_tokens"`
}

// loads is GET /loads with the given filters ("" = no filter).
func (s *server) loads(t *testing.T, model, group string) []partitionLoads {
	t.Helper()
	q := url.Values{}
	if model != "" {
		q.Set("model_name", model)
	}
	if group != "" {
		q.Set("routing_group", group)
	}
	path := "/loads"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []partitionLoads
	s.get(t, path).want(t, http.StatusOK).decode(t, &out)
	return out
}

// load is the current active load of one (worker, rank) in (model, "default").
type load struct{ prefill, decode, active uint64 }

func (l load) String() string {
	return fmt.Sprintf("{prefill_tokens %d, decode_blocks %d, active_requests %d}", l.prefill, l.decode, l.active)
}

func (s *server) loadOf(t *testing.T, model string, worker uint64, rank uint32) load {
	t.Helper()
	parts := s.loads(t, model, "default")
	if len(parts) != 1 || parts[0].ModelName != model || parts[0].RoutingGroup != "default" {
		t.Fatalf("GET /loads?model_name=%s&routing_group=default: want exactly that partition, got %+v", model, parts)
	}
	for _, row := range parts[0].Loads {
		if row.WorkerID == worker && row.DPRank == rank {
			return load{row.PotentialPrefillTokens, row.PotentialDecodeBlocks, row.ActiveRequests}
		}
	}
	t.Fatalf("GET /loads: no row for worker %d dp_rank %d in %+v", worker, rank, parts[0].Loads)
	return load{}
}

// wantLoad checks one row of GET /loads; step names the point of the flow for the message.
func (s *server) wantLoad(t *testing.T, step, model string, worker uint64, rank uint32, want load) {
	t.Helper()
	if got := s.loadOf(t, model, worker, rank); got != want {
		t.Fatalf("%s: /loads for worker %d rank %d = %v, want %v", step, worker, rank, got, want)
	}
}

// eventually retries f until it returns nil or the timeout passes; for state Dynamo lets
// settle asynchronously (index recording).
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- preconditions -------------------------------------------------------------------

// cacheTTL is the server's --selection-cache-ttl-secs: KVSELECT_SELECTION_CACHE_TTL_SECS if
// set, else the assumed 2 s.
func cacheTTL(t *testing.T) (ttl time.Duration, fromEnv bool) {
	t.Helper()
	v := os.Getenv(envCacheTTL)
	if v == "" {
		return assumedCacheTTL, false
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || secs <= 0 {
		t.Fatalf("%s=%q is not a positive number of seconds", envCacheTTL, v)
	}
	return time.Duration(secs * float64(time.Second)), true
}

// sessionAffinityEnabled probes whether the server runs with --session-affinity-ttl-secs, by
// behaviour: in a partition of its own with two idle workers, a session's second booking
// stays on the first booking's worker only when affinity bound the session. Without it the
// loaded worker costs more and the default selector (temperature 0) picks the idle one.
func (s *server) sessionAffinityEnabled(t *testing.T) bool {
	t.Helper()
	model := s.model(t, "affinity-probe")
	s.addSimpleWorker(t, model)
	s.addSimpleWorker(t, model)
	session := "conf-" + s.run + "-probe"
	var picked []selectResponse
	for _, first := range []int{1, 101} {
		picked = append(picked, s.reserveOK(t, obj{"model_name": model, "token_ids": tokens(first, 4),
			"session_id": session, "selection_id": s.selectionID("probe")}))
	}
	for _, p := range picked {
		s.del(t, "/reservations/"+*p.SelectionID).wantOK(t)
	}
	return picked[0].WorkerID == picked[1].WorkerID
}

// sortedWorkers reports whether records are in (model_name, routing_group, worker_id) order.
func sortedWorkers(recs []workerRecord) bool {
	return slices.IsSortedFunc(recs, func(a, b workerRecord) int {
		if c := strings.Compare(a.ModelName, b.ModelName); c != 0 {
			return c
		}
		if c := strings.Compare(a.RoutingGroup, b.RoutingGroup); c != 0 {
			return c
		}
		switch {
		case a.WorkerID < b.WorkerID:
			return -1
		case a.WorkerID > b.WorkerID:
			return 1
		}
		return 0
	})
}

func equal(a, b any) bool { return reflect.DeepEqual(a, b) }
