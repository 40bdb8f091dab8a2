package access

import (
	"net/http"
	"strings"
	"testing"
)

// FuzzParseTokens: any file either parses into entries that each name at
// least one known scope and keep no token text, or is an error naming a
// line; it never panics.
func FuzzParseTokens(f *testing.F) {
	f.Add([]byte(readToken + " read,select name=a expires=2030-01-01T00:00:00Z\n# c\n" + adminToken + " admin\n"))
	f.Add([]byte("x read\n"))
	f.Add([]byte(strings.Repeat("a", 20) + " read,,admin\r\n\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseTokens(data)
		if err != nil {
			if len(entries) != 0 {
				t.Fatal("entries returned with an error")
			}
			return
		}
		for _, e := range entries {
			if e.scopes == 0 || e.scopes&^Scopes(Read|Select|Admin) != 0 {
				t.Fatalf("entry with scopes %b", e.scopes)
			}
			if e.name == "" {
				t.Fatal("entry without a name")
			}
		}
	})
}

// FuzzBearerToken: a header either yields a token of RFC 6750's syntax
// that appears in it, or an error; it never panics.
func FuzzBearerToken(f *testing.F) {
	f.Add("Bearer " + readToken)
	f.Add("bearer  abc==")
	f.Add("Basic x")
	f.Add("Bearer a b")
	f.Fuzz(func(t *testing.T, value string) {
		h := http.Header{"Authorization": {value}}
		tok, present, err := BearerToken(h)
		if !present {
			t.Fatal("a header that is there is not present")
		}
		if err != nil {
			return
		}
		if checkTokenSyntax(tok) != nil || !strings.Contains(value, tok) {
			t.Fatalf("token %q from %q", tok, value)
		}
	})
}
