package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/logwatch"
)

// The picker runs beside the REST API over the same service: a worker
// registered over REST is picked over ext_proc, the booking shows in /loads
// while the response streams, and shutdown reports NOT_SERVING and stops.
func TestExtProcServesBesideREST(t *testing.T) {
	ctx := t.Context()
	srv := runInBackground(t, withoutKVEvents, []string{"--extproc-fallbacks", "1"})
	rest, ep := srv.addrs.REST.String(), srv.addrs.ExtProc.String()
	if logged, ok := logwatch.Attr(srv.logs.String(), "ext_proc listening", "addr"); !ok || logged != ep {
		t.Errorf("ext_proc startup log names %q, want %s", logged, ep)
	}
	for i, host := range []string{"10.0.0.1:8000", "10.0.0.2:8000"} {
		body := `{"worker_id":` + string(rune('1'+i)) + `,"model_name":"m","endpoint":"http://` + host + `","block_size":4}`
		res, err := http.Post("http://"+rest+"/workers", "application/json", strings.NewReader(body))
		if err != nil || res.StatusCode/100 != 2 {
			t.Fatalf("register: %v %v", res, err)
		}
		res.Body.Close()
	}
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	x, d, err := envoysim.New(conn).Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if d.Immediate != nil || len(d.Fallbacks) != 1 || !strings.HasPrefix(d.Endpoint, "10.0.0.") {
		t.Fatalf("decision %+v", d)
	}
	res, err := http.Get("http://" + rest + "/loads")
	if err != nil {
		t.Fatal(err)
	}
	var loads []struct {
		Loads []struct {
			ActiveRequests int `json:"active_requests"`
		} `json:"loads"`
	}
	_ = json.NewDecoder(res.Body).Decode(&loads)
	res.Body.Close()
	active := 0
	for _, m := range loads {
		for _, l := range m.Loads {
			active += l.ActiveRequests
		}
	}
	if active != 1 {
		t.Fatalf("/loads shows %d active requests during the response, want 1", active)
	}
	x.Close()

	hc := healthpb.NewHealthClient(conn)
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
	if err := srv.stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestExtProcFlagsValidate(t *testing.T) {
	for _, args := range [][]string{{"--extproc-port", "70000"}, {"--extproc-fallbacks", "-1"}, {"--extproc-fallbacks", "33"}, {"--extproc-max-body-bytes", "0"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	o, err := parseFlags([]string{"--extproc-port", "0", "--extproc-test-pick-header", "--extproc-default-model", "m"})
	if err != nil || o.extproc.port != 0 || !o.extproc.testPick || o.extproc.defaultModel != "m" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, tc := range []struct {
		args []string
		want extprocFlags
	}{
		{[]string{"--extproc-secure-serving"}, extprocFlags{secure: true}},
		{[]string{"--extproc-secure-serving", "--extproc-cert-path", "/etc/tls"}, extprocFlags{secure: true, certPath: "/etc/tls"}},
		{[]string{"--extproc-secure-serving", "--extproc-cert-path", "/etc/tls", "--extproc-cert-reload"}, extprocFlags{secure: true, certPath: "/etc/tls", certReload: true}},
	} {
		o, err := parseFlags(tc.args)
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if got := o.extproc; got.secure != tc.want.secure || got.certPath != tc.want.certPath || got.certReload != tc.want.certReload {
			t.Errorf("%v: parsed %+v", tc.args, got)
		}
	}
}

// TestSessionFlags: --session-headers is an ordered, lower-cased list (blank:
// none), checked by the picker's rules; the environment fills a flag not
// given and never overrides one given.
func TestSessionFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil || o.extproc.sessionHeaders != nil || o.extproc.sessionAsTenant {
		t.Fatalf("defaults: %+v %v", o.extproc, err)
	}
	o, err = parseFlags([]string{"--session-headers", " X-Correlation-ID , x-dynamo-session-id", "--session-as-fairness-id"})
	if err != nil || !slices.Equal(o.extproc.sessionHeaders, []string{"x-correlation-id", "x-dynamo-session-id"}) || !o.extproc.sessionAsTenant {
		t.Fatalf("parsed %+v %v", o.extproc, err)
	}
	if o, err = parseFlags([]string{"--session-headers", ""}); err != nil || o.extproc.sessionHeaders == nil || len(o.extproc.sessionHeaders) != 0 {
		t.Fatalf("blank list: %#v %v", o.extproc.sessionHeaders, err)
	}
	for _, bad := range []string{"a,,b", "x-dynamo-session-final", "a b", "a,a", "x-kvselect-token-ids"} {
		if _, err := parseFlags([]string{"--session-headers", bad}); err == nil {
			t.Errorf("--session-headers %q accepted", bad)
		}
	}

	env := func(kv ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	o, _ = parseFlags(nil)
	if err := o.extproc.sessionsFromEnv(o.set, env(envSessionHeaders, "x-correlation-id", envSessionAsTenant, "true")); err != nil ||
		!slices.Equal(o.extproc.sessionHeaders, []string{"x-correlation-id"}) || !o.extproc.sessionAsTenant {
		t.Fatalf("from the environment: %+v %v", o.extproc, err)
	}
	o, _ = parseFlags([]string{"--session-headers", "x-dynamo-session-id", "--session-as-fairness-id=false"})
	if err := o.extproc.sessionsFromEnv(o.set, env(envSessionHeaders, "x-correlation-id", envSessionAsTenant, "true")); err != nil ||
		!slices.Equal(o.extproc.sessionHeaders, []string{"x-dynamo-session-id"}) || o.extproc.sessionAsTenant {
		t.Fatalf("the flags must win: %+v %v", o.extproc, err)
	}
	for _, kv := range [][]string{{envSessionHeaders, "x-dynamo-session-final"}, {envSessionAsTenant, "maybe"}} {
		o, _ = parseFlags(nil)
		var ue *UsageError
		if err := o.extproc.sessionsFromEnv(o.set, env(kv...)); !errors.As(err, &ue) || !strings.Contains(err.Error(), kv[0]) {
			t.Errorf("%s=%s: %v, want a usage error naming it", kv[0], kv[1], err)
		}
	}
}

// TestSessionHeadersReachThePicker: the flag's list is the running picker's,
// as its startup log says.
func TestSessionHeadersReachThePicker(t *testing.T) {
	srv := runInBackground(t, withoutKVEvents, []string{"--session-headers", "X-Correlation-Id,x-kvselect-session-id", "--session-as-fairness-id"})
	logs := srv.logs.String()
	if got, ok := logwatch.Attr(logs, "ext_proc listening", "session_headers"); !ok || got != "x-correlation-id,x-kvselect-session-id" {
		t.Errorf("startup log's session_headers = %q", got)
	}
	if !strings.Contains(logs, `"session_as_fairness_id":true`) {
		t.Errorf("startup log lacks session_as_fairness_id true:\n%s", logs)
	}
	if err := srv.stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}
