package extproc

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// liftCases are bodies the lift must read exactly as the decoder does: what
// it lifts, what it leaves to the decoder, and what it must refuse to touch.
var liftCases = []struct {
	name string
	body string
	// lifted: the prompt, input_ids, token_ids and token_data ids the lift
	// reads (nil: none); none: the lift declines the whole body.
	prompt, inputIDs, tokenIDs, tokenData []uint32
	none                                  bool
}{
	{name: "prompt", body: `{"model":"m","prompt":[1,2,3],"stream":true}`, prompt: []uint32{1, 2, 3}},
	{name: "whitespace", body: " {\n\"prompt\" : [ 4 ,\t5 ]\r}\n", prompt: []uint32{4, 5}},
	{name: "max id", body: `{"prompt":[4294967295,0]}`, prompt: []uint32{4294967295, 0}},
	{name: "input_ids", body: `{"input_ids":[7,8],"sampling_params":{"max_new_tokens":3}}`, inputIDs: []uint32{7, 8}},
	{name: "token_ids", body: `{"token_ids":[9],"sampling_params":{"max_tokens":3}}`, tokenIDs: []uint32{9}},
	{name: "nvext token_data", body: `{"nvext":{"agent_hints":{"osl":5},"token_data":[1,2],"session_control":{"session_id":"s"}},"messages":[]}`,
		tokenData: []uint32{1, 2}},
	{name: "prompt and token_data", body: `{"nvext":{"token_data":[3]},"prompt":[1,2]}`, prompt: []uint32{1, 2}, tokenData: []uint32{3}},
	{name: "every id field at once", body: `{"token_ids":[6],"prompt":[1,2,3],"nvext":{"token_data":[7]},"input_ids":[4,5]}`,
		prompt: []uint32{1, 2, 3}, inputIDs: []uint32{4, 5}, tokenIDs: []uint32{6}, tokenData: []uint32{7}},
	{name: "key case folded like the decoder's", body: `{"PROMPT":[1,2]}`, prompt: []uint32{1, 2}},
	{name: "strings with quotes and brackets skipped", body: `{"x":"a\"],[{\\","y":["]",{"z":"}"}],"prompt":[6]}`, prompt: []uint32{6}},
	{name: "batch left to the decoder", body: `{"prompt":[[1,2],[3]]}`, none: true},
	{name: "empty array left", body: `{"prompt":[]}`, none: true},
	{name: "leading zero left", body: `{"prompt":[01]}`, none: true},
	{name: "negative left", body: `{"prompt":[-1]}`, none: true},
	{name: "too large left", body: `{"prompt":[4294967296]}`, none: true},
	{name: "float left", body: `{"prompt":[1.0]}`, none: true},
	{name: "string prompt", body: `{"prompt":"[1,2]"}`, none: true},
	{name: "prompt inside another field", body: `{"x":{"prompt":[1,2]}}`, none: true},
	{name: "sent twice", body: `{"prompt":[1],"prompt":[2]}`, none: true},
	{name: "sent twice in other case", body: `{"prompt":[1],"Prompt":[2]}`, none: true},
	{name: "escaped key", body: `{"pr\u006fmpt":[1,2]}`, none: true},
	{name: "non-ASCII key", body: `{"promptſ":[1,2],"prompt":[3]}`, none: true},
	{name: "nvext twice", body: `{"nvext":{"token_data":[1]},"nvext":{}}`, none: true},
	{name: "not an object", body: `[1,2]`, none: true},
	{name: "trailing garbage", body: `{"prompt":[1]} x`, none: true},
	{name: "missing comma", body: `{"a":1 "prompt":[1]}`, none: true},
	{name: "unterminated", body: `{"prompt":[1,2]`, none: true},
}

func TestLiftTokenIDs(t *testing.T) {
	for _, c := range liftCases {
		t.Run(c.name, func(t *testing.T) {
			reduced, ids, ok := liftTokenIDs([]byte(c.body), nil)
			if ok == c.none {
				t.Fatalf("lifted %v (%+v), want %v", ok, ids, !c.none)
			}
			if !ok {
				return
			}
			want := liftedIDs{prompt: c.prompt, inputIDs: c.inputIDs, tokenIDs: c.tokenIDs, tokenData: c.tokenData}
			if !reflect.DeepEqual(ids, want) {
				t.Fatalf("lifted %+v, want %+v", ids, want)
			}
			if strings.Count(string(reduced), "[]")-strings.Count(c.body, "[]") != nonNil(ids) {
				t.Fatalf("reduced body %s", reduced)
			}
			assertSameParse(t, []byte(c.body))
		})
	}
}

func nonNil(ids liftedIDs) int {
	n := 0
	for _, v := range [][]uint32{ids.prompt, ids.inputIDs, ids.tokenIDs, ids.tokenData} {
		if v != nil {
			n++
		}
	}
	return n
}

// assertSameParse: lifting changes nothing a body parses to, on any path,
// nor any error.
func assertSameParse(t *testing.T, b []byte) {
	t.Helper()
	for _, path := range []string{"", "/v1/completions", "/generate", "/inference/v1/generate", "/v1/messages"} {
		got, gotErr := parseBodyLifting(b, path, 0, nil)
		want, wantErr := parseBodyLifting(b, path, -1, nil)
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("path %q: error %v lifting, %v without", path, gotErr, wantErr)
		}
		if gotErr != nil && !errors.Is(gotErr, errBadBody) {
			t.Fatalf("path %q: error without errBadBody: %v", path, gotErr)
		}
		// A lifted slice may have spare capacity; only the ids matter.
		if !slices.Equal(got.tokens, want.tokens) || (got.tokens == nil) != (want.tokens == nil) {
			t.Fatalf("path %q: tokens %v lifting, %v without", path, got.tokens, want.tokens)
		}
		got.tokens, want.tokens = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("path %q: parsed %+v lifting, %+v without", path, got, want)
		}
	}
}

// FuzzLiftTokenIDs holds the lift to the decoder: every body parses to the
// same request, or the same error, with and without it.
func FuzzLiftTokenIDs(f *testing.F) {
	for _, c := range liftCases {
		f.Add([]byte(c.body))
	}
	for _, s := range []string{`{"prompt":[1,2],"nvext":{"token_data":[3,4],"osl":1}}`, `{"input_ids":[1],"text":"x"}`,
		`{"token_ids":[1,2],"sampling_params":{}}`, `{"prompt":[1,2],"messages":[{"role":"user","content":"hi"}]}`,
		`{"prompt":[1, 2 ],"model":"m\"x","stream":true}`, `{"prompt":[1],"nvext":null}`, `{"nvext":{"token_data":[1],"token_data":[2]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		assertSameParse(t, b)
	})
}
