package main

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// The text workload: a deterministic (seeded) set of multi-turn chat
// sessions shaped like agentic and RAG traffic — a few long system prompts
// shared by many sessions (popular ones more often), documents quoted into
// user turns of unrelated sessions, and histories that grow turn by turn
// (each turn resends the whole conversation, as OpenAI chat clients do).
// Only text: the router never sees a token id unless it asks for one.

type textWorkloadConfig struct {
	seed                       uint64
	sessions                   int
	systemPrompts, documents   int
	systemWords, documentWords [2]int // min, max
	turns                      [2]int
	userWords, assistantWords  [2]int
	quoteProb                  float64
}

func defaultTextWorkload() textWorkloadConfig {
	return textWorkloadConfig{
		seed: 1, sessions: 160, systemPrompts: 4, documents: 16,
		systemWords: [2]int{600, 1400}, documentWords: [2]int{300, 900},
		turns: [2]int{2, 6}, userWords: [2]int{15, 60}, assistantWords: [2]int{30, 90},
		quoteProb: 0.4,
	}
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// textSession is one conversation: Turns[i] is the messages of its i-th
// request (system prompt, the history, the new user message).
type textSession struct {
	ID    int
	Turns [][]chatMsg
}

// textWorkload builds the sessions; the same config gives the same bytes.
func textWorkload(c textWorkloadConfig) []textSession {
	rng := rand.New(rand.NewPCG(c.seed, 0x7e47))
	vocab := textVocabulary(rng, 4000)
	words := func(r [2]int) string {
		n := r[0] + rng.IntN(r[1]-r[0]+1)
		var b strings.Builder
		for i := range n {
			if i > 0 {
				if i%17 == 0 {
					b.WriteString(".\n")
				} else {
					b.WriteByte(' ')
				}
			}
			b.WriteString(vocab[rng.IntN(len(vocab))])
		}
		return b.String()
	}
	systems := make([]string, c.systemPrompts)
	for i := range systems {
		systems[i] = "You are assistant number " + strconv.Itoa(i) + ". " + words(c.systemWords)
	}
	docs := make([]string, c.documents)
	for i := range docs {
		docs[i] = "Document " + strconv.Itoa(i) + ":\n" + words(c.documentWords)
	}
	out := make([]textSession, c.sessions)
	for s := range out {
		msgs := []chatMsg{{Role: "system", Content: systems[zipf(rng, len(systems))]}}
		n := c.turns[0] + rng.IntN(c.turns[1]-c.turns[0]+1)
		sess := textSession{ID: s}
		for range n {
			user := words(c.userWords)
			if rng.Float64() < c.quoteProb {
				user = "Read this:\n" + docs[zipf(rng, len(docs))] + "\n\nQuestion: " + user
			}
			msgs = append(msgs, chatMsg{Role: "user", Content: user})
			sess.Turns = append(sess.Turns, append([]chatMsg(nil), msgs...))
			msgs = append(msgs, chatMsg{Role: "assistant", Content: words(c.assistantWords)})
		}
		out[s] = sess
	}
	return out
}

// zipf picks 0..n-1 with weight 1/(i+1): a few popular prompts and documents.
func zipf(rng *rand.Rand, n int) int {
	total := 0.0
	for i := range n {
		total += 1 / float64(i+1)
	}
	x := rng.Float64() * total
	for i := range n {
		x -= 1 / float64(i+1)
		if x < 0 {
			return i
		}
	}
	return n - 1
}

// textVocabulary makes n pseudo-words of two to four syllables.
func textVocabulary(rng *rand.Rand, n int) []string {
	syl := strings.Fields("ka lo mi ne ru sa to vi de pa ql an ex or un is at en re co ma ti gu zo fe ha jo wy")
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for range 2 + rng.IntN(3) {
			b.WriteString(syl[rng.IntN(len(syl))])
		}
		out[i] = b.String()
	}
	return out
}
