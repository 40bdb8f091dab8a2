package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplicasPrintsBothModes(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock experiment")
	}
	out := filepath.Join(t.TempDir(), "replicas.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"replicas", "-runs", "1", "-duration", "200ms", "-clients", "2", "-json", out}, &stdout, &stderr)
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
