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
