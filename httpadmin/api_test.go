package httpadmin

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// The tests below port Dynamo's HTTP-level tests
// (lib/kv-router/src/services/selection/tests.rs) over real HTTP, in that
// file's order; each is named after the Rust test it ports.

var sel4 = map[string]any{"model_name": "model", "token_ids": []int{1, 2, 3, 4}}

func with(base map[string]any, kv ...any) map[string]any {
	m := map[string]any{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func TestReplicaSyncRoutesAreMounted(t *testing.T) {
	a := newAPI(t, nil, Options{})
	r := a.do("GET", "/replica_sync/peers", nil).want(t, http.StatusOK, "")
	if string(r.raw) != "[]" {
		t.Fatalf("peers = %s, want []", r.raw)
	}
	a.do("POST", "/replica_sync/register_peer", `{"endpoint":"tcp://127.0.0.1:19092"}`).want(t, http.StatusConflict, `{"error":"replica sync is disabled"}`)
	a.do("POST", "/replica_sync/deregister_peer", `{"endpoint":"tcp://127.0.0.1:19092"}`).want(t, http.StatusConflict, "replica sync is disabled")
	// Dynamo checks the body, then "disabled", then the endpoint (replica_sync_http.rs).
	a.do("POST", "/replica_sync/register_peer", `{"endpoint":"invalid"}`).want(t, http.StatusConflict, "replica sync is disabled")
	a.do("POST", "/replica_sync/register_peer", `{}`).want(t, http.StatusUnprocessableEntity, "missing field `endpoint`")
}

func TestReadyAndSelectReportNotReadyWithoutSchedulableWorkers(t *testing.T) {
	a := newAPI(t, nil, Options{})
	r := a.do("GET", "/ready", nil).want(t, http.StatusServiceUnavailable, "")
	if r.at("ready") != false || r.num("schedulable_workers") != 0 {
		t.Fatalf("ready = %s", r.raw)
	}
	a.do("POST", "/select", with(sel4, "selection_id", "s1")).want(t, http.StatusServiceUnavailable, "no schedulable workers are available")
	a.addWorker(1)
	r = a.do("GET", "/ready", nil).want(t, http.StatusOK, "")
	if r.at("ready") != true || r.num("schedulable_workers") != 1 || r.at("workers", 0, "lifecycle") != "schedulable" {
		t.Fatalf("ready = %s", r.raw)
	}
	a.do("GET", "/health", nil).want(t, http.StatusOK, `{"status":"ok"}`)
}

func TestIncompleteWorkerIsAcceptedButNotSchedulable(t *testing.T) {
	a := newAPI(t, func(c *routerconfig.Config) { c.QueueThreshold = routerconfig.Some(1.0) }, Options{})
	r := a.addWorker(1)
	if r.at("lifecycle") != "incomplete" || !strings.Contains(r.at("not_schedulable_reasons", 0).(string), "max_num_batched_tokens") {
		t.Fatalf("record = %s", r.raw)
	}
	a.do("POST", "/select", sel4).want(t, http.StatusServiceUnavailable, "no schedulable workers")
}

// Without a queue threshold nothing requires max_num_batched_tokens. (Dynamo
// also queues through policy classes; kvselect refuses DYN_ROUTER_POLICY_CONFIG
// at startup, so a threshold is the only way in.)
func TestThresholdFreePolicyDoesNotRequireMaxNumBatchedTokens(t *testing.T) {
	a := newAPI(t, nil, Options{})
	if r := a.addWorker(1); r.at("lifecycle") != "schedulable" {
		t.Fatalf("record = %s", r.raw)
	}
}

func TestSelectEchoesSelectionIDAndDoesNotBookLoad(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	r := a.do("POST", "/select", with(sel4, "selection_id", "sel-a")).want(t, http.StatusOK, "")
	m := r.obj()
	if m["selection_id"] != "sel-a" || m["routing_group"] != "default" || r.num("worker_id") != 1 || r.num("effective_prefill_tokens") != 4 ||
		r.num("overlap", "longest_matched") != 0 || r.at("overlap", "dp", "0") != 0.0 {
		t.Fatalf("select = %s", r.raw)
	}
	for _, k := range []string{"tenant_id", "cached_tokens", "effective_overlap_blocks", "sequence_hashes", "isl_tokens", "track_prefill_tokens", "reservation_id", "worker_load", "kv_hint"} {
		if _, ok := m[k]; ok {
			t.Fatalf("select response has %q: %s", k, r.raw)
		}
	}
	if a.load0()["active_requests"] != 0.0 {
		t.Fatal("select booked load")
	}
	// Without an id, selection_id is omitted.
	if r := a.do("POST", "/select", sel4).want(t, http.StatusOK, ""); r.obj()["selection_id"] != nil {
		t.Fatalf("select without id = %s", r.raw)
	}
}

func TestOverlapScoresReturnsAllSchedulableWorkerRanks(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.addWorker(2, "data_parallel_start_rank", 2, "data_parallel_size", 2)
	r := a.do("POST", "/overlap_scores", sel4).want(t, http.StatusOK, "")
	var rows [][2]float64
	for _, w := range r.at("workers").([]any) {
		m := w.(map[string]any)
		rows = append(rows, [2]float64{m["worker_id"].(float64), m["dp_rank"].(float64)})
	}
	if r.num("num_blocks") != 1 || !slices.Equal(rows, [][2]float64{{1, 0}, {2, 2}, {2, 3}}) ||
		r.num("workers", 0, "host_pinned_blocks") != 0 || r.num("workers", 0, "disk_blocks") != 0 || r.at("shared_cache", "enabled") != false {
		t.Fatalf("overlap_scores = %s", r.raw)
	}
}

func TestSelectAndReserveBooksAndDuplicateReservationConflicts(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	r := a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "res-a")).want(t, http.StatusOK, "")
	want := kvhash.SequenceHashes(kvhash.LocalBlockHashes([]uint32{1, 2, 3, 4}, "", "", kvhash.BlockOptions{BlockSize: 4}))
	got := r.at("sequence_hashes").([]any)
	if r.at("selection_id") != "res-a" || r.num("effective_prefill_tokens") != 4 || r.num("isl_tokens") != 4 || r.at("track_prefill_tokens") != true ||
		len(got) != len(want) {
		t.Fatalf("select_and_reserve = %s", r.raw)
	}
	// Compare the exact i64 text: float64 cannot hold every hash.
	if !strings.Contains(string(r.raw), `"sequence_hashes":[`+i64List(want)+`]`) {
		t.Fatalf("sequence_hashes %s, want [%s]", r.raw, i64List(want))
	}
	if l := a.load0(); l["potential_prefill_tokens"] != 4.0 || l["active_requests"] != 1.0 {
		t.Fatalf("loads = %v", l)
	}
	a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "res-a")).want(t, http.StatusConflict, "selection res-a is already reserved or being reserved")
	a.do("DELETE", "/reservations/res-a", nil).want(t, http.StatusOK, `{"status":"ok"}`)
	a.do("DELETE", "/reservations/res-a", nil).want(t, http.StatusNotFound, `{"error":"reservation res-a not found"}`)
}

func i64List(hs []uint64) string {
	var b strings.Builder
	for i, h := range hs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(itoaI64(int64(h)))
	}
	return b.String()
}

func itoaI64(v int64) string {
	neg := v < 0
	u := uint64(v)
	if neg {
		u = uint64(-v)
	}
	s := itoa(u)
	if neg {
		return "-" + s
	}
	return s
}

func TestExplicitReplayPreservesDisabledPrefillTracking(t *testing.T) {
	a := newAPI(t, nil, Options{})
	b := newAPI(t, nil, Options{})
	a.addWorker(1)
	b.addWorker(1)
	override := map[string]any{"track_prefill_tokens": false}
	r := a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "r1", "router_config_override", override)).want(t, http.StatusOK, "")
	if r.at("track_prefill_tokens") != false {
		t.Fatalf("select_and_reserve = %s", r.raw)
	}
	// Copy the booking inputs verbatim (json.RawMessage keeps the i64 hashes exact).
	body := `{"model_name":"model","selection_id":"r1","worker_id":` + ftoa(r.num("worker_id")) + `,"dp_rank":` + ftoa(r.num("dp_rank")) +
		`,"sequence_hashes":` + rawField(t, r.raw, "sequence_hashes") + `,"isl_tokens":` + ftoa(r.num("isl_tokens")) +
		`,"effective_prefill_tokens":` + ftoa(r.num("effective_prefill_tokens")) + `,"track_prefill_tokens":false}`
	b.do("POST", "/reservations", body).want(t, http.StatusCreated, "")
	for _, x := range []*testAPI{a, b} {
		if l := x.load0(); l["active_requests"] != 1.0 || l["potential_prefill_tokens"] != 0.0 || l["potential_decode_blocks"] != 1.0 {
			t.Fatalf("loads = %v", l)
		}
	}
	p := b.do("POST", "/potential_loads", with(sel4, "router_config_override", override)).want(t, http.StatusOK, "")
	if p.num(0, "potential_decode_blocks") != 1 {
		t.Fatalf("potential_loads = %s", p.raw)
	}
}

func ftoa(f float64) string { return itoa(uint64(f)) }

// kvselect refuses DYN_ROUTER_POLICY_CONFIG at startup (server's
// TestInvalidConfigurationIsAUsageError), so no policy class can be
// configured and x-dynamo-meta-policy-class changes nothing, as in Dynamo
// without a policy config: no threshold, no 429/529, the same answer as
// without the header.
func TestPolicyClassHeaderIsInertWithoutPolicyClasses(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	plain := a.do("POST", "/select", sel4).want(t, http.StatusOK, "")
	for _, class := range []string{"latency", "batch", "no-such-class"} {
		r := a.do("POST", "/select", sel4, "x-dynamo-meta-policy-class", class).want(t, http.StatusOK, "")
		if string(r.raw) != string(plain.raw) {
			t.Errorf("class %q: select = %s, without the header %s", class, r.raw, plain.raw)
		}
	}
	a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "classy"), "x-dynamo-meta-policy-class", "batch").want(t, http.StatusOK, "")
	if a.load0()["active_requests"] != 1.0 {
		t.Fatal("select_and_reserve with a policy class did not book")
	}
}

func TestErrorEnvelopeCarriesDetails(t *testing.T) {
	s := &server{log: newDiscardLogger()}
	details := map[string]any{"policy_class": "latency", "limit_kind": "requests", "current": 0, "limit": 0}
	err := &selection.Error{Kind: selection.KindOverloaded, Message: `router policy class "latency" queue requests limit reached (current=0, limit=0)`, Details: details}
	rec := httptest.NewRecorder()
	s.fail(rec, httptest.NewRequest("POST", "/select", nil), err)
	want := `{"error":"router policy class \"latency\" queue requests limit reached (current=0, limit=0)","details":{"current":0,"limit":0,"limit_kind":"requests","policy_class":"latency"}}`
	if rec.Code != http.StatusTooManyRequests || rec.Body.String() != want {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

func TestKindStatusTable(t *testing.T) {
	for k, want := range map[selection.Kind]int{
		selection.KindBadRequest: 400, selection.KindNotFound: 404, selection.KindConflict: 409, selection.KindNotReady: 503,
		selection.KindOverloaded: 429, selection.KindUnavailable: 503, selection.KindInternal: 500, selection.Kind(99): 500,
	} {
		if got := statusOf(&selection.Error{Kind: k, Message: "x"}); got != want {
			t.Errorf("%v: %d, want %d", k, got, want)
		}
	}
	if got := statusOf(errors.New("plain")); got != 500 {
		t.Errorf("plain error: %d", got)
	}
}

func TestOutputBlockEndpointUpdatesReservedLoad(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "ob")).want(t, http.StatusOK, "")
	before := a.load0()["potential_decode_blocks"].(float64)
	a.do("POST", "/reservations/ob/output_block", `{}`).want(t, http.StatusOK, `{"status":"ok"}`)
	a.do("POST", "/reservations/ob/output_block", `{"decay_fraction":1.5}`).want(t, http.StatusBadRequest, "decay_fraction must be between 0.0 and 1.0")
	if after := a.load0()["potential_decode_blocks"].(float64); after != before+1 {
		t.Fatalf("decode blocks %v -> %v, want +1", before, after)
	}
	// A JSON body is required ({} is fine).
	a.do("POST", "/reservations/ob/output_block", nil).want(t, http.StatusUnsupportedMediaType, "Expected request with `Content-Type: application/json`")
	a.do("POST", "/reservations/ob/output_block", "").want(t, http.StatusBadRequest, "Failed to parse the request body as JSON")
	a.do("POST", "/reservations/nope/output_block", `{"decay_fraction":0.5}`).want(t, http.StatusNotFound, "reservation nope not found")
}

func TestExplicitReservationBooksAfterSelect(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	r := a.do("POST", "/select", sel4).want(t, http.StatusOK, "")
	res := a.do("POST", "/reservations", map[string]any{"model_name": "model", "selection_id": "res-b", "worker_id": r.num("worker_id"),
		"dp_rank": r.num("dp_rank"), "sequence_hashes": []int{1}, "isl_tokens": 4, "effective_prefill_tokens": r.num("effective_prefill_tokens")}).
		want(t, http.StatusCreated, "")
	if res.at("selection_id") != "res-b" || res.at("model_name") != "model" || res.at("routing_group") != "default" || res.num("worker_id") != 1 ||
		res.at("endpoint") != "http://worker-1:8000" {
		t.Fatalf("reservation = %s", res.raw)
	}
	if l := a.load0(); l["potential_prefill_tokens"] != 4.0 {
		t.Fatalf("loads = %v", l)
	}
	a.do("POST", "/reservations/res-b/prefill_complete", `{}`).want(t, http.StatusOK, `{"status":"ok"}`)
	// No body is needed, and prefill_complete is idempotent on a live booking.
	a.do("POST", "/reservations/res-b/prefill_complete", nil).want(t, http.StatusOK, "")
	if l := a.load0(); l["potential_prefill_tokens"] != 0.0 {
		t.Fatalf("loads = %v", l)
	}
}

func TestExplicitReservationRejectsEffectivePrefillAboveISL(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"x","worker_id":1,"dp_rank":0,"sequence_hashes":[1],"isl_tokens":4,"effective_prefill_tokens":5}`).
		want(t, http.StatusBadRequest, "must not exceed isl_tokens")
}

func TestExplicitReservationRejectsUnschedulableWorker(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.do("POST", "/workers", `{"worker_id":1,"model_name":"model","block_size":4}`).want(t, http.StatusCreated, `"lifecycle":"incomplete"`)
	a.addWorker(2)
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"x","worker_id":1,"sequence_hashes":[1],"isl_tokens":4}`).
		want(t, http.StatusNotFound, "schedulable worker 1 not found")
}

func TestCachedReservationBooksFromSelect(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	s := a.do("POST", "/select", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	r := a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusCreated, "")
	if r.num("worker_id") != s.num("worker_id") || r.num("dp_rank") != s.num("dp_rank") {
		t.Fatalf("replay %s after select %s", r.raw, s.raw)
	}
	if l := a.load0(); l["potential_prefill_tokens"] != 4.0 {
		t.Fatalf("loads = %v", l)
	}
	a.do("POST", "/reservations/sel-1/prefill_complete", nil).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusNotFound, "no pending selection sel-1")
}

func TestReservationRequiresSelectionID(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/reservations", `{"model_name":"model","worker_id":1}`).
		want(t, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body into the target type: missing field `selection_id`")
	a.do("POST", "/reservations", `{"model_name":"model","worker_id":1,"selection_id":null}`).
		want(t, http.StatusUnprocessableEntity, "selection_id: invalid type: null")
}

func TestCachedReservationIgnoresRequestOverrides(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1","effective_prefill_tokens":5}`).want(t, http.StatusCreated, "")
	if l := a.load0(); l["potential_prefill_tokens"] != 4.0 {
		t.Fatalf("loads = %v", l)
	}
}

func TestCachedReservationNeedsMatchingModel(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"other","selection_id":"sel-1"}`).want(t, http.StatusNotFound, "no pending selection")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusCreated, "")
}

func TestFailedCachedBookingIsRetryable(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	d := a.do("DELETE", "/workers/1", nil).want(t, http.StatusOK, "")
	if d.at("lifecycle") != "unschedulable" || d.obj()["not_schedulable_reasons"] != nil {
		t.Fatalf("delete = %s", d.raw)
	}
	a.do("DELETE", "/workers/1", nil).want(t, http.StatusNotFound, `{"error":"worker 1 not found"}`)
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusServiceUnavailable, "no schedulable workers")
	a.addWorker(1)
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusCreated, "")
}

func TestCachedBookingRetryableAfterSchedulerConflict(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusConflict, "already reserved")
	a.do("DELETE", "/reservations/sel-1", nil).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusCreated, "")
}

func TestCachedReservationRejectsStaleDPRank(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "sel-1")).want(t, http.StatusOK, "")
	a.do("PATCH", "/workers/1", `{"data_parallel_start_rank":1,"data_parallel_size":1}`).want(t, http.StatusOK, `"data_parallel_start_rank":1`)
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusNotFound, "dp_rank 0")
	a.do("PATCH", "/workers/1", `{"data_parallel_start_rank":0,"data_parallel_size":1}`).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"sel-1"}`).want(t, http.StatusCreated, "")
	a.do("PATCH", "/workers/99", `{}`).want(t, http.StatusNotFound, `{"error":"worker 99 not found"}`)
}

func TestExplicitReservationDiscardsCachedSelection(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "req-1")).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"req-1","worker_id":1,"sequence_hashes":[1],"isl_tokens":4}`).want(t, http.StatusCreated, "")
	a.do("DELETE", "/reservations/req-1", nil).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"req-1"}`).want(t, http.StatusNotFound, "no pending selection")
}

func TestCachedBookingHonorsPrefillTracking(t *testing.T) {
	a := newAPI(t, func(c *routerconfig.Config) { c.TrackPrefillTokens = false }, Options{})
	a.addWorker(1)
	a.do("POST", "/select", with(sel4, "selection_id", "s1")).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"s1"}`).want(t, http.StatusCreated, "")
	if l := a.load0(); l["potential_prefill_tokens"] != 0.0 {
		t.Fatalf("loads = %v", l)
	}
	a.do("DELETE", "/reservations/s1", nil).want(t, http.StatusOK, "")
	// Another prompt: the first booking was recorded into the approximate
	// index, so the same prompt would now be fully cached.
	a.do("POST", "/select", with(sel4, "token_ids", []int{5, 6, 7, 8}, "selection_id", "s2", "router_config_override", map[string]any{"track_prefill_tokens": true})).want(t, http.StatusOK, "")
	a.do("POST", "/reservations", `{"model_name":"model","selection_id":"s2"}`).want(t, http.StatusCreated, "")
	if l := a.load0(); l["potential_prefill_tokens"] != 4.0 {
		t.Fatalf("loads = %v", l)
	}
}

func TestDumpExposesCompatibleIndexerSnapshot(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.do("GET", "/dump", nil).want(t, http.StatusOK, "{}")
	a.addWorker(1)
	a.do("POST", "/select_and_reserve", sel4).want(t, http.StatusOK, "")
	r := a.do("GET", "/dump", nil).want(t, http.StatusOK, "")
	if r.num("model:default", "block_size") != 4 {
		t.Fatalf("dump = %s", r.raw)
	}
	if _, ok := r.at("model:default", "events").([]any); !ok {
		t.Fatalf("dump events = %s", r.raw)
	}
}

func TestReconcileRollsBackPartialListenerRegistration(t *testing.T) {
	a := newAPI(t, func(c *routerconfig.Config) { c.UseKVEvents = true }, Options{})
	r := a.addWorker(7, "data_parallel_size", 2, "kv_events_endpoints", map[string]string{"0": "tcp://127.0.0.1:5557", "1": "not-a-zmq-endpoint"})
	if r.at("lifecycle") != "incomplete" || !strings.Contains(r.at("not_schedulable_reasons", 0).(string), "reconciliation failed") {
		t.Fatalf("record = %s", r.raw)
	}
	p := a.do("PATCH", "/workers/7", `{"kv_events_endpoints":{"0":"tcp://127.0.0.1:5557","1":"tcp://127.0.0.1:5558"}}`).want(t, http.StatusOK, "")
	if p.at("lifecycle") != "schedulable" || p.obj()["not_schedulable_reasons"] != nil {
		t.Fatalf("patched = %s", p.raw)
	}
}

func TestHashPathValidationReturnsBadRequest(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.do("POST", "/select", `{"model_name":"model","block_hashes":[1],"sequence_hashes":[1,2],"isl_tokens":4}`).
		want(t, http.StatusBadRequest, "block_hashes length")
	for _, c := range []struct{ body, frag string }{
		{`{"model_name":"model","sequence_hashes":[1],"isl_tokens":4}`, "block_hashes is required without token_ids"},
		{`{"model_name":"model","block_hashes":[1],"isl_tokens":4}`, "sequence_hashes is required without token_ids"},
		{`{"model_name":"model","block_hashes":[1],"sequence_hashes":[1]}`, "isl_tokens is required without token_ids"},
		{`{"model_name":"model","block_hashes":[1],"sequence_hashes":[1],"isl_tokens":0}`, "isl_tokens must be greater than 0"},
	} {
		a.do("POST", "/select", c.body).want(t, http.StatusBadRequest, c.frag)
	}
	// Hash-path inputs are trusted: a negative i64 echoes as sent.
	a.do("POST", "/select_and_reserve", `{"model_name":"model","block_hashes":[5,6],"sequence_hashes":[-1,7],"isl_tokens":8}`).
		want(t, http.StatusOK, `"sequence_hashes":[-1,7]`)
}

// ---- beyond Dynamo's HTTP tests: what the front itself owns ----

func TestUpsertWorkerShapes(t *testing.T) {
	a := newAPI(t, nil, Options{})
	r := a.do("POST", "/workers", `{"worker_id":3,"model_name":"model","endpoint":"http://w3:8000","block_size":4,"unknown_field":{"x":[1]}}`).
		want(t, http.StatusCreated, "")
	// Optional fields stay null, collections are [] / {}, reasons omitted.
	for _, frag := range []string{`"worker_id":3`, `"lifecycle":"schedulable"`, `"data_parallel_size":null`, `"taints":[]`, `"topology_domains":{}`} {
		if !strings.Contains(string(r.raw), frag) {
			t.Fatalf("record %s lacks %s", r.raw, frag)
		}
	}
	// A record echoed back from GET /workers is accepted whatever its computed fields hold.
	a.do("POST", "/workers", `{"worker_id":3,"model_name":"model","endpoint":"http://w3:8000","block_size":4,"lifecycle":7,"not_schedulable_reasons":"x"}`).
		want(t, http.StatusCreated, `"lifecycle":"schedulable"`)
	a.do("POST", "/workers", `{"model_name":"model"}`).want(t, http.StatusUnprocessableEntity, "missing field `worker_id`")
	a.do("POST", "/workers", `{"worker_id":3,"kv_transfer_enforcement":"sometimes"}`).want(t, http.StatusUnprocessableEntity, "unknown variant `sometimes`")
	a.addWorker(1)
	a.do("POST", "/workers", `{"worker_id":5,"model_name":"other","routing_group":"g","endpoint":"http://w5:8000","block_size":4}`).want(t, http.StatusCreated, "")
	ids := func(q string) []float64 {
		var out []float64
		for _, w := range a.do("GET", "/workers"+q, nil).want(t, http.StatusOK, "").body.([]any) {
			out = append(out, w.(map[string]any)["worker_id"].(float64))
		}
		return out
	}
	for q, want := range map[string][]float64{"": {1, 3, 5}, "?model_name=model": {1, 3}, "?routing_group=g": {5}, "?model_name=model&routing_group=g": nil,
		"?tenant_id=x": {1, 3, 5}, "?model_name=": nil} {
		if got := ids(q); !slices.Equal(got, want) {
			t.Errorf("GET /workers%s = %v, want %v", q, got, want)
		}
	}
	if r := a.do("GET", "/loads?model_name=other", nil).want(t, http.StatusOK, ""); r.at(0, "model_name") != "other" || r.at(1) != nil {
		t.Fatalf("loads filter = %s", r.raw)
	}
}

func TestWorkerIDPath(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	for _, c := range []struct {
		path   string
		status int
		frag   string
	}{
		{"/workers/abc", 400, "Invalid URL: Cannot parse `abc` to a `u64`"},
		{"/workers/-1", 400, "Cannot parse `-1`"},
		{"/workers/18446744073709551616", 400, "to a `u64`"},
		{"/workers/1.0", 400, "to a `u64`"},
		{"/workers/%E2%9C%93", 400, "Cannot parse `✓`"},
		{"/workers/18446744073709551615", 404, "worker 18446744073709551615 not found"},
		{"/workers/+1", 200, `"worker_id":1`}, // Rust's u64::from_str takes a leading '+'
		{"/workers/", 404, "route not found"},
	} {
		a.do("DELETE", c.path, nil).want(t, c.status, c.frag)
	}
}

// TestPprof: with Options.Pprof the runtime profiles are served (GIE's
// --enable-pprof); POST is still refused.
func TestPprof(t *testing.T) {
	a := newAPI(t, nil, Options{Pprof: true})
	for path, frag := range map[string]string{
		"/debug/pprof":              "Types of profiles available",
		"/debug/pprof/heap?debug=1": "heap profile",
		"/debug/pprof/goroutine":    "", // gzipped protobuf
		"/debug/pprof/cmdline":      "httpadmin.test",
	} {
		res, err := a.client.Get(a.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || len(raw) == 0 || !strings.Contains(string(raw), frag) {
			t.Errorf("GET %s: %d, %d bytes, want 200 containing %q", path, res.StatusCode, len(raw), frag)
		}
	}
	a.do("POST", "/debug/pprof/heap", nil).want(t, 405, "method not allowed")
}

func TestFallbacksAndTransportRules(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	for _, c := range []struct {
		method, path string
		status       int
		frag         string
	}{
		{"GET", "/nope", 404, `{"error":"route not found"}`},
		{"GET", "/", 404, `{"error":"route not found"}`},
		{"GET", "/metrics", 404, "route not found"},
		{"GET", "/debug/pprof/heap", 404, "route not found"}, // Options.Pprof off
		{"GET", "/workers/", 404, "route not found"},
		{"GET", "//workers", 404, "route not found"},
		{"GET", "/workers/../workers", 404, "route not found"},
		{"GET", "/reservations/x/prefill_complete", 405, `{"error":"method not allowed"}`},
		{"PUT", "/workers", 405, "method not allowed"},
		{"GET", "/select", 405, "method not allowed"},
		{"POST", "/health", 405, "method not allowed"},
		{"GET", "/workers/1", 405, "method not allowed"},
		{"DELETE", "/reservations", 405, "method not allowed"},
	} {
		a.do(c.method, c.path, nil).want(t, c.status, c.frag)
	}
	if r := a.do("PUT", "/workers", nil); r.header.Get("Allow") == "" {
		t.Error("405 without Allow")
	}
	// Content-Type: axum's json_content_type accepts application/json and
	// application/*+json, parameters allowed.
	for ct, status := range map[string]int{
		"application/json": 200, "application/json; charset=utf-8": 200, "Application/JSON": 200, "application/vnd.api+json": 200,
		"text/json": 415, "text/plain": 415, "application/x-www-form-urlencoded": 415, "": 415, "application/json;;": 415,
	} {
		r := a.do("POST", "/select", `{"model_name":"model","token_ids":[1,2,3,4]}`, "Content-Type", ct)
		if r.status != status {
			t.Errorf("Content-Type %q: %d, want %d (%s)", ct, r.status, status, r.raw)
		}
		if status == 415 && r.errText() != "Expected request with `Content-Type: application/json`" {
			t.Errorf("415 text %q", r.errText())
		}
	}
	// HEAD answers like GET without a body.
	req, _ := http.NewRequest("HEAD", a.srv.URL+"/health", nil)
	res, err := a.client.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("HEAD /health: %v %v", res, err)
	}
	res.Body.Close()
	// The OpenAPI document is served.
	r := a.do("GET", "/openapi.json", nil).want(t, http.StatusOK, "")
	if r.at("openapi") != "3.0.3" {
		t.Fatal("not an OpenAPI 3.0.3 document")
	}
	if r.at("paths", "/select_and_reserve", "post") == nil {
		t.Fatal("openapi.json lacks /select_and_reserve")
	}
}

func TestAdvisoryAndHeaders(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1, "max_num_batched_tokens", 1024, "total_kv_blocks", 1000)
	r := a.do("POST", "/select", with(sel4, "advisory", true), "x-dynamo-meta-policy-class", "  latency ").want(t, http.StatusOK, "")
	if r.num("worker_load", "prefill_token_capacity") != 1024 || r.num("worker_load", "total_kv_blocks") != 1000 || r.num("worker_load", "active_prefill_tokens") != 0 {
		t.Fatalf("advisory select = %s", r.raw)
	}
	// advisory is ignored by /select_and_reserve, which always books.
	r = a.do("POST", "/select_and_reserve", with(sel4, "advisory", true, "selection_id", "adv")).want(t, http.StatusOK, "")
	if r.obj()["worker_load"] != nil || a.load0()["active_requests"] != 1.0 {
		t.Fatalf("select_and_reserve with advisory = %s", r.raw)
	}
}

func TestPolicyClassHeader(t *testing.T) {
	for in, want := range map[string]string{"latency": "latency", "  batch\t": "batch", "   ": "", "": ""} {
		r := httptest.NewRequest("POST", "/select", nil)
		if in != "" {
			r.Header.Set("x-dynamo-meta-policy-class", in)
		}
		if got := policyClass(r); got != want {
			t.Errorf("%q -> %q, want %q", in, got, want)
		}
	}
}

// fakePeers is a PeerManager for the /replica_sync routes.
type fakePeers struct {
	mu    sync.Mutex
	peers map[string]bool
	err   error
}

func (f *fakePeers) Register(ep string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return false, f.err
	}
	if f.peers[ep] {
		return false, nil
	}
	f.peers[ep] = true
	return true, nil
}

func (f *fakePeers) Deregister(ep string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if !f.peers[ep] {
		return &selection.Error{Kind: selection.KindNotFound, Message: "peer not found"}
	}
	delete(f.peers, ep)
	return nil
}

func (f *fakePeers) Peers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for p := range f.peers {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Port of replica_sync_http.rs's manages_replica_sync_peers.
func TestManagesReplicaSyncPeers(t *testing.T) {
	peers := &fakePeers{peers: map[string]bool{}}
	a := newAPI(t, nil, Options{Peers: peers})
	ep := `{"endpoint":"tcp://127.0.0.1:19092"}`
	a.do("GET", "/replica_sync/peers", nil).want(t, http.StatusOK, "[]")
	a.do("POST", "/replica_sync/register_peer", ep).want(t, http.StatusCreated, `{"status":"ok"}`)
	a.do("POST", "/replica_sync/register_peer", ep).want(t, http.StatusOK, `{"status":"ok"}`)
	a.do("GET", "/replica_sync/peers", nil).want(t, http.StatusOK, `["tcp://127.0.0.1:19092"]`)
	a.do("POST", "/replica_sync/register_peer", `{"endpoint":"invalid"}`).want(t, http.StatusBadRequest, "invalid ZMQ endpoint `invalid`: missing scheme")
	a.do("POST", "/replica_sync/deregister_peer", `{"endpoint":"tcp://[::1"}`).want(t, http.StatusBadRequest, "invalid ZMQ endpoint")
	a.do("POST", "/replica_sync/deregister_peer", ep).want(t, http.StatusOK, `{"status":"ok"}`)
	a.do("POST", "/replica_sync/deregister_peer", ep).want(t, http.StatusNotFound, `{"error":"peer not found"}`)
	a.do("POST", "/replica_sync/register_peer", `{"endpoint":5}`).want(t, http.StatusUnprocessableEntity, "endpoint: invalid type")
	peers.err = &selection.Error{Kind: selection.KindUnavailable, Message: "replica peer manager is unavailable"}
	a.do("POST", "/replica_sync/register_peer", ep).want(t, http.StatusServiceUnavailable, `{"error":"replica peer manager is unavailable"}`)
}

// kv_events_topic (a kvselect field) is stored, echoed by GET /workers,
// patched like any optional field, and omitted from records that never set
// it, so Dynamo's clients see the record they know.
func TestWorkerKVEventsTopicRoundTrip(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.do("POST", "/workers", `{"worker_id":1,"endpoint":"http://w:8000","block_size":4,"kv_events_topic":"engine-1"}`).want(t, http.StatusCreated, "")
	a.do("POST", "/workers", `{"worker_id":2,"endpoint":"http://w:8001","block_size":4}`).want(t, http.StatusCreated, "")
	r := a.do("GET", "/workers", "").want(t, http.StatusOK, "")
	if r.at(0, "kv_events_topic") != "engine-1" || strings.Count(string(r.raw), "kv_events_topic") != 1 {
		t.Fatalf("GET /workers = %s", r.raw)
	}
	a.do("PATCH", "/workers/1", `{"kv_events_topic":"engine-1b"}`).want(t, http.StatusOK, "")
	if r := a.do("GET", "/workers", "").want(t, http.StatusOK, ""); r.at(0, "kv_events_topic") != "engine-1b" {
		t.Fatalf("after PATCH: %s", r.raw)
	}
}

func TestHealthReportEjectsAndRestores(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.addWorker(2)
	for range 4 {
		a.do("POST", "/workers/1/health_report", `{"ok":false,"detail":"status 502"}`).
			want(t, http.StatusOK, `"transition":"none"`)
	}
	a.do("POST", "/workers/1/health_report", `{"ok":false,"detail":"status 502"}`).
		want(t, http.StatusOK, `"transition":"ejected"`)
	a.do("GET", "/workers", nil).want(t, http.StatusOK, `"health":{"state":"ejected","consecutive_failures":5,"ejections":1,`).
		want(t, http.StatusOK, `"not_schedulable_reasons":["ejected: 5 consecutive failures"]`).
		want(t, http.StatusOK, `"last_failure":"status 502"`)
	// A record echoed back with its output-only fields is accepted and they are not stored.
	a.do("POST", "/workers", `{"worker_id":3,"model_name":"model","endpoint":"http://w3:8000","block_size":4,"engine":"sglang","metrics_endpoint":"http://w3:9000/m","health":7,"engine_metrics":"x"}`).
		want(t, http.StatusCreated, `"engine":"sglang","metrics_endpoint":"http://w3:9000/m"`)
	for _, c := range []struct {
		method, path, body string
		status             int
		frag               string
	}{
		{"POST", "/workers/1/health_report", `{}`, http.StatusUnprocessableEntity, "missing field `ok`"},
		{"POST", "/workers/1/health_report", `{"ok":"yes"}`, http.StatusUnprocessableEntity, "invalid type"},
		{"POST", "/workers/1/health_report", `{"ok":`, http.StatusBadRequest, "EOF"},
		{"POST", "/workers/9/health_report", `{"ok":true}`, http.StatusNotFound, "worker 9 not found"},
		{"POST", "/workers/x/health_report", `{"ok":true}`, http.StatusBadRequest, ""},
		{"POST", "/workers", `{"worker_id":4,"engine":"tgi"}`, http.StatusUnprocessableEntity, "unknown variant `tgi`"},
		{"PATCH", "/workers/1", `{"engine":"tgi"}`, http.StatusUnprocessableEntity, "unknown variant `tgi`"},
		{"PATCH", "/workers/1", `{"metrics_endpoint":"zmq://x"}`, http.StatusBadRequest, "metrics_endpoint"},
	} {
		a.do(c.method, c.path, c.body).want(t, c.status, c.frag)
	}
	a.do("POST", "/workers/1/health_report", `{"ok":true}`).want(t, http.StatusOK, `"transition":"none"`) // still ejected
	a.do("GET", "/workers", nil).want(t, http.StatusOK, `"state":"ejected"`)
}
