package mockworker

import (
	"encoding/binary"
	"strings"
	"unicode"

	"github.com/zeebo/xxh3"
)

// firstWordID is the lowest id the tokenizer gives a word; the ids below it
// are left for special tokens, as real vocabularies keep their first ids.
const firstWordID = 256

// Special tokens of the chat template (chatPrompt): the end of a turn, and a
// role token per role, from the known roles' fixed ids or, for any other
// role, an id derived from its name, all below firstWordID.
const (
	endOfTurnToken = 2
	firstRoleToken = 8
)

var knownRoles = [...]string{"system", "user", "assistant", "tool", "developer", "function"}

func roleToken(role string) uint32 {
	for i, r := range knownRoles {
		if r == role {
			return uint32(firstRoleToken + i)
		}
	}
	n := uint64(firstWordID - firstRoleToken - len(knownRoles))
	return uint32(firstRoleToken + len(knownRoles) + int(xxh3.HashString(role)%n))
}

// Tokenize is the mock worker's deterministic tokenizer: every word (a run of
// non-space characters) together with the whitespace before it becomes one
// token whose id is xxh3 of those bytes, mapped into [256, vocab). The same
// text always gives the same tokens, and a text that extends another at a word
// boundary extends its tokens, which is all prefix caching needs. About one
// token per word is close to the 1.3 words per token of BPE vocabularies on
// English, so prompt lengths stay realistic.
func Tokenize(text string, vocab int) []uint32 {
	span := uint64(vocab - firstWordID)
	var out []uint32
	start := 0
	inWord := false
	for i, r := range text {
		space := unicode.IsSpace(r)
		if inWord && space {
			out = append(out, uint32(firstWordID+xxh3.HashString(text[start:i])%span))
			start = i
		}
		inWord = !space
	}
	if start < len(text) {
		out = append(out, uint32(firstWordID+xxh3.HashString(text[start:])%span))
	}
	return out
}

// words spell generated tokens; any fixed list would do.
var words = strings.Fields(`the a of to and in is it that for on with as was at by be this from or
an are not but which have were one all their has more been will would its there can some
if into than other time only new when about also two after first may these up out over
such like where most between many through then any them each those both same well very`)

// tokenText is the text of a generated token: a word of the fixed list chosen
// by the id, with a leading space.
func tokenText(id uint32) string { return " " + words[int(id)%len(words)] }

// outputToken is the i-th token generated for a prompt whose digest is seed:
// deterministic, so that the same prompt always yields the same completion and
// a follow-up turn that quotes it hits the prefix cache like a real one.
func outputToken(seed uint64, i int, vocab int) uint32 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	binary.LittleEndian.PutUint64(b[8:], uint64(i))
	return uint32(firstWordID + xxh3.Hash(b[:])%uint64(vocab-firstWordID))
}

// promptDigest seeds outputToken.
func promptDigest(tokens []uint32) uint64 {
	b := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], t)
	}
	return xxh3.Hash(b)
}
