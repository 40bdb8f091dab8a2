package replicas

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/report"
)

// TestRunCompletes runs both modes briefly: the harness books, mirrors (with
// sync) and samples. The figures themselves are measurements, not asserted.
func TestRunCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock experiment")
	}
	for _, sync := range []bool{false, true} {
		res, err := Run(context.Background(), Config{Duration: 300 * time.Millisecond, Clients: 2, Sync: sync})
		if err != nil {
			t.Fatal(err)
		}
		if res.Bookings == 0 || res.Samples == 0 || res.RequestsMaxOverMean < 1 {
			t.Fatalf("sync=%v: %+v", sync, res)
		}
		if sync != (res.Mirrored > 0) {
			t.Fatalf("sync=%v but %d mirrored events", sync, res.Mirrored)
		}
	}
}

func TestSpread(t *testing.T) {
	for _, c := range []struct {
		xs     []float64
		mm, cv float64
		ok     bool
	}{
		{[]float64{1, 1, 1, 1}, 1, 0, true},
		{[]float64{4, 0, 0, 0}, 4, 1.7320508075688772, true},
		{[]float64{0, 0}, 0, 0, false},
	} {
		mm, cv, ok := spread(c.xs)
		if ok != c.ok || mm != c.mm || cv != c.cv {
			t.Errorf("spread(%v) = %v %v %v, want %v %v %v", c.xs, mm, cv, ok, c.mm, c.cv, c.ok)
		}
	}
}

func TestReplicasPrintsBothModes(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock experiment")
	}
	out := filepath.Join(t.TempDir(), "replicas.json")
	var stdout, stderr bytes.Buffer
	all, err := Compare(context.Background(), Config{Workers: 8, PrefixBlocks: 32, SuffixBlocks: 8, Clients: 2, Duration: 200 * time.Millisecond,
		Prefill: 2 * time.Millisecond, Decode: 8 * time.Millisecond, Seed: 1}, 1, &stderr)
	if err == nil {
		err = Table(&stdout, all)
	}
	if err == nil {
		err = report.WriteJSON(out, all)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"req max/mean", "sync off (mean)", "sync on (mean)", "one replica (mean)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rs []map[string]any
	if err := json.Unmarshal(b, &rs); err != nil || len(rs) != 3 || rs[0]["sync"] != false || rs[1]["sync"] != true || rs[2]["single"] != true {
		t.Fatalf("json %s (%v)", b, err)
	}
}
