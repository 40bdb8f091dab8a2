package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
)

// GET /metrics carries the picker's series (kvselect_extproc_*) next to the
// Go runtime's, and they move with the traffic; --enable-pprof serves the
// runtime profiles on the same port.
func TestMetricsAndPprofEndToEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs logBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--host", "127.0.0.1", "--port", "0", "--log-format", "json", "--enable-pprof"},
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
	res, err := http.Post("http://"+rest+"/workers", "application/json",
		strings.NewReader(`{"worker_id":1,"model_name":"m","endpoint":"http://10.0.0.1:8000","block_size":4}`))
	if err != nil || res.StatusCode/100 != 2 {
		t.Fatalf("register: %v %v", res, err)
	}
	res.Body.Close()
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	x, d, err := envoysim.New(conn).Start(ctx, &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"m","prompt":[1,2,3,4,5]}`)})
	if err != nil || d.Immediate != nil {
		t.Fatalf("start: %v %+v", err, d)
	}
	x.Close()

	get := func(path string) string {
		t.Helper()
		res, err := http.Get("http://" + rest + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
		}
		return string(b)
	}
	waitFor(t, "the booking freed at the stream's end in /metrics", 10*time.Second, func() bool {
		return strings.Contains(get("/metrics"), `kvselect_extproc_bookings_freed_total{at="stream_end"} 1`)
	})
	m := get("/metrics")
	for _, want := range []string{
		"kvselect_extproc_routed_total 1",
		"kvselect_extproc_streams_total 1",
		"kvselect_extproc_pick_duration_seconds_count 1",
		"go_goroutines ",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(get("/debug/pprof/heap?debug=1"), "heap profile") {
		t.Error("--enable-pprof: no heap profile")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
