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
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

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

// SharedPrefix configures inference-perf's shared_prefix data generator
// (kubernetes-sigs/inference-perf, inference_perf/datagen/
// shared_prefix_datagen.py) with its constant load: Groups system prompts of
// SystemTokens each, PromptsPerGroup questions of QuestionTokens on each,
// every prompt generated once and shuffled once; the n-th request sends
// prompt n mod Groups×PromptsPerGroup, so that a run longer than one pass
// repeats whole prompts in the same order, as inference-perf's get_data
// does. Questions are distinct content per prompt (inference-perf draws
// random token ids; here each question has its own block ids). Lengths are
// fixed: the published configurations set no spread.
type SharedPrefix struct {
	Groups, PromptsPerGroup      int
	SystemTokens, QuestionTokens int
	OutputTokens                 int
	// Rate is the arrivals per second of one pass over the prompts, evenly
	// spaced, when Stages is empty.
	Rate float64
	// Stages is inference-perf's `load.stages` of `type: constant`: each
	// stage sends Rate requests a second, evenly spaced, for Duration,
	// continuing the prompt sequence of the stage before.
	Stages []Stage
	// MaxRequests cuts the trace to its first requests, MaxDuration to the
	// requests that arrive before it (0: no cap).
	MaxRequests int
	MaxDuration time.Duration
	Seed        uint64
}

// LLMDPerf are the shared_prefix workloads of llm-d-router's performance
// tests (llm-d/llm-d-router, test/perf/config/<name>.yaml at v0.10.0), by
// file name: their `data.shared_prefix` and `load.stages` as published
// (enable_multi_turn_chat false in all three). Their simulators
// (test/perf/config/llm-d-sim-deployment.yaml, -1m-context.yaml) run 10
// replicas.
var LLMDPerf = map[string]SharedPrefix{
	"shared_prefix_100k-1k-10qps": {Groups: 10, PromptsPerGroup: 5, SystemTokens: 95000, QuestionTokens: 5000, OutputTokens: 1000,
		Stages: []Stage{{Rate: 1, Duration: 15 * time.Second}, {Rate: 10, Duration: 300 * time.Second}}},
	"shared_prefix_agentic-1m-1k": {Groups: 5, PromptsPerGroup: 5, SystemTokens: 994000, QuestionTokens: 5000, OutputTokens: 1000,
		Stages: []Stage{{Rate: 0.5, Duration: 15 * time.Second}, {Rate: 10, Duration: 300 * time.Second}}},
	"shared_prefix_job1": {Groups: 150, PromptsPerGroup: 5, SystemTokens: 9500, QuestionTokens: 500, OutputTokens: 1000,
		Stages: []Stage{{Rate: 1, Duration: 15 * time.Second}, {Rate: 10, Duration: 300 * time.Second}}},
}

// Stage is one constant-rate load stage.
type Stage struct {
	Rate     float64       `json:"rate"`
	Duration time.Duration `json:"duration"`
}

// Requests is the stage's arrivals: its rate over its length, rounded.
func (s Stage) Requests() int { return int(math.Round(s.Rate * s.Duration.Seconds())) }

// Scaled is the stages with every rate multiplied by rateScale and every
// duration by durationScale: how a run that cannot hold the published load
// keeps its shape.
func Scaled(stages []Stage, rateScale, durationScale float64) []Stage {
	out := make([]Stage, len(stages))
	for i, s := range stages {
		out[i] = Stage{Rate: s.Rate * rateScale, Duration: time.Duration(float64(s.Duration) * durationScale)}
	}
	return out
}

func (c SharedPrefix) validate() error {
	if c.Groups < 1 || c.PromptsPerGroup < 1 || c.SystemTokens < 1 || c.QuestionTokens < 1 || c.OutputTokens < 1 || c.MaxRequests < 0 || c.MaxDuration < 0 {
		return fmt.Errorf("shared_prefix: groups, prompts per group and token counts must be positive: %+v", c)
	}
	if len(c.Stages) == 0 && !(c.Rate > 0) {
		return fmt.Errorf("shared_prefix: a positive rate or at least one stage is needed: %+v", c)
	}
	for i, s := range c.Stages {
		if !(s.Rate > 0) || s.Duration <= 0 {
			return fmt.Errorf("shared_prefix: stage %d (%g/s for %v): rate and duration must be positive", i+1, s.Rate, s.Duration)
		}
	}
	return nil
}

// Generate returns the trace, ordered by arrival.
func (c SharedPrefix) Generate() ([]mooncake.Request, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	sys, q := blocks(c.SystemTokens), blocks(c.QuestionTokens)
	var ids blockIDs
	var prompts [][]uint64
	for range c.Groups {
		system := ids.next(sys)
		for range c.PromptsPerGroup {
			prompts = append(prompts, append(slices.Clone(system), ids.next(q)...))
		}
	}
	r := rand.New(rand.NewPCG(c.Seed, 0x5ba4ed))
	r.Shuffle(len(prompts), func(i, j int) { prompts[i], prompts[j] = prompts[j], prompts[i] })
	var arrivals []int64 // ms from the start
	if len(c.Stages) == 0 {
		for i := range prompts {
			arrivals = append(arrivals, int64(float64(i)*1000/c.Rate))
		}
	} else {
		var start time.Duration
		for _, s := range c.Stages {
			for k := range s.Requests() {
				arrivals = append(arrivals, start.Milliseconds()+int64(math.Round(float64(k)*1000/s.Rate)))
			}
			start += s.Duration
		}
	}
	if c.MaxDuration > 0 {
		arrivals = slices.DeleteFunc(arrivals, func(at int64) bool { return at >= c.MaxDuration.Milliseconds() })
	}
	if c.MaxRequests > 0 && len(arrivals) > c.MaxRequests {
		arrivals = arrivals[:c.MaxRequests]
	}
	reqs := make([]mooncake.Request, len(arrivals))
	for i, at := range arrivals {
		// Requests that send the same prompt share its block id slice: a
		// trace of thousands of 1M-token requests stays small.
		reqs[i] = mooncake.Request{Timestamp: at, InputLength: c.SystemTokens + c.QuestionTokens, OutputLength: c.OutputTokens,
			HashIDs: prompts[i%len(prompts)]}
	}
	return reqs, nil
}

// Tokens is a generated request's prompt as token ids, exactly
// SystemTokens + QuestionTokens long: the system prompt's blocks
// (mooncake.Tokens of 512 tokens each) cut to SystemTokens, then the
// question's cut to QuestionTokens, so that published lengths that are no
// multiple of a trace block stay as published.
func (c SharedPrefix) Tokens(ids []uint64) ([]uint32, error) {
	sys, err := c.split(ids)
	if err != nil {
		return nil, err
	}
	out := mooncake.Tokens(ids[:sys], BlockTokens)[:c.SystemTokens]
	return append(out, mooncake.Tokens(ids[sys:], BlockTokens)[:c.QuestionTokens]...), nil
}

// Text is the prompt as text: SystemTokens words of the system prompt's
// blocks (mooncake.Text), a space, QuestionTokens words of the question's,
// as inference-perf joins its decoded system prompt and question.
func (c SharedPrefix) Text(ids []uint64) (string, error) {
	sys, err := c.split(ids)
	if err != nil {
		return "", err
	}
	return firstWords(mooncake.Text(ids[:sys], BlockTokens), c.SystemTokens) + " " +
		firstWords(mooncake.Text(ids[sys:], BlockTokens), c.QuestionTokens), nil
}

// split checks that ids are one of the generator's prompts and returns how
// many of them are the system prompt's.
func (c SharedPrefix) split(ids []uint64) (int, error) {
	sys, q := blocks(c.SystemTokens), blocks(c.QuestionTokens)
	if len(ids) != sys+q {
		return 0, fmt.Errorf("shared_prefix: a prompt of %d blocks, want %d system + %d question", len(ids), sys, q)
	}
	return sys, nil
}

// firstWords is the first n space-separated words of s.
func firstWords(s string, n int) string {
	at := 0
	for range n {
		i := strings.IndexByte(s[at:], ' ')
		if i < 0 {
			return s
		}
		at += i + 1
	}
	return s[:at-1]
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
