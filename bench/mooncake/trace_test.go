package mooncake

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const shippedTrace = "../testdata/mooncake/conversation_trace.jsonl.gz"

func writeFile(t *testing.T, name, content string, gz bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	data := []byte(content)
	if gz {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(data)
		zw.Close()
		data = buf.Bytes()
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadTrace(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}

{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0, 2], "extra": "ignored"}
{"timestamp": 7, "hash_ids": []}
`
	want := []Request{
		{Timestamp: 0, InputLength: 1000, OutputLength: 10, HashIDs: []uint64{0, 1}},
		{Timestamp: 5, InputLength: 600, OutputLength: 3, HashIDs: []uint64{0, 2}},
		{Timestamp: 7, HashIDs: []uint64{}},
	}
	tests := []struct {
		name     string
		file     string
		content  string
		gz       bool
		want     []Request
		wantLine int    // >0: expect a *LineError at this line
		wantMsg  string // substring of the error
	}{
		{name: "plain", file: "t.jsonl", content: good, want: want},
		{name: "gzip", file: "t.jsonl.gz", content: good, gz: true, want: want},
		{name: "gzip without suffix", file: "t.jsonl", content: good, gz: true, want: want},
		{name: "crlf and no final newline", file: "t.jsonl", content: "{\"timestamp\":1,\"hash_ids\":[3]}\r\n{\"timestamp\":2,\"hash_ids\":[4]}",
			want: []Request{{Timestamp: 1, HashIDs: []uint64{3}}, {Timestamp: 2, HashIDs: []uint64{4}}}},
		{name: "empty", file: "t.jsonl", content: "", want: nil},
		{name: "bad json", file: "t.jsonl", content: "{\"timestamp\":1,\"hash_ids\":[1]}\n{\"timestamp\": 2,", wantLine: 2, wantMsg: "bad JSON"},
		{name: "gzip bad json", file: "t.gz", content: "\n\n[1,2]\n", gz: true, wantLine: 3, wantMsg: "bad JSON"},
		{name: "missing hash_ids", file: "t.jsonl", content: "{\"timestamp\":1,\"hash_ids\":[1]}\n{\"timestamp\":1}\n", wantLine: 2, wantMsg: `missing "hash_ids"`},
		{name: "missing timestamp", file: "t.jsonl", content: "{\"hash_ids\":[1]}\n", wantLine: 1, wantMsg: `missing "timestamp"`},
		{name: "negative hash id", file: "t.jsonl", content: "{\"timestamp\":1,\"hash_ids\":[-1]}\n", wantLine: 1, wantMsg: "bad JSON"},
		{name: "negative length", file: "t.jsonl", content: "{\"timestamp\":1,\"input_length\":-5,\"hash_ids\":[1]}\n", wantLine: 1, wantMsg: "negative input_length"},
		{name: "trailing garbage", file: "t.jsonl", content: "{\"timestamp\":1,\"hash_ids\":[1]} x\n", wantLine: 1, wantMsg: "bad JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.file, tc.content, tc.gz)
			got, err := LoadTrace(path)
			if tc.wantLine == 0 {
				if err != nil {
					t.Fatalf("LoadTrace: %v", err)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("got %+v, want %+v", got, tc.want)
				}
				return
			}
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("got error %v, want a *LineError", err)
			}
			if le.Line != tc.wantLine || le.Path != path {
				t.Errorf("error at %s:%d, want %s:%d", le.Path, le.Line, path, tc.wantLine)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q should name the file and contain %q", err, tc.wantMsg)
			}
		})
	}
}

func TestLoadTraceMissingFile(t *testing.T) {
	_, err := LoadTrace(filepath.Join(t.TempDir(), "nope.jsonl"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want an error wrapping os.ErrNotExist", err)
	}
}

func TestLoadShippedTrace(t *testing.T) {
	reqs, err := LoadTrace(shippedTrace)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12031 {
		t.Fatalf("got %d requests, want 12031", len(reqs))
	}
	first := reqs[0]
	if first.Timestamp != 0 || first.InputLength != 6758 || first.OutputLength != 500 || len(first.HashIDs) != 14 {
		t.Errorf("first request = %+v", first)
	}
	for i, r := range reqs {
		// hash_ids cover the input in 512-token blocks, the last one partial.
		if want := (r.InputLength + BlockTokens - 1) / BlockTokens; len(r.HashIDs) != want {
			t.Fatalf("request %d: %d hash ids for %d tokens", i, len(r.HashIDs), r.InputLength)
		}
		if i > 0 && r.Timestamp < reqs[i-1].Timestamp {
			t.Fatalf("request %d: timestamps go backwards", i)
		}
	}
}

func TestDuplicate(t *testing.T) {
	reqs := []Request{
		{Timestamp: 1, HashIDs: []uint64{0, 1, 2}},
		{Timestamp: 2, HashIDs: []uint64{0, 1, 4}},
	}
	tests := []struct {
		factor int
		want   [][]uint64
	}{
		{0, [][]uint64{{0, 1, 2}, {0, 1, 4}}},
		{1, [][]uint64{{0, 1, 2}, {0, 1, 4}}},
		{2, [][]uint64{{0, 1, 2}, {5, 6, 7}, {0, 1, 4}, {5, 6, 9}}},
		{3, [][]uint64{{0, 1, 2}, {5, 6, 7}, {10, 11, 12}, {0, 1, 4}, {5, 6, 9}, {10, 11, 14}}},
	}
	for _, tc := range tests {
		got := Duplicate(reqs, tc.factor)
		var ids [][]uint64
		for i, r := range got {
			ids = append(ids, r.HashIDs)
			if wantTS := reqs[i/max(tc.factor, 1)].Timestamp; r.Timestamp != wantTS {
				t.Errorf("factor %d: request %d timestamp %d, want %d", tc.factor, i, r.Timestamp, wantTS)
			}
		}
		if !reflect.DeepEqual(ids, tc.want) {
			t.Errorf("factor %d: got %v, want %v", tc.factor, ids, tc.want)
		}
	}
	if reqs[0].HashIDs[0] != 0 || reqs[1].HashIDs[2] != 4 {
		t.Error("Duplicate modified its input")
	}
}

// TestArrivals checks when each request is sent: at the trace's times
// divided by compress, or evenly at rate.
func TestArrivals(t *testing.T) {
	reqs := []Request{{Timestamp: 1000}, {Timestamp: 1000}, {Timestamp: 3000}, {Timestamp: 9000}}
	for _, tc := range []struct {
		name           string
		compress, rate float64
		want           []time.Duration
	}{
		{"trace", 1, 0, []time.Duration{0, 0, 2 * time.Second, 8 * time.Second}},
		{"trace compressed", 20, 0, []time.Duration{0, 0, 100 * time.Millisecond, 400 * time.Millisecond}},
		{"steady", 20, 4, []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := Arrivals(reqs, tc.compress, tc.rate)
			for i, want := range tc.want {
				if got := at(i); got != want {
					t.Errorf("request %d sent at %v, want %v", i, got, want)
				}
			}
		})
	}
}
