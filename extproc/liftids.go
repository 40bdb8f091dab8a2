package extproc

import (
	"bytes"
	"slices"
)

// A tokenized long-context body is almost all token ids: a 100k-token prompt
// is ~600 KB of digits and commas, a 1M-token one ~6 MB. Handing that to
// the JSON decoder costs a copy of the body (goccy/go-json pads its input),
// a copy of the prompt's raw bytes, a skip over them and then the id scan:
// most of a long-context pick. liftTokenIDs reads the id arrays in place
// instead, and the decoder gets the body without them: the rest of the body
// (model, stream, nvext's session and hints, ...) is decoded as before.
//
// Exactness: only a top-level prompt, input_ids or token_ids (or nvext's
// token_data) whose value is a plain, non-empty id array (scanTokenIDs'
// form, which encoding/json decodes to the same ids) is lifted, and it is
// replaced by "[]", so the reduced body is valid JSON exactly when the body
// is, and every field the decoder fills has the value it had. Anything the
// lift is not sure of — a key with an escape or a non-ASCII byte (the
// decoder matches keys case-insensitively and unescaped), a field sent
// twice, a top level that is not an object — lifts nothing, and the body is
// decoded whole as before. A reduced body that does not decode is decoded
// whole again, for the decoder's own error message.

// liftedIDs are the id arrays lifted out of a body; nil where none was.
type liftedIDs struct {
	prompt, inputIDs, tokenIDs, tokenData []uint32
}

// liftField names the fields liftTokenIDs reads.
type liftField uint8

const (
	liftNone liftField = iota
	liftPrompt
	liftInputIDs
	liftTokenIDsField
	liftNvext
	liftTokenData
	numLiftFields
)

// liftMin is the smallest body worth the extra pass: below it the decoder's
// copies cost less than the lift's scan.
const liftMin = 4 << 10

// liftTokenIDs returns the body with its plain id arrays replaced by "[]"
// and the ids, or ok false when it lifts nothing (then b is to be decoded
// as it is). The array early read while the body arrived (nil: none) is
// read on from where it stopped.
func liftTokenIDs(b []byte, early *earlyIDs) (reduced []byte, ids liftedIDs, ok bool) {
	type span struct{ start, end int }
	var (
		// One per field at most (a field seen twice declines the body):
		// every id field may come at once, whichever the parser then uses.
		spans [numLiftFields]span
		nspan int
		seen  [numLiftFields]bool
	)
	i := skipWS(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil, ids, false
	}
	// obj walks one object's members from just after its '{' and returns
	// the index after its '}'; nested is true inside nvext.
	var obj func(i int, nested bool) (int, bool)
	obj = func(i int, nested bool) (int, bool) {
		i = skipWS(b, i)
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for {
			if i == len(b) || b[i] != '"' {
				return 0, false
			}
			ks := i + 1
			ke := ks
			for ke < len(b) && b[ke] != '"' {
				if c := b[ke]; c == '\\' || c >= 0x80 || c < 0x20 {
					return 0, false // the decoder might unescape or fold it to a field's name
				}
				ke++
			}
			if ke == len(b) {
				return 0, false
			}
			f := liftKey(b[ks:ke], nested)
			if f != liftNone {
				if seen[f] {
					return 0, false // sent twice: the decoder's choice, not ours
				}
				seen[f] = true
			}
			i = skipWS(b, ke+1)
			if i == len(b) || b[i] != ':' {
				return 0, false
			}
			vs := skipWS(b, i+1)
			var ve int
			lifted := false
			switch {
			case f == liftNvext && vs < len(b) && b[vs] == '{':
				end, ok := obj(vs+1, true)
				if !ok {
					return 0, false
				}
				ve = end
			case f != liftNone && f != liftNvext && vs < len(b) && b[vs] == '[':
				if v, end, ok := scanIDArrayFrom(b, vs, early); ok && len(v) > 0 {
					switch f {
					case liftPrompt:
						ids.prompt = v
					case liftInputIDs:
						ids.inputIDs = v
					case liftTokenIDsField:
						ids.tokenIDs = v
					case liftTokenData:
						ids.tokenData = v
					}
					spans[nspan] = span{vs, end}
					nspan++
					ve, lifted = end, true
				}
			}
			if !lifted && ve == 0 {
				end, ok := skipValue(b, vs)
				if !ok {
					return 0, false
				}
				ve = end
			}
			i = skipWS(b, ve)
			if i == len(b) {
				return 0, false
			}
			switch b[i] {
			case ',':
				i = skipWS(b, i+1)
			case '}':
				return i + 1, true
			default:
				return 0, false
			}
		}
	}
	end, ok := obj(i+1, false)
	if !ok || skipWS(b, end) != len(b) || nspan == 0 {
		return nil, liftedIDs{}, false
	}
	// Spans in body order (nvext's token_data sits where its object does).
	slices.SortFunc(spans[:nspan], func(a, b span) int { return a.start - b.start })
	size := len(b)
	for _, s := range spans[:nspan] {
		size -= s.end - s.start - 2
	}
	reduced = make([]byte, 0, size)
	last := 0
	for _, s := range spans[:nspan] {
		reduced = append(append(reduced, b[last:s.start]...), '[', ']')
		last = s.end
	}
	return append(reduced, b[last:]...), ids, true
}

// liftKey names a member key (its raw bytes, ASCII without escapes) as the
// decoder matches it, ignoring ASCII case.
func liftKey(k []byte, nested bool) liftField {
	if nested {
		if bytes.EqualFold(k, []byte("token_data")) {
			return liftTokenData
		}
		return liftNone
	}
	switch {
	case bytes.EqualFold(k, []byte("prompt")):
		return liftPrompt
	case bytes.EqualFold(k, []byte("input_ids")):
		return liftInputIDs
	case bytes.EqualFold(k, []byte("token_ids")):
		return liftTokenIDsField
	case bytes.EqualFold(k, []byte("nvext")):
		return liftNvext
	}
	return liftNone
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at i. It only finds
// the end — strings by their unescaped closing quote, arrays and objects by
// bracket depth — and leaves checking the value to the decoder, which reads
// every byte it skips.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '[', '{':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = end
				continue
			case '[', '{':
				depth++
			case ']', '}':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	// A number or a literal: up to the next delimiter.
	start := i
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\n', '\t', '\r':
			return i, i > start
		}
		i++
	}
	return 0, false
}

// skipString returns the index after the string starting at i (a quote).
func skipString(b []byte, i int) (int, bool) {
	i++
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false
		}
		j := i + q
		// The quote is escaped when an odd run of backslashes precedes it.
		n := 0
		for k := j - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j + 1, true
		}
		i = j + 1
	}
}
