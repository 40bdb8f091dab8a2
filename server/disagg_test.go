package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/mockworker"
)

// The server end to end: a worker registered with role prefill joins the
// --prefill-routing-group group, the picker names it in --prefill-header,
// the decisions are counted on /metrics, and the prefill pool emptying is
// logged once.
func TestDisaggregationEndToEnd(t *testing.T) {
	rest, ep, logs := startPicker(t, "--prefill-routing-group", "pf", "--prefill-header", "x-my-prefiller")
	post := func(body string) {
		t.Helper()
		res, err := http.Post("http://"+rest+"/workers", "application/json", strings.NewReader(body))
		if err != nil || res.StatusCode/100 != 2 {
			t.Fatalf("register: %v %v", res, err)
		}
		res.Body.Close()
	}
	post(`{"worker_id":2,"model_name":"m","endpoint":"http://10.0.0.2:8000","block_size":4,"role":"prefill"}`)
	conn := dialPicker(t, ep, insecure.NewCredentials())
	pick := func() *envoysim.Decision {
		t.Helper()
		x, d, err := envoysim.New(conn).Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`)})
		if err != nil || d.Immediate != nil {
			t.Fatalf("start: %v %+v", err, d)
		}
		x.Close()
		return d
	}
	if d := pick(); d.Endpoint != "10.0.0.1:8000" || d.SetHeaders["x-my-prefiller"] != "10.0.0.2:8000" || d.SetHeaders[extproc.HeaderPrefillEndpoint] != "10.0.0.2:8000" {
		t.Fatalf("decision %s, headers %v", d.Endpoint, d.SetHeaders)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+rest+"/workers/2", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("delete: %v %v", res, err)
	}
	res.Body.Close()
	for range 2 {
		if d := pick(); d.SetHeaders["x-my-prefiller"] != "" {
			t.Fatalf("a prefiller without a prefill pool: %v", d.SetHeaders)
		}
	}
	m := get(t, "http://"+rest+"/metrics")
	for _, want := range []string{
		`kvselect_prefill_decisions_total{decision="remote_prefill",reason="conditional_disagg_disabled"} 1`,
		`kvselect_prefill_decisions_total{decision="local_prefill",reason="no_prefill_workers"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	proctest.Eventually(t, "the pool transition in the log", 5*time.Second, func() bool {
		return strings.Count(logs.String(), "prefill pool cannot take requests") == 1
	})
}

func TestDisaggregationFlagsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--disaggregation", "always"}, `--disaggregation "always": want auto or off`},
		{[]string{"--prefill-routing-group", " "}, "--prefill-routing-group: empty group name"},
		{[]string{"--prefill-header", "X-Prefiller"}, `--prefill-header "X-Prefiller": want a lower-case HTTP header name`},
		{[]string{"--prefill-header", ""}, `--prefill-header "": want`},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.want)
		}
	}
	o, err := parseFlags([]string{"--disaggregation", "off", "--prefill-routing-group", "prefill-pool", "--prefill-header", "x-p"})
	if err != nil || o.disagg != (disaggFlags{prefillGroup: "prefill-pool", mode: disaggOff, prefillHeader: "x-p"}) {
		t.Fatalf("%+v %v", o.disagg, err)
	}
}

// Real mock workers behind the picker, through an Envoy-like relay: remote
// prefills happen on the prefill worker; the prefill pool emptying mid-run
// turns them into local prefills without a single failed request (logged
// once, and once again when it comes back); a prefill worker that fails
// makes the decode worker answer 502, and the end of that exchange frees
// both bookings. Every booking is gone at the end.
func TestDisaggregationFaultsWithMockWorkers(t *testing.T) {
	srv := runInBackground(t, withoutKVEvents, []string{"--eject-after", "0"})
	rest := "http://" + srv.addrs.REST.String()
	worker := func(id uint64, role string) (*mockworker.Worker, *httptest.Server) {
		t.Helper()
		w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: id, BlockSize: 4, Role: role, Speedup: 20,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(w.Handler())
		t.Cleanup(func() { hs.Close(); w.Close() })
		return w, hs
	}
	register := func(id uint64, role, url string) {
		t.Helper()
		res, err := http.Post(rest+"/workers", "application/json", strings.NewReader(
			fmt.Sprintf(`{"worker_id":%d,"model_name":"m","endpoint":%q,"block_size":4,"role":%q}`, id, url, role)))
		if err != nil || res.StatusCode/100 != 2 {
			t.Fatalf("register %d: %v %v", id, res, err)
		}
		res.Body.Close()
	}
	pw, ps := worker(10, mockworker.RolePrefill)
	dw, ds := worker(20, mockworker.RoleDecode)
	register(10, "prefill", ps.URL)
	register(20, "decode", ds.URL)

	rl := &relay.Relay{Picker: envoysim.New(dialPicker(t, srv.addrs.ExtProc.String(), insecure.NewCredentials())), HTTP: http.DefaultClient}
	n := 0
	send := func() (relay.Result, error) {
		n++ // a new prompt each time: nothing cached anywhere
		prompt := strings.Repeat(fmt.Sprintf("%d,", n), 39) + "7"
		return rl.Do(t.Context(), "/v1/completions", []byte(`{"model":"m","prompt":[`+prompt+`],"max_tokens":3,"stream":true}`))
	}
	sendOK := func(wantPrefiller string) {
		t.Helper()
		res, err := send()
		if err != nil {
			t.Fatalf("request %d: %v", n, err)
		}
		if got := res.Decision.SetHeaders[extproc.HeaderPrefiller]; got != wantPrefiller || res.Decision.Endpoint != strings.TrimPrefix(ds.URL, "http://") {
			t.Fatalf("request %d: routed to %s with prefiller %q, want %s with %q", n, res.Decision.Endpoint, got, ds.URL, wantPrefiller)
		}
	}
	counts := func(w *mockworker.Worker) mockworker.PDCounts { return w.PDCounts()[0] }

	// The prefill pool at work.
	for range 3 {
		sendOK(strings.TrimPrefix(ps.URL, "http://"))
	}
	if p, d := counts(pw), counts(dw); p.RemoteDecodes != 3 || d.RemotePrefills != 3 || d.ComputedPrefill != 0 {
		t.Fatalf("after 3 remote prefills: prefill worker %+v, decode worker %+v", p, d)
	}

	// The prefill worker leaves (what the mock's SIGTERM does: deregister,
	// then stop): local prefills, no failure.
	req, _ := http.NewRequest(http.MethodDelete, rest+"/workers/10", nil)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("delete: %v %v", res, err)
	} else {
		res.Body.Close()
	}
	ps.Close()
	for range 3 {
		sendOK("")
	}
	if d := counts(dw); d.RemotePrefills != 3 || d.ComputedPrefill != 3*40 {
		t.Fatalf("after 3 local prefills: decode worker %+v", d)
	}

	// Back again, on a new address.
	pw2, ps2 := worker(10, mockworker.RolePrefill)
	register(10, "prefill", ps2.URL)
	sendOK(strings.TrimPrefix(ps2.URL, "http://"))
	if p := counts(pw2); p.RemoteDecodes != 1 {
		t.Fatalf("the returned prefill worker: %+v", p)
	}

	// The prefill worker fails its prefills: the decode worker answers 502
	// and the exchange's end frees the prefill booking with the decode one.
	if err := pw2.SetFaults(mockworker.Faults{FailRate: 1}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res, err := send()
		if err == nil || res.Status != http.StatusBadGateway || !strings.Contains(err.Error(), "prefill worker") {
			t.Fatalf("request %d with a failing prefill worker: status %d, %v", n, res.Status, err)
		}
	}

	var loads []struct {
		RoutingGroup string `json:"routing_group"`
		Loads        []struct {
			WorkerID       uint64 `json:"worker_id"`
			ActiveRequests uint64 `json:"active_requests"`
			PrefillTokens  uint64 `json:"potential_prefill_tokens"`
			DecodeBlocks   uint64 `json:"potential_decode_blocks"`
		} `json:"loads"`
	}
	proctest.Eventually(t, "every booking freed", 5*time.Second, func() bool {
		res, err := http.Get(rest + "/loads")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		if json.NewDecoder(res.Body).Decode(&loads) != nil || len(loads) != 2 {
			return false
		}
		for _, g := range loads {
			for _, l := range g.Loads {
				if l.ActiveRequests+l.PrefillTokens+l.DecodeBlocks != 0 {
					return false
				}
			}
		}
		return true
	})
	logs := srv.logs.String()
	if c, u := strings.Count(logs, "prefill pool cannot take requests"), strings.Count(logs, "prefill pool usable again"); c != 1 || u != 1 {
		t.Errorf("pool transitions logged %d and %d times, want once each", c, u)
	}
	m := get(t, rest+"/metrics")
	for _, want := range []string{
		`kvselect_prefill_decisions_total{decision="remote_prefill",reason="conditional_disagg_disabled"} 6`,
		`kvselect_prefill_decisions_total{decision="local_prefill",reason="no_prefill_workers"} 3`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
