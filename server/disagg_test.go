package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
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
	res, err = http.Get("http://" + rest + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`kvselect_prefill_decisions_total{decision="remote_prefill",reason="conditional_disagg_disabled"} 1`,
		`kvselect_prefill_decisions_total{decision="local_prefill",reason="no_prefill_workers"} 2`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	waitFor(t, "the pool transition in the log", 5*time.Second, func() bool {
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
