package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const trace = "../../bench/testdata/mooncake/conversation_trace.jsonl.gz"

func TestIndexReplayPrintsTableAndJSON(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"index", "-trace", trace, "-max", "300", "-workers", "4", "-blocks", "256", "-json", out, "-svg", out + ".svg"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"kvselect", "combined ops/s", "lookup p99 ns", "4 workers x 256 blocks"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Results []struct{ Requests, RemovedBlocks int }
	}
	if err := json.Unmarshal(b, &v); err != nil || len(v.Results) != 1 || v.Results[0].Requests != 300 || v.Results[0].RemovedBlocks == 0 {
		t.Fatalf("json = %s (err %v)", b, err)
	}
	checkSVG(t, out+".svg", "Lookup latency")
}

// checkSVG asserts path is well-formed XML that mentions want.
func checkSVG(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
	}
	if !bytes.Contains(b, []byte(want)) {
		t.Fatalf("%s lacks %q", path, want)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"nope"},
		{"index", "-assign", "sticky", "-trace", trace},
		{"index", "-trace", "/does/not/exist"},
		{"index", "-bogus-flag"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("%v: want an error", args)
		}
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), nil, &stdout, &stdout); err != nil || !strings.Contains(stdout.String(), "usage") {
		t.Fatalf("no args: %v %q", err, stdout.String())
	}
}
