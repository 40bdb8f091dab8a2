package mooncake

import (
	"slices"
	"strings"
	"testing"
)

// Trace blocks become words: requests sharing a prefix of blocks share a
// text prefix ending at a word boundary, and every block is blockTokens words.
func TestTextSharesPrefixesByBlock(t *testing.T) {
	a, b := Text([]uint64{1, 2, 3}, 4), Text([]uint64{1, 2, 9}, 4)
	ab := Text([]uint64{1, 2}, 4)
	if !strings.HasPrefix(a, ab+" ") || !strings.HasPrefix(b, ab+" ") || a == b {
		t.Fatalf("no shared two-block prefix:\n%s\n%s\n%s", a, b, ab)
	}
	if n := len(strings.Fields(a)); n != 12 {
		t.Fatalf("%d words for 3 blocks of 4", n)
	}
	if Text([]uint64{1, 2, 3}, 4) != a {
		t.Fatal("not deterministic")
	}
}

// Token prompts share a prefix exactly as far as their blocks do.
func TestTokensSharePrefixesByBlock(t *testing.T) {
	a, b := Tokens([]uint64{1, 2, 3}, 4), Tokens([]uint64{1, 2, 9}, 4)
	if len(a) != 12 || !slices.Equal(a[:8], b[:8]) || slices.Equal(a[8:], b[8:]) {
		t.Fatalf("%v\n%v", a, b)
	}
}

// A slice is Requests requests after Offset, all of the rest when Requests
// is 0; an offset past the end is an error naming the trace's length.
func TestSliceLoad(t *testing.T) {
	const trace = "../testdata/mooncake/conversation_trace.jsonl.gz"
	all, err := LoadTrace(trace)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		s     Slice
		first int
		n     int
	}{
		{Slice{Trace: trace, Requests: 10}, 0, 10},
		{Slice{Trace: trace, Requests: 10, Offset: 5}, 5, 10},
		{Slice{Trace: trace}, 0, len(all)},
		{Slice{Trace: trace, Requests: 10, Offset: len(all) - 3}, len(all) - 3, 3},
	} {
		got, err := tc.s.Load()
		if err != nil || len(got) != tc.n || got[0].Timestamp != all[tc.first].Timestamp {
			t.Errorf("%+v: %d requests, %v", tc.s, len(got), err)
		}
	}
	if _, err := (Slice{Trace: trace, Offset: len(all)}).Load(); err == nil || !strings.Contains(err.Error(), "-offset") {
		t.Errorf("offset past the end: %v", err)
	}
}
