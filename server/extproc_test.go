package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/logwatch"
)

// extprocAddr returns the ext_proc startup line's addr from JSON logs.
func extprocAddr(logs string) (string, bool) {
	return logwatch.Attr(logs, "ext_proc listening", "addr")
}

// The picker runs beside the REST API over the same service: a worker
// registered over REST is picked over ext_proc, the booking shows in /loads
// while the response streams, and shutdown reports NOT_SERVING and stops.
func TestExtProcServesBesideREST(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs logBuffer
	done := make(chan error, 1)
	go func() {
		done <- runWith(ctx, []string{"--host", "127.0.0.1", "--port", "0", "--log-format", "json", "--extproc-fallbacks", "1"},
			func(k string) (string, bool) {
				if k == "DYN_ROUTER_USE_KV_EVENTS" {
					return "false", true
				}
				return "", false
			}, &bytes.Buffer{}, &logs)
	}()
	var rest, ep string
	waitFor(t, "both startup log lines", 10*time.Second, func() bool {
		var ok1, ok2 bool
		rest, ok1 = listeningAddr(logs.String())
		ep, ok2 = extprocAddr(logs.String())
		return ok1 && ok2
	})
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
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancel")
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
