package mooncake

import "strings"

// Tokens is a request's prompt as token ids for engines with small blocks:
// every trace block becomes blockTokens ids derived from its hash id, so
// requests that share a prefix of hash ids share a token prefix.
func Tokens(ids []uint64, blockTokens int) []uint32 {
	out := make([]uint32, 0, len(ids)*blockTokens)
	for _, id := range ids {
		for j := range blockTokens {
			out = append(out, uint32(Mix64(id<<16|uint64(j))%32000))
		}
	}
	return out
}

// Text is Tokens as text: every trace block becomes blockTokens words
// derived from its hash id, so requests that share a prefix of hash ids
// share a text prefix, ending at a word boundary. Every word is six
// lowercase letters, so a tokenizer that gives a word one token (the mock
// worker's) gives every block blockTokens tokens, and one that splits words
// further (llm-d-inference-sim's) splits them alike.
func Text(ids []uint64, blockTokens int) string {
	var b strings.Builder
	b.Grow(len(ids) * blockTokens * 8)
	const letters = "abcdefghijklmnopqrstuvwxyz"
	for _, id := range ids {
		for j := range blockTokens {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			h := Mix64(id<<16 | uint64(j))
			for range 6 {
				b.WriteByte(letters[h%26])
				h /= 26
			}
		}
	}
	return b.String()
}
