package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/proctest"
)

// GET /metrics carries the picker's series (kvselect_extproc_*) next to the
// Go runtime's, and they move with the traffic; --enable-pprof serves the
// runtime profiles on the same port.
func TestMetricsAndPprofEndToEnd(t *testing.T) {
	rest, ep, _ := startPicker(t, "--enable-pprof")
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	x, d, err := envoysim.New(conn).Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"m","prompt":[1,2,3,4,5]}`)})
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
	proctest.Eventually(t, "the booking freed at the stream's end in /metrics", 10*time.Second, func() bool {
		return strings.Contains(get("/metrics"), `kvselect_extproc_bookings_freed_total{at="stream_end"} 1`)
	})
	m := get("/metrics")
	for _, want := range []string{
		"kvselect_extproc_routed_total 1",
		"kvselect_extproc_streams_total 1",
		"kvselect_extproc_pick_duration_seconds_count 1",
		`kvselect_selection_decisions_total{model="m"`,
		`kvselect_selection_best_cached_tokens_total{model="m"`,
		"go_goroutines ",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(get("/debug/pprof/heap?debug=1"), "heap profile") {
		t.Error("--enable-pprof: no heap profile")
	}
}
