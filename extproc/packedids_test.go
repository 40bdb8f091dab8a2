package extproc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// scanIDArrayBefore is scanIDArray as it was before scanPackedIDs (commit
// 32b5e0e): the reference the differential tests hold the scanner to.
func scanIDArrayBefore(b []byte, i int) (tokens []uint32, end int, ok bool) {
	if i >= len(b) || b[i] != '[' {
		return nil, 0, false
	}
	// A plain array ends at its first ']': its commas size the slice
	// exactly (both searches are vectorized; the scan below is not).
	close := bytes.IndexByte(b[i:], ']')
	if close < 0 {
		return nil, 0, false
	}
	n := i + close + 1
	tokens = make([]uint32, 0, bytes.Count(b[i:n], []byte{','})+1)
	i = skipWS(b, i+1)
	if b[i] == ']' {
		return tokens, i + 1, true
	}
	for {
		start := i
		var v, w uint64
		l := 8
		if i+8 <= len(b) {
			// Most ids are shorter than 8 digits: read them 8 bytes at
			// a time.
			w = binary.LittleEndian.Uint64(b[i:])
			l, v = digits8(w)
			i += l
		}
		if l < 8 && byte(w>>(8*l)) == ',' && l > 0 && v <= 1<<32-1 && (l == 1 || b[start] != '0') {
			// The comma is in the word just read: the next id's start
			// is known without loading it again, which shortens the
			// chain of dependent loads the scan is.
			tokens = append(tokens, uint32(v))
			i++
			if c := b[i]; c == ' ' || c == '\n' || c == '\t' || c == '\r' {
				i = skipWS(b, i)
			}
			continue
		}
		if l == 8 {
			i, v = start, 0
			for i < n {
				d := b[i] - '0'
				if d > 9 {
					break
				}
				v = v*10 + uint64(d)
				i++
			}
		}
		if l := i - start; l == 0 || l > 10 || v > 1<<32-1 || (b[start] == '0' && l > 1) {
			return nil, 0, false
		}
		tokens = append(tokens, uint32(v))
		for i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
			i++
		}
		if i == n {
			return nil, 0, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return tokens, i + 1, true
		default:
			return nil, 0, false
		}
	}
}

// TestNonDigits64 holds the 64-byte separator mask to a byte-by-byte test,
// over every byte value at every position.
func TestNonDigits64(t *testing.T) {
	rng := rand.New(rand.NewPCG(64, 64))
	var c [64]byte
	for round := range 4096 {
		for k := range c {
			switch {
			case round < 256:
				c[k] = byte(round) // every value everywhere, then mixes
			case rng.IntN(2) == 0:
				c[k] = byte('0' + rng.IntN(10))
			default:
				c[k] = byte(rng.UintN(256))
			}
		}
		var want uint64
		for k, x := range c {
			if x < '0' || x > '9' {
				want |= 1 << k
			}
		}
		if got := nonDigits64(&c); got != want {
			t.Fatalf("nonDigits64(%q) = %064b, want %064b", c, got, want)
		}
	}
}

// TestPackedValue: the value of one to eight digits, whatever follows them
// in the word.
func TestPackedValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 1))
	for range 100_000 {
		l := 1 + rng.IntN(8)
		var w [8]byte
		for k := range w {
			w[k] = byte(rng.UintN(256))
		}
		for k := range l {
			w[k] = byte('0' + rng.IntN(10))
		}
		want, _ := strconv.ParseUint(string(w[:l]), 10, 64)
		if got := packedValue(binary.LittleEndian.Uint64(w[:]), l); got != want {
			t.Fatalf("packedValue(%q, %d) = %d, want %d", w, l, got, want)
		}
	}
}

// idArrayForms are the ways the differential tests write an id array:
// separators, id sizes and the faults a body may hold.
var idArrayForms = []struct {
	name string
	sep  func(*rand.Rand) string // between two ids, around the comma
	id   func(*rand.Rand) string
}{
	{"packed", constSep(","), vocabID},
	{"python", constSep(", "), vocabID},
	{"indented", constSep(",\n    "), vocabID},
	{"crlf tabs", constSep(",\r\n\t\t"), vocabID},
	{"space before comma", constSep(" ,"), vocabID},
	{"mixed whitespace", func(r *rand.Rand) string {
		return strings.Repeat(" \n\t\r"[r.IntN(4):][:1], r.IntN(2)) + "," + strings.Repeat(" \n\t\r"[r.IntN(4):][:1], r.IntN(3))
	}, vocabID},
	{"any uint32", constSep(","), func(r *rand.Rand) string { return strconv.FormatUint(uint64(r.Uint32()), 10) }},
	{"every length", constSep(","), func(r *rand.Rand) string {
		return strconv.FormatUint(r.Uint64N(1_000_000_0000)>>r.UintN(34), 10)
	}},
	{"small", constSep(","), func(r *rand.Rand) string { return strconv.Itoa(r.IntN(10)) }},
}

func constSep(s string) func(*rand.Rand) string { return func(*rand.Rand) string { return s } }

func vocabID(r *rand.Rand) string { return strconv.Itoa(r.IntN(128_000)) }

// idArrayFaults replace one id of a valid array: each must be refused (or,
// for the last ones, read) exactly as before.
var idArrayFaults = []string{"", "01", "00", "0", "-1", "1.0", "1e3", "1E3", "+1", "4294967295", "4294967296", "9999999999",
	"12345678901", "123456789", "1234567890", `"1"`, "[1]", "null", "true", "1 2", "1,,2", "1\x00", "1\xff", "١", "0x1", ",", "]"}

// TestScanIDArrayMatchesBefore holds scanIDArray to scanIDArrayBefore on
// arrays of every form and length (short ones too, where only the old loop
// runs), with and without one fault at a random place, and cut short.
func TestScanIDArrayMatchesBefore(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, f := range idArrayForms {
		t.Run(f.name, func(t *testing.T) {
			for round := range 400 {
				n := 1 + rng.IntN(10<<(round%8))
				ids := make([]string, n)
				for k := range ids {
					ids[k] = f.id(rng)
				}
				assertSameScan(t, idArray(rng, ids, f.sep))
				faulty := slices.Clone(ids)
				faulty[rng.IntN(n)] = idArrayFaults[rng.IntN(len(idArrayFaults))]
				b := idArray(rng, faulty, f.sep)
				assertSameScan(t, b)
				assertSameScan(t, b[:rng.IntN(len(b)+1)])
			}
		})
	}
}

// idArray writes ids as a JSON array, separated by sep, with a tail after
// it (whitespace, a closing object, or more body) that scanIDArray must
// leave alone.
func idArray(r *rand.Rand, ids []string, sep func(*rand.Rand) string) []byte {
	var b bytes.Buffer
	b.WriteString([]string{"[", "[ ", "[\n  "}[r.IntN(3)])
	for k, id := range ids {
		if k > 0 {
			b.WriteString(sep(r))
		}
		b.WriteString(id)
	}
	b.WriteString([]string{"]", " ]", "\n]"}[r.IntN(3)])
	b.WriteString([]string{"", "}", `,"model":"m","stream":true}`, strings.Repeat(" ", r.IntN(100))}[r.IntN(4)])
	return b.Bytes()
}

// assertSameScan fails when scanIDArray and scanIDArrayBefore answer b
// differently: ids, end or acceptance.
func assertSameScan(t *testing.T, b []byte) {
	t.Helper()
	got, gotEnd, gotOK := scanIDArray(b, 0)
	want, wantEnd, wantOK := scanIDArrayBefore(b, 0)
	if gotOK != wantOK || gotEnd != wantEnd || !slices.Equal(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("scanIDArray(%.200q...) = %d ids, end %d, %v; before: %d ids, end %d, %v%s",
			b, len(got), gotEnd, gotOK, len(want), wantEnd, wantOK, firstDiff(got, want))
	}
}

func firstDiff(a, b []uint32) string {
	for k := range min(len(a), len(b)) {
		if a[k] != b[k] {
			return fmt.Sprintf(" (id %d: %d vs %d)", k, a[k], b[k])
		}
	}
	return ""
}

// FuzzScanIDArrayPacked holds scanIDArray to scanIDArrayBefore on any
// bytes. Each input is also tried after a long run of ids and with a tail of
// 80 spaces, so that short inputs reach the 64-byte reads too (they need 72
// bytes left in the body).
func FuzzScanIDArrayPacked(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `[1, 2, 3]`, "[\n  1,\n  2\n]", `[1 ,2]`, `[01,2]`, `[4294967295,4294967296]`,
		`[123456789,12345678,1]`, `[1,,2]`, `[1,]`, `[-1,2]`, `[1.5]`, `[1e3]`, `["1"]`, `[[1]]`, "[1,\xff2]", `[1,2`} {
		f.Add([]byte(s))
	}
	lead := []byte("[" + strings.Repeat("123456,7,", 12))
	f.Fuzz(func(t *testing.T, b []byte) {
		assertSameScan(t, b)
		assertSameScan(t, append(slices.Clone(b), strings.Repeat(" ", 80)...))
		if len(b) > 0 && b[0] == '[' {
			long := append(slices.Clone(lead), b[1:]...)
			assertSameScan(t, long)
			assertSameScan(t, append(long, strings.Repeat(" ", 80)...))
		}
	})
}

// BenchmarkScanIDArray reads a 100k-id array (a 128k vocabulary) in each
// common form, with the scanner and the one before it.
func BenchmarkScanIDArray(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]string, 100_000)
	for k := range ids {
		ids[k] = vocabID(rng)
	}
	for _, form := range []struct{ name, sep string }{{"packed", ","}, {"python", ", "}, {"indented", ",\n  "}} {
		body := []byte("[" + strings.Join(ids, form.sep) + "]}")
		for _, impl := range []struct {
			name string
			scan func([]byte, int) ([]uint32, int, bool)
		}{{"before", scanIDArrayBefore}, {"now", scanIDArray}} {
			b.Run("form="+form.name+"/scan="+impl.name, func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if got, _, ok := impl.scan(body, 0); !ok || len(got) != len(ids) {
						b.Fatal(ok, len(got))
					}
				}
			})
		}
	}
}
