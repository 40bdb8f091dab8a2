package tokenize

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseResponseAcceptsOnlyAUsableTokenList(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want []uint32
		err  error
	}{
		{"vllm", `{"count":3,"max_model_len":4096,"tokens":[1,2,4294967295],"token_strs":null}`, []uint32{1, 2, 4294967295}, nil},
		{"no count", `{"tokens":[7]}`, []uint32{7}, nil},
		{"count mismatch", `{"count":2,"tokens":[7]}`, nil, errBadResponse},
		{"empty list", `{"count":0,"tokens":[]}`, nil, errBadResponse},
		{"no tokens", `{"count":1}`, nil, errBadResponse},
		{"null tokens", `{"tokens":null}`, nil, errBadResponse},
		{"string tokens", `{"tokens":"1,2"}`, nil, errBadResponse},
		{"negative id", `{"tokens":[-1]}`, nil, errBadResponse},
		{"id over uint32", `{"tokens":[4294967296]}`, nil, errBadResponse},
		{"float id", `{"tokens":[1.5]}`, nil, errBadResponse},
		{"not json", `<html>502 Bad Gateway</html>`, nil, errBadResponse},
		{"array body", `[1,2,3]`, nil, errBadResponse},
		{"truncated", `{"tokens":[1,2`, nil, errBadResponse},
		{"over the cap", `{"tokens":[` + strings.Repeat("1,", 10) + `1]}`, nil, errTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseResponse([]byte(tc.body), 10)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %v, %v; want %v", got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseResponse holds the parser to encoding/json: whatever an engine
// answers, ParseResponse does not panic, and a list it accepts is what
// encoding/json reads from the same body, within the cap.
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{`{"count":2,"tokens":[1,2]}`, `{"tokens":[]}`, `{"tokens":[1,`, `null`, `{"tokens":[4294967295]}`,
		`{"count":-1,"tokens":[0]}`, `{"tokens":[1e3]}`, `{"tokens":[0,0,0,0,0,0,0,0,0,0,0,0,0]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const maxTokens = 8
		ids, err := ParseResponse(body, maxTokens)
		if err != nil {
			return
		}
		if len(ids) == 0 || len(ids) > maxTokens {
			t.Fatalf("accepted %d tokens", len(ids))
		}
		var ref struct {
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(body, &ref); err != nil {
			// goccy and encoding/json differ on a few malformed inputs
			// (invalid UTF-8 in strings elsewhere in the body); the ids
			// must still be well-formed.
			return
		}
		if !slices.Equal(ids, ref.Tokens) {
			t.Fatalf("parsed %v, encoding/json reads %v", ids, ref.Tokens)
		}
	})
}
