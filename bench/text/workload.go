package text

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// The workload: a deterministic (seeded) set of multi-turn chat sessions shaped like agentic and RAG traffic — a few long system prompts
// shared by many sessions (popular ones more often), documents quoted into
// user turns of unrelated sessions, and histories that grow turn by turn
// (each turn resends the whole conversation, as OpenAI chat clients do).
// Only text: the router never sees a token id unless it asks for one.

// WorkloadConfig shapes the sessions; ranges are [min, max].
type WorkloadConfig struct {
	Seed                       uint64
	Sessions                   int
	SystemPrompts, Documents   int // distinct long system prompts, documents quoted into user turns
	SystemWords, DocumentWords [2]int
	Turns                      [2]int
	UserWords, AssistantWords  [2]int
	QuoteProb                  float64 // share of user turns that quote a document
}

// DefaultWorkload is 160 sessions over 4 system prompts and 16 documents.
func DefaultWorkload() WorkloadConfig {
	return WorkloadConfig{
		Seed: 1, Sessions: 160, SystemPrompts: 4, Documents: 16,
		SystemWords: [2]int{600, 1400}, DocumentWords: [2]int{300, 900},
		Turns: [2]int{2, 6}, UserWords: [2]int{15, 60}, AssistantWords: [2]int{30, 90},
		QuoteProb: 0.4,
	}
}

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Session is one conversation: Turns[i] is the messages of its i-th
// request (system prompt, the history, the new user message).
type Session struct {
	ID    int
	Turns [][]Message
}

// Workload builds the sessions; the same config gives the same bytes.
func Workload(c WorkloadConfig) []Session {
	rng := rand.New(rand.NewPCG(c.Seed, 0x7e47))
	vocab := vocabulary(rng, 4000)
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
	systems := make([]string, c.SystemPrompts)
	for i := range systems {
		systems[i] = "You are assistant number " + strconv.Itoa(i) + ". " + words(c.SystemWords)
	}
	docs := make([]string, c.Documents)
	for i := range docs {
		docs[i] = "Document " + strconv.Itoa(i) + ":\n" + words(c.DocumentWords)
	}
	out := make([]Session, c.Sessions)
	for s := range out {
		msgs := []Message{{Role: "system", Content: systems[zipf(rng, len(systems))]}}
		n := c.Turns[0] + rng.IntN(c.Turns[1]-c.Turns[0]+1)
		sess := Session{ID: s}
		for range n {
			user := words(c.UserWords)
			if rng.Float64() < c.QuoteProb {
				user = "Read this:\n" + docs[zipf(rng, len(docs))] + "\n\nQuestion: " + user
			}
			msgs = append(msgs, Message{Role: "user", Content: user})
			sess.Turns = append(sess.Turns, append([]Message(nil), msgs...))
			msgs = append(msgs, Message{Role: "assistant", Content: words(c.AssistantWords)})
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

// vocabulary makes n pseudo-words of two to four syllables.
func vocabulary(rng *rand.Rand, n int) []string {
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
