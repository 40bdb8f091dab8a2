package extproc

import (
	"bytes"
	"encoding/binary"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseBody(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		tokens  []uint32
		text    string
		model   string
		stream  bool
		osl     uint32
		session string
		err     string
	}{
		{name: "empty", body: ""},
		{name: "whitespace", body: " \n"},
		{name: "chat", body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true}`,
			text: "system\nbe brief\nuser\nhi\n", model: "m", stream: true},
		{name: "chat parts and images", body: `{"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"http://i/1.png"}}]}]}`,
			text: "user\nlookhttp://i/1.png\n"},
		{name: "chat null content", body: `{"messages":[{"role":"assistant","content":null}]}`, text: "assistant\n\n"},
		{name: "completion text", body: `{"prompt":"once upon"}`, text: "once upon"},
		{name: "completion tokens", body: `{"prompt":[1,2,3]}`, tokens: []uint32{1, 2, 3}},
		{name: "completion batch tokens", body: `{"prompt":[[4,5],[6]]}`, tokens: []uint32{4, 5}},
		{name: "completion batch text", body: `{"prompt":["a","b"]}`, text: "a"},
		{name: "empty prompt array", body: `{"prompt":[],"messages":[{"role":"user","content":"x"}]}`, text: "user\nx\n"},
		{name: "nvext", body: `{"messages":[{"role":"user","content":"x"}],"nvext":{"token_data":[9,8],"agent_hints":{"osl":77,"priority":1},"session_control":{"session_id":"s1","action":"open"}}}`,
			tokens: []uint32{9, 8}, osl: 77, session: "s1"},
		{name: "prompt ids before nvext", body: `{"prompt":[1],"nvext":{"token_data":[9,8]}}`, tokens: []uint32{1}},
		{name: "unknown fields skipped", body: `{"temperature":0.2,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"prompt":"p"}`, text: "p"},
		{name: "not json", body: `hello`, err: "invalid request body"},
		{name: "array body", body: `[1,2]`, err: "invalid request body"},
		{name: "truncated", body: `{"model":"m"`, err: "invalid request body"},
		{name: "model of wrong type", body: `{"model":7}`, err: "invalid request body"},
		{name: "prompt object", body: `{"prompt":{}}`, err: "prompt must be"},
		{name: "token too large", body: `{"prompt":[4294967296]}`, err: "token ids"},
		{name: "negative token", body: `{"prompt":[[-1]]}`, err: "token ids"},
		{name: "content number", body: `{"messages":[{"role":"user","content":5}]}`, err: "messages[0].content"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseBody([]byte(tc.body), "")
			if tc.err != "" {
				if err == nil || !errors.Is(err, errBadBody) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want errBadBody containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.tokens, tc.tokens) || got.text != tc.text || got.model != tc.model || got.stream != tc.stream || got.session != tc.session {
				t.Fatalf("got %+v", got)
			}
			if (got.osl == nil) != (tc.osl == 0) || (got.osl != nil && *got.osl != tc.osl) {
				t.Fatalf("osl %v, want %d", got.osl, tc.osl)
			}
		})
	}
}

// FuzzParseBody: any byte string is either a body error or a parse whose
// identity is one of tokens / text, never a panic.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"prompt":[1,2]}`, `{"prompt":[[1],[2]]}`, `{"prompt":["a"]}`, `{"prompt":"x"}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"t"}]}]}`, `{"nvext":{"token_data":[1],"agent_hints":{"osl":3}}}`,
		`{"model":"m","stream":true,"prompt":null}`, `{"prompt":[`, `{"messages":[{"content":"\ud800"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseBody(b, "")
		if err != nil {
			if !errors.Is(err, errBadBody) {
				t.Fatalf("error without errBadBody: %v", err)
			}
			if !utf8.ValidString(err.Error()) && utf8.Valid(b) {
				t.Fatalf("error message is not UTF-8: %q", err.Error())
			}
			return
		}
		if got.tokens != nil && got.text != "" {
			t.Fatalf("both tokens and text: %+v", got)
		}
	})
}

func TestTokenCounter(t *testing.T) {
	var c tokenCounter
	c.feed([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi"))
	c.feed([]byte("ces\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n: comment\nevent: x\n"))
	if c.tokens() != 2 {
		t.Fatalf("%d tokens, want 2 (one event split across chunks, CRLF)", c.tokens())
	}
	c.feed([]byte("data: {\"choices\":[],\"usage\":{\"completion_tokens\":40}}\n\ndata: [DONE]\n\n"))
	if c.tokens() != 40 {
		t.Fatalf("%d tokens, want usage's 40", c.tokens())
	}
	var long tokenCounter
	long.feed([]byte("data: " + strings.Repeat("x", maxSSELine)))
	long.feed([]byte(strings.Repeat("y", 10) + "\ndata: {}\n"))
	if long.tokens() != 2 || len(long.carry) != 0 {
		t.Fatalf("over-long line: %d tokens, carry %d", long.tokens(), len(long.carry))
	}
}

func TestParseTargets(t *testing.T) {
	ts := parseTargets([]string{"10.0.0.1", " 10.0.0.2:8001 ", "[fd00::1]:9000", ""})
	if len(ts) != 3 || !ts[0].matches("10.0.0.1:1234") || !ts[1].matches("10.0.0.2:8001") || ts[1].matches("10.0.0.2:8000") || !ts[2].matches("[fd00::1]:9000") {
		t.Fatalf("targets %+v", ts)
	}
}

// FuzzScanTokenIDs: wherever the one-pass prompt scanner answers, its token
// ids are encoding/json's for the same bytes; and a plain array of ids in
// range is always taken by the scanner.
func FuzzScanTokenIDs(f *testing.F) {
	for _, s := range []string{`[]`, `[0]`, `[1,2,3]`, ` [ 4294967295 , 0 ] `, `[4294967296]`, `[01]`, `[-1]`, `[1.0]`, `[1e3]`,
		`[1,]`, `[,1]`, `[1 2]`, `[1]x`, `["1"]`, `[[1]]`, "[\n1,\t2\r]", `[00]`, `[12345678901]`,
		`[1234567,12345678,123456789,4294967295,0,7,  9  ,1000000]    `, `[4294967296,1,2,3,4,5,6,7,8]`, `[12345670x,1,2,3,4,5,6]`,
		`[0123456,1,2,3,4,5,6,7,8]`, `[1,2,3,4,5,6,7,8,9,10,11,12]` + strings.Repeat(" ", 8)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := scanTokenIDs(b)
		var want []uint32
		stdErr := stdjson.Unmarshal(b, &want)
		if ok {
			if stdErr != nil {
				t.Fatalf("scanner took %q (%v), encoding/json rejects it: %v", b, got, stdErr)
			}
			if !slices.Equal(got, want) || got == nil {
				t.Fatalf("scanner %v, encoding/json %v for %q", got, want, b)
			}
			return
		}
		if stdErr == nil && want != nil && !bytes.ContainsAny(b, "-.eE+\"") && plainArray(b) {
			t.Fatalf("scanner refused a plain array of token ids %q (encoding/json: %v)", b, want)
		}
	})
}

// plainArray: b is "[" ids separated by commas "]" with JSON whitespace and
// no leading zeros, as the scanner's doc promises to take.
func plainArray(b []byte) bool {
	s := strings.Trim(string(b), " \t\r\n")
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return false
	}
	inner := strings.Trim(s[1:len(s)-1], " \t\r\n")
	if inner == "" {
		return true
	}
	for _, f := range strings.Split(inner, ",") {
		f = strings.Trim(f, " \t\r\n")
		if f == "" || (len(f) > 1 && f[0] == '0') {
			return false
		}
		for _, c := range f {
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	return true
}

func BenchmarkParseBody(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","stream":true,"prompt":[`)
	for j := 0; sb.Len() < 4090; j++ {
		if j > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(100000 + j))
	}
	sb.WriteString("]}")
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if pb, err := parseBody(body, ""); err != nil || len(pb.tokens) == 0 {
			b.Fatal(err)
		}
	}
}

func TestParseBodyMode(t *testing.T) {
	for in, want := range map[string]string{"full_duplex_streamed": "FULL_DUPLEX_STREAMED", "Buffered": "BUFFERED", " none ": "NONE",
		"streamed": "STREAMED", "BUFFERED_PARTIAL": "BUFFERED_PARTIAL"} {
		got, err := ParseBodyMode(in)
		if err != nil || got.String() != want {
			t.Errorf("ParseBodyMode(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "duplex", "4"} {
		if _, err := ParseBodyMode(in); err == nil || !strings.Contains(err.Error(), "full_duplex_streamed") {
			t.Errorf("ParseBodyMode(%q) = %v, want an error listing the modes", in, err)
		}
	}
}

// BenchmarkParseBodyLong parses long-context bodies (the step of a pick
// before hashing): completions prompts of 100k and 1M token ids of a 128k
// vocabulary, and chat bodies of the same length in text (four characters a
// token, with newlines and quotes to unescape), rendered to the text the
// text index hashes.
func BenchmarkParseBodyLong(b *testing.B) {
	for _, c := range []struct {
		name   string
		tokens int
		text   bool
	}{{"tokens-100k", 100_000, false}, {"text-100k", 100_000, true}, {"tokens-1m", 1_000_000, false}, {"text-1m", 1_000_000, true}} {
		b.Run(c.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			var body []byte
			if c.text {
				var sb strings.Builder
				for range c.tokens {
					w := []byte{byte('a' + rng.IntN(26)), byte('a' + rng.IntN(26)), byte('a' + rng.IntN(26)), ' '}
					switch rng.IntN(17) {
					case 0:
						w[3] = '\n'
					case 1:
						w[2] = '"'
					}
					sb.Write(w)
				}
				q, _ := stdjson.Marshal(sb.String())
				body = fmt.Appendf(nil, `{"model":"m","stream":true,"messages":[{"role":"user","content":%s}]}`, q)
			} else {
				body = []byte(`{"model":"m","stream":true,"prompt":[`)
				for j := range c.tokens {
					if j > 0 {
						body = append(body, ',')
					}
					body = strconv.AppendUint(body, uint64(rng.IntN(128_000)), 10)
				}
				body = append(body, "]}"...)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				pb, err := parseBody(body, "")
				if err != nil || (len(pb.tokens) != c.tokens && pb.text == "") {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDigits8 holds the eight-byte digit reader to a byte-by-byte one on
// every run length and on bytes around the digits' range.
func TestDigits8(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	alphabet := []byte("0123456789/:,] \n[-.eE\"\x00\xff\xf9\xfa")
	for range 200_000 {
		var b [8]byte
		for j := range b {
			if rng.IntN(3) > 0 {
				b[j] = byte('0' + rng.IntN(10))
			} else {
				b[j] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		wantN, wantV := 0, uint64(0)
		for wantN < 8 && b[wantN] >= '0' && b[wantN] <= '9' {
			wantV = wantV*10 + uint64(b[wantN]-'0')
			wantN++
		}
		n, v := digits8(binary.LittleEndian.Uint64(b[:]))
		if n != wantN || (n < 8 && v != wantV) {
			t.Fatalf("digits8(%q) = %d, %d; want %d, %d", b, n, v, wantN, wantV)
		}
	}
}

// TestScanTokenIDsForms: ids of every length, packed or spaced, read as
// the ids they spell, across the eight-byte reads' borders.
func TestScanTokenIDsForms(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for range 3000 {
		n := 1 + rng.IntN(40)
		ids := make([]uint32, n)
		var packed, spaced []byte
		packed, spaced = append(packed, '['), append(spaced, '[')
		for j := range ids {
			switch rng.IntN(4) {
			case 0:
				ids[j] = rng.Uint32N(10)
			case 1:
				ids[j] = rng.Uint32N(100_000_000) // up to 8 digits: one read
			case 2:
				ids[j] = rng.Uint32() // up to 10 digits: the byte loop
			default:
				ids[j] = rng.Uint32N(200_000)
			}
			if j > 0 {
				packed = append(packed, ',')
				spaced = append(spaced, " \n\t"[rng.IntN(3)], ',', ' ')
			}
			packed = strconv.AppendUint(packed, uint64(ids[j]), 10)
			spaced = strconv.AppendUint(spaced, uint64(ids[j]), 10)
		}
		packed, spaced = append(packed, ']'), append(spaced, " ]"...)
		for _, b := range [][]byte{packed, spaced, append(slices.Clone(packed), "   "...)} {
			got, ok := scanTokenIDs(b)
			if !ok || !slices.Equal(got, ids) {
				t.Fatalf("%s: %v %v, want %v", b, got, ok, ids)
			}
		}
	}
	for _, bad := range []string{`[1,,2]`, `[1,]`, `[,1]`, `[01,2]`, `[1,02]`, `[123456789012,1]`, `[1,2x]`, `[1,-2]`, `[1.5,2]`} {
		if got, ok := scanTokenIDs([]byte(bad)); ok {
			t.Fatalf("%s read as %v", bad, got)
		}
	}
}
