package server

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/proctest"
)

func queueingEnv(k string) (string, bool) {
	switch k {
	case "DYN_ROUTER_USE_KV_EVENTS":
		return "false", true
	case "DYN_ROUTER_QUEUE_THRESHOLD":
		return "0.5", true
	}
	return "", false
}

// The server end to end with --flow-control: a request waits in its band
// and tenant while the worker is busy (GET /flow and /metrics show it), a
// sheddable one is a 429, and the waiter is routed once the worker frees.
func TestFlowControlEndToEnd(t *testing.T) {
	srv := runInBackground(t, queueingEnv, []string{"--flow-control", "cost", "--flow-queue-ttl", "1m"})
	rest := "http://" + srv.addrs.REST.String()
	client := oneBusyWorker(t, srv)
	body := func(base string) []byte {
		return []byte(`{"model":"m","prompt":[` + base + `1,` + base + `2,` + base + `3,` + base + `4,` + base + `5,` + base + `6,` + base + `7,` + base + `8]}`)
	}
	blocker, d, err := client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: body("1")})
	if err != nil || d.Immediate != nil {
		t.Fatalf("blocker: %v %+v", err, d)
	}
	routed := make(chan *envoysim.Exchange, 1)
	go func() {
		x, d, err := client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: body("2"), Headers: []envoysim.Header{
			{Key: extproc.HeaderFairnessID, Value: "acme"}, {Key: extproc.HeaderPriority, Value: "2"}}})
		if err != nil || d.Immediate != nil {
			t.Errorf("waiter: %v %+v", err, d)
		}
		routed <- x
	}()
	proctest.Eventually(t, "the waiter in GET /flow", 5*time.Second, func() bool {
		return strings.Contains(get(t, rest+"/flow"), `"tenant":"acme","queued":1`)
	})
	if m := get(t, rest+"/metrics"); !strings.Contains(m, `kvselect_flow_queued_requests{model="m",priority="2",routing_group="default",tenant_bucket="`+tenantBucket("acme")+`"} 1`) {
		t.Errorf("/metrics lacks the queued request:\n%s", grepLines(m, "kvselect_flow_"))
	}
	_, d, err = client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: body("3"), Headers: []envoysim.Header{{Key: extproc.HeaderPriority, Value: "-5"}}})
	if err != nil || d.Immediate == nil || d.Immediate.Status != 429 {
		t.Fatalf("sheddable: %v %+v", err, d)
	}
	blocker.Close()
	(<-routed).Close()
	m := get(t, rest+"/metrics")
	for _, want := range []string{
		`kvselect_flow_wait_seconds_count{model="m",outcome="dispatched",priority="2",routing_group="default",tenant_bucket="` + tenantBucket("acme") + `"} 1`,
		`kvselect_flow_wait_seconds_count{model="m",outcome="shed",priority="-5",routing_group="default",tenant_bucket="` + tenantBucket("default-flow") + `"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "kvselect_flow_wait_seconds_count"))
		}
	}
	if !strings.Contains(srv.logs.String(), "flow control on") {
		t.Error("no startup line for flow control")
	}
}

// oneBusyWorker registers one worker that a single 8-token prompt makes
// busy (max_num_batched_tokens 8, queue threshold 0.5) and returns a picker
// client.
func oneBusyWorker(t *testing.T, srv *background) *envoysim.Client {
	t.Helper()
	res, err := http.Post("http://"+srv.addrs.REST.String()+"/workers", "application/json",
		strings.NewReader(`{"worker_id":1,"model_name":"m","endpoint":"http://10.0.0.1:8000","block_size":4,"max_num_batched_tokens":8}`))
	if err != nil || res.StatusCode/100 != 2 {
		t.Fatalf("register: %v %v", res, err)
	}
	res.Body.Close()
	return envoysim.New(dialPicker(t, srv.addrs.ExtProc.String(), insecure.NewCredentials()))
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestFlowFlagsValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--flow-control", "wfq"}, `--flow-control "wfq": want off, cost, count or fifo`},
		{[]string{"--flow-queue-ttl", "0s"}, "--flow-queue-ttl must be positive"},
		{[]string{"--flow-max-bytes", "-1"}, "must not be negative"},
		{[]string{"--flow-max-tenants", "0"}, "--flow-max-tenants must be positive"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.want)
		}
	}
	// On without queueing: nothing would ever wait, so it is refused.
	status, _, stderr := runArgs(t, "--port", "0", "--flow-control", "count")
	if status != 2 || !strings.Contains(stderr, "DYN_ROUTER_QUEUE_THRESHOLD") {
		t.Errorf("flow control without queueing: exit %d, %s", status, stderr)
	}
	for _, p := range []struct {
		p    int
		want string
	}{{-11, "<-10"}, {-10, "-10"}, {0, "0"}, {10, "10"}, {11, ">10"}} {
		if got := priorityLabel(p.p); got != p.want {
			t.Errorf("priorityLabel(%d) = %s", p.p, got)
		}
	}
}

// The config file's objectives give a request naming one in
// x-llm-d-inference-objective its priority; GET /flow lists them; a
// reload replaces them and a file with a bad one changes nothing.
func TestFlowObjectivesFromTheConfigFile(t *testing.T) {
	config := filepath.Join(t.TempDir(), "kvselect.yaml")
	write := func(body string) { writeAtomically(t, config, body) }
	write("objectives:\n  premium: 7\n  batch: -1\n")
	reload := make(chan struct{})
	srv := runInBackground(t, queueingEnv, []string{"--flow-control", "cost", "--config", config}, WithReload(reload))
	rest := "http://" + srv.addrs.REST.String()
	if got := get(t, rest+"/flow"); !strings.Contains(got, `"objectives":{"batch":-1,"premium":7}`) {
		t.Fatalf("GET /flow: %s", got)
	}
	client := oneBusyWorker(t, srv)
	body := []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`)
	blocker, d, err := client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: body})
	if err != nil || d.Immediate != nil {
		t.Fatalf("blocker: %v %+v", err, d)
	}
	// batch is sheddable: a 429 at once while the worker is busy.
	_, d, err = client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: body,
		Headers: []envoysim.Header{{Key: extproc.HeaderObjective, Value: "batch"}}})
	if err != nil || d.Immediate == nil || d.Immediate.Status != 429 {
		t.Fatalf("batch while busy: %v %+v", err, d)
	}
	routed := make(chan *envoysim.Exchange, 1)
	go func() {
		x, d, err := client.Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: body,
			Headers: []envoysim.Header{{Key: extproc.HeaderObjective, Value: "premium"}}})
		if err != nil || d.Immediate != nil {
			t.Errorf("premium: %v %+v", err, d)
		}
		routed <- x
	}()
	proctest.Eventually(t, "premium waiting at priority 7", 5*time.Second, func() bool {
		return strings.Contains(get(t, rest+"/flow"), `"priority":7`)
	})
	blocker.Close()
	(<-routed).Close()

	write("objectives:\n  premium: 2\n")
	reload <- struct{}{}
	proctest.Eventually(t, "the reloaded objectives", 10*time.Second, func() bool {
		return strings.Contains(get(t, rest+"/flow"), `"objectives":{"premium":2}`)
	})
	write("objectives:\n  premium: 2000000\n")
	reload <- struct{}{}
	proctest.Eventually(t, "the bad file's reload failure logged", 10*time.Second, func() bool {
		return strings.Contains(srv.logs.String(), "objectives.premium: priority 2000000 is out of range")
	})
	if got := get(t, rest+"/flow"); !strings.Contains(got, `"objectives":{"premium":2}`) {
		t.Fatalf("a bad file changed the objectives: %s", got)
	}
}

func TestFlowObjectivesFileValidation(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"objectives:\n  premium: 1000001\n", "objectives.premium: priority 1000001 is out of range"},
		{"objectives:\n  \"\": 1\n", `objective name "": want 1 to 256 bytes`},
		{"objectives:\n  \"a\\tb\": 1\n", "not printable"},
		{"objectives:\n  premium: high\n", "configFile.objectives of type int"},
		{"objectives:\n  " + strings.Repeat("x", 257) + ": 1\n", "want 1 to 256 bytes"},
	} {
		path := filepath.Join(t.TempDir(), "kvselect.yaml")
		if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		status, _, stderr := runArgs(t, "--port", "0", "--config", path)
		if status != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %s; want %q", tc.body, status, stderr, tc.want)
		}
	}
}
