// Package workload generates synthetic request traces in the Mooncake
// trace's form (arrival time, prompt and output lengths, the ids of the
// prompt's 512-token blocks: requests that share a prefix of ids share a
// prompt prefix), shaped like the workloads the field benchmarks routing
// with:
//
//   - SharedPrefix is inference-perf's shared_prefix data generator, which
//     llm-d's precise-prefix-cache-routing guide and llm-d-router's own
//     performance tests (test/perf/config) run: groups of prompts that share
//     a long system prompt, each with its own question.
//   - MultiTurn is the "few system prompts, multi-turn" case of the Gateway
//     API Inference Extension's prefix-cache benchmark: a few system prompts,
//     many conversations on each, every turn resending the conversation so
//     far plus a new user message.
//
// The kvbench harnesses replay a trace against real engines, turning each
// block id into the same tokens (or words) every time it appears.
package workload

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/kvselect/kvselect/bench/mooncake"
)

// BlockTokens is the tokens of one trace block, as in the Mooncake traces.
const BlockTokens = 512

// blocks is the trace blocks of tokens: at least one.
func blocks(tokens int) int { return max((tokens+BlockTokens-1)/BlockTokens, 1) }

// blockIDs hands out fresh block ids: a block id is a distinct content.
type blockIDs uint64

func (b *blockIDs) next(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(*b)
		*b++
	}
	return out
}

// SharedPrefix configures inference-perf's shared_prefix shape.
type SharedPrefix struct {
	Groups, PromptsPerGroup      int
	SystemTokens, QuestionTokens int
	OutputTokens                 int
	// Rate is the arrivals per second; requests come in a random order of
	// groups and prompts (Seed), evenly spaced.
	Rate float64
	Seed uint64
}

// Generate returns the trace.
func (c SharedPrefix) Generate() ([]mooncake.Request, error) {
	if c.Groups < 1 || c.PromptsPerGroup < 1 || c.SystemTokens < 1 || c.QuestionTokens < 1 || c.OutputTokens < 1 || !(c.Rate > 0) {
		return nil, fmt.Errorf("shared_prefix: groups, prompts per group, token counts and rate must be positive: %+v", c)
	}
	sys, q := blocks(c.SystemTokens), blocks(c.QuestionTokens)
	var ids blockIDs
	var reqs []mooncake.Request
	for range c.Groups {
		system := ids.next(sys)
		for range c.PromptsPerGroup {
			reqs = append(reqs, mooncake.Request{InputLength: c.SystemTokens + c.QuestionTokens, OutputLength: c.OutputTokens,
				HashIDs: append(slices.Clone(system), ids.next(q)...)})
		}
	}
	r := rand.New(rand.NewPCG(c.Seed, 0x5ba4ed))
	r.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	for i := range reqs {
		reqs[i].Timestamp = int64(float64(i) * 1000 / c.Rate)
	}
	return reqs, nil
}

// MultiTurn configures the few-system-prompts, multi-turn shape.
type MultiTurn struct {
	// Groups are the distinct system prompts; Conversations run on each.
	Groups, Conversations, Turns int
	SystemTokens, UserTokens     int
	// AnswerTokens is each turn's output, which the next turn resends.
	AnswerTokens int
	// Rate is new conversations per second; ThinkMs the time between a
	// turn and the conversation's next (the trace cannot wait for the
	// answer: a harness replays arrival times).
	Rate    float64
	ThinkMs int64
	Seed    uint64
}

// Generate returns the trace, ordered by arrival.
func (c MultiTurn) Generate() ([]mooncake.Request, error) {
	if c.Groups < 1 || c.Conversations < 1 || c.Turns < 1 || c.SystemTokens < 1 || c.UserTokens < 1 || c.AnswerTokens < 1 ||
		!(c.Rate > 0) || c.ThinkMs < 0 {
		return nil, fmt.Errorf("multi-turn: counts, token counts and rate must be positive: %+v", c)
	}
	var ids blockIDs
	systems := make([][]uint64, c.Groups)
	for g := range systems {
		systems[g] = ids.next(blocks(c.SystemTokens))
	}
	r := rand.New(rand.NewPCG(c.Seed, 0x7e55))
	var reqs []mooncake.Request
	n := c.Groups * c.Conversations
	for k := range n {
		g := r.IntN(c.Groups)
		start := int64(float64(k) * 1000 / c.Rate)
		history := slices.Clone(systems[g])
		tokens := c.SystemTokens
		for t := range c.Turns {
			history = append(history, ids.next(blocks(c.UserTokens))...)
			tokens += c.UserTokens
			reqs = append(reqs, mooncake.Request{Timestamp: start + int64(t)*c.ThinkMs, InputLength: tokens,
				OutputLength: c.AnswerTokens, HashIDs: slices.Clone(history)})
			history = append(history, ids.next(blocks(c.AnswerTokens))...)
			tokens += c.AnswerTokens
		}
	}
	slices.SortStableFunc(reqs, func(a, b mooncake.Request) int { return int(a.Timestamp - b.Timestamp) })
	return reqs, nil
}

// WriteTrace writes reqs as a Mooncake trace (JSON lines) at path.
func WriteTrace(path string, reqs []mooncake.Request) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, r := range reqs {
		line := struct {
			Timestamp    int64    `json:"timestamp"`
			InputLength  int      `json:"input_length"`
			OutputLength int      `json:"output_length"`
			HashIDs      []uint64 `json:"hash_ids"`
		}{r.Timestamp, r.InputLength, r.OutputLength, r.HashIDs}
		if err := enc.Encode(line); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return f.Close()
}
