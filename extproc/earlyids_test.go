package extproc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// earlyIDList writes n ids of a 128k vocabulary separated by sep.
func earlyIDList(rng *rand.Rand, n int, sep string) string {
	ids := make([]string, n)
	for k := range ids {
		ids[k] = strconv.Itoa(rng.IntN(128_000))
	}
	return strings.Join(ids, sep)
}

// earlyCases are bodies whose ids may be read as they arrive: the prompt
// in every form, other arrays and text before it, and the faults a body
// may hold anywhere in its ids. Each is parsed as before whatever its
// chunks (TestEarlyIDsParseAsBefore).
func earlyCases() []struct{ name, body string } {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := func(n int) string { return earlyIDList(rng, n, ",") }
	long := ids(3000)
	return []struct{ name, body string }{
		{"packed prompt", `{"model":"m","stream":true,"prompt":[` + long + `]}`},
		{"python prompt", `{"model": "m", "prompt": [` + earlyIDList(rng, 3000, ", ") + `]}`},
		{"indented prompt", "{\n  \"prompt\": [\n    " + earlyIDList(rng, 2000, ",\n    ") + "\n  ]\n}"},
		{"prompt before the model", `{"prompt":[` + long + `],"model":"m","max_tokens":7}`},
		{"stop ids before the prompt", `{"stop_token_ids":[128001,128009],"prompt":[` + long + `]}`},
		{"long other array before the prompt", `{"logprobs_ids":[` + ids(500) + `],"prompt":[` + long + `]}`},
		{"ids in text before the prompt", `{"suffix":"see [1,2,3,` + ids(300) + ` and more","prompt":[` + long + `]}`},
		{"ids in text only", `{"messages":[{"role":"user","content":"[` + ids(2000) + `]"}]}`},
		{"nvext token_data", `{"messages":[{"role":"user","content":"x"}],"nvext":{"token_data":[` + long + `]}}`},
		{"input_ids", `{"input_ids":[` + long + `],"sampling_params":{"max_new_tokens":3}}`},
		{"batch", `{"prompt":[[` + long + `],[1,2]]}`},
		{"sent twice", `{"prompt":[` + long + `],"prompt":[5]}`},
		{"nine digits late", `{"prompt":[` + long + `,123456789,` + ids(100) + `]}`},
		{"ten digits late", `{"prompt":[` + long + `,4294967295,` + ids(100) + `]}`},
		{"too large late", `{"prompt":[` + long + `,4294967296,` + ids(100) + `]}`},
		{"leading zero late", `{"prompt":[` + long + `,012,` + ids(100) + `]}`},
		{"negative late", `{"prompt":[` + long + `,-12,` + ids(100) + `]}`},
		{"float late", `{"prompt":[` + long + `,1.5,` + ids(100) + `]}`},
		{"exponent late", `{"prompt":[` + long + `,1e3,` + ids(100) + `]}`},
		{"string late", `{"prompt":[` + long + `,"12",` + ids(100) + `]}`},
		{"empty id late", `{"prompt":[` + long + `,,` + ids(100) + `]}`},
		{"trailing comma", `{"prompt":[` + long + `,]}`},
		{"space before a comma late", `{"prompt":[` + long + ` ,` + ids(100) + `]}`},
		{"unterminated", `{"prompt":[` + long},
		{"unterminated after a comma", `{"prompt":[` + long + `,`},
		{"not closed", `{"prompt":[` + long + `]`},
		{"trailing garbage", `{"prompt":[` + long + `]} x`},
		{"not an object", `[` + long + `]`},
	}
}

// TestEarlyIDsParseAsBefore: a body whose ids were read as it arrived, in
// chunks of any size, parses to what it parses to read at once, and fails
// with the same error.
func TestEarlyIDsParseAsBefore(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, c := range earlyCases() {
		t.Run(c.name, func(t *testing.T) {
			for _, chunk := range []int{1, 7, 64, 100, 1000, 16 << 10, len(c.body)} {
				assertSameEarlyParse(t, []byte(c.body), func(int) int { return chunk })
			}
			for range 20 {
				assertSameEarlyParse(t, []byte(c.body), func(int) int { return 1 + rng.IntN(3000) })
			}
		})
	}
}

// TestEarlyIDsRead: where the early read gets to in a packed prompt, and
// that its ids are the prompt's.
func TestEarlyIDsRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	list := earlyIDList(rng, 5000, ",")
	body := []byte(`{"model":"m","stop":[7],"prompt":[` + list + `]}`)
	var e earlyIDs
	for end := 1000; end < len(body); end += 1000 {
		e.advance(body[:end], len(body))
	}
	open := strings.Index(string(body), `"prompt":[`) + len(`"prompt":`)
	if !e.active || e.open != open {
		t.Fatalf("candidate at %d (active %v), want the prompt's at %d", e.open, e.active, open)
	}
	if left := len(body) - e.next; left > 1000+72 {
		t.Fatalf("%d bytes left unread before the last chunk", left)
	}
	want, _, _ := scanIDArray(body, open)
	if !slices.Equal(e.tokens, want[:len(e.tokens)]) {
		t.Fatalf("early ids differ from the prompt's")
	}
	got, end, ok := scanIDArrayFrom(body, open, &e)
	if wantEnd := len(body) - 1; !ok || end != wantEnd || !slices.Equal(got, want) {
		t.Fatalf("read on: %d ids, end %d, %v; want %d ids, end %d", len(got), end, ok, len(want), wantEnd)
	}
}

// TestGrowIDs: room for what is asked, the estimate taken when larger,
// and growth by half again at least.
func TestGrowIDs(t *testing.T) {
	for _, c := range []struct {
		len, cap, more, estimate int
		wantCap                  int
	}{
		{0, 0, 10, 0, 10},
		{5, 10, 5, 0, 10},      // fits: unchanged
		{5, 10, 6, 0, 15},      // half again
		{5, 10, 20, 0, 25},     // what is asked
		{5, 10, 6, 100, 100},   // the estimate
		{5, 10, 200, 100, 205}, // what is asked, above the estimate
	} {
		ids := make([]uint32, c.len, c.cap)
		for k := range ids {
			ids[k] = uint32(k + 1)
		}
		got := growIDs(nil, ids, c.more, c.estimate)
		if cap(got) != c.wantCap || !slices.Equal(got, ids) {
			t.Errorf("growIDs(len %d cap %d, %d, %d): cap %d, want %d", c.len, c.cap, c.more, c.estimate, cap(got), c.wantCap)
		}
	}
}

// assertSameEarlyParse feeds b to an early read in chunks of next(i)
// bytes, all but the last (the stream reads ids until the body's end), and
// parses it going on from there and at once, on every path.
func assertSameEarlyParse(t *testing.T, b []byte, next func(int) int) {
	t.Helper()
	var e earlyIDs
	for end := 0; ; {
		end = min(end+next(end), len(b))
		if end == len(b) {
			break
		}
		e.advance(b[:end], len(b))
	}
	for _, path := range []string{"", "/v1/completions", "/generate", "/v1/messages"} {
		want, wantErr := parseBody(b, path)
		// As the stream parses, and lifting at any size (a short body
		// reaches the early ids only so).
		for _, liftFrom := range []int{liftMin, 0} {
			early := e // a parse may take its ids: each its own copy
			early.tokens = slices.Clone(e.tokens)
			got, gotErr := parseBodyLifting(b, path, liftFrom, &early)
			assertSameParsed(t, path, got, want, gotErr, wantErr)
		}
	}
}

// assertSameParsed fails when a body read early parsed differently.
func assertSameParsed(t *testing.T, path string, got, want parsedBody, gotErr, wantErr error) {
	t.Helper()
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("path %q: error %v reading early, %v at once", path, gotErr, wantErr)
	}
	if gotErr != nil && !errors.Is(gotErr, errBadBody) {
		t.Fatalf("path %q: error without errBadBody: %v", path, gotErr)
	}
	if !slices.Equal(got.tokens, want.tokens) || (got.tokens == nil) != (want.tokens == nil) {
		t.Fatalf("path %q: %d tokens reading early, %d at once%s", path, len(got.tokens), len(want.tokens), firstDiff(got.tokens, want.tokens))
	}
	got.tokens, want.tokens = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("path %q: parsed %+v reading early, %+v at once", path, got, want)
	}
}

// FuzzEarlyIDs holds the early read to the parse at once on any body and
// any chunking (the first byte of the input picks the chunk size). Each
// body is also tried behind a long packed prompt's start, so that the
// fuzzer's bytes land inside and after an array being read early.
func FuzzEarlyIDs(f *testing.F) {
	for _, c := range earlyCases() {
		if len(c.body) < 4000 {
			f.Add(byte(50), []byte(c.body))
		}
	}
	for _, s := range []string{`{"prompt":[1,2,3]}`, `{"prompt":[1, 2, 3],"model":"m"}`, `{"stop":[1],"prompt":[2,3]}`,
		`{"prompt":[1,-2]}`, `{"prompt":[1,2]`, `{"x":"[1,2,3","prompt":[4]}`, `{"nvext":{"token_data":[1,2]}}`} {
		f.Add(byte(7), []byte(s))
	}
	lead := `{"model":"m","prompt":[` + strings.Repeat("123456,7,", 20)
	f.Fuzz(func(t *testing.T, size byte, b []byte) {
		chunk := func(int) int { return 1 + int(size) }
		assertSameEarlyParse(t, b, chunk)
		if len(b) > 0 {
			assertSameEarlyParse(t, append([]byte(lead), b...), chunk)
		}
	})
}

// TestEarlyIDsEstimate: the room taken for the ids follows their density,
// and never passes a quarter of the announced length, however large.
func TestEarlyIDsEstimate(t *testing.T) {
	for _, c := range []struct {
		name                    string
		open, next, read, total int
		want                    int
	}{
		{"nothing read", 10, 11, 0, 1000, 0},
		{"unknown length", 10, 1010, 100, 0, 0},
		{"length already reached", 10, 1010, 100, 1010, 0},
		{"dense as read", 0, 1000, 100, 10_000, 1125},
		{"a quarter at most", 0, 1000, 400, 10_000, 2500},
		{"huge length", 0, 1000, 400, 1 << 62, 1 << 60},
	} {
		e := earlyIDs{open: c.open, next: c.next, tokens: make([]uint32, c.read), active: true}
		if got := e.estimate(c.total); got != c.want {
			t.Errorf("%s: estimate %d, want %d", c.name, got, c.want)
		}
	}
}
