package workload

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/mooncake"
)

func TestSharedPrefixShape(t *testing.T) {
	c := SharedPrefix{Groups: 3, PromptsPerGroup: 5, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000, Rate: 10, Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 15 {
		t.Fatalf("%d requests, want 15", len(reqs))
	}
	bySystem := map[uint64]int{}
	for i, r := range reqs {
		if len(r.HashIDs) != 12+3 || r.InputLength != 7200 || r.OutputLength != 1000 {
			t.Fatalf("request %d: %d blocks, %d in, %d out; want 15 blocks (12 system + 3 question), 7200, 1000", i, len(r.HashIDs), r.InputLength, r.OutputLength)
		}
		if r.Timestamp != int64(i*100) {
			t.Errorf("request %d at %d ms, want %d (10 per second)", i, r.Timestamp, i*100)
		}
		bySystem[r.HashIDs[0]]++
	}
	if len(bySystem) != 3 {
		t.Errorf("%d distinct system prompts, want 3", len(bySystem))
	}
	for first, n := range bySystem {
		if n != 5 {
			t.Errorf("system prompt %d shared by %d requests, want 5", first, n)
		}
	}
	again, _ := c.Generate()
	if !slices.EqualFunc(reqs, again, func(a, b mooncake.Request) bool { return slices.Equal(a.HashIDs, b.HashIDs) }) {
		t.Error("the same seed gave another order")
	}
}

func TestMultiTurnResendsTheConversation(t *testing.T) {
	c := MultiTurn{Groups: 2, Conversations: 3, Turns: 4, SystemTokens: 2048, UserTokens: 512, AnswerTokens: 512, Rate: 2, ThinkMs: 3000, Seed: 7}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2*3*4 {
		t.Fatalf("%d requests, want 24", len(reqs))
	}
	if !slices.IsSortedFunc(reqs, func(a, b mooncake.Request) int { return int(a.Timestamp - b.Timestamp) }) {
		t.Error("not ordered by arrival")
	}
	// Each turn's prompt extends an earlier turn's prompt plus its answer.
	extends := 0
	for _, r := range reqs {
		for _, p := range reqs {
			if len(r.HashIDs) == len(p.HashIDs)+2 && slices.Equal(r.HashIDs[:len(p.HashIDs)], p.HashIDs) {
				extends++
			}
		}
	}
	if want := 2 * 3 * 3; extends != want {
		t.Errorf("%d turns extend their conversation's previous turn, want %d", extends, want)
	}
	if got := reqs[len(reqs)-1].InputLength; got != 2048+4*512+3*512 {
		t.Errorf("last turn input %d", got)
	}
}

func TestTraceRoundTrip(t *testing.T) {
	reqs, _ := SharedPrefix{Groups: 2, PromptsPerGroup: 2, SystemTokens: 1000, QuestionTokens: 100, OutputTokens: 10, Rate: 1}.Generate()
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := WriteTrace(path, reqs); err != nil {
		t.Fatal(err)
	}
	got, err := mooncake.LoadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, reqs, func(a, b mooncake.Request) bool {
		return a.Timestamp == b.Timestamp && a.InputLength == b.InputLength && slices.Equal(a.HashIDs, b.HashIDs)
	}) {
		t.Errorf("round trip changed the trace")
	}
}

func TestInvalidConfigs(t *testing.T) {
	if _, err := (SharedPrefix{}).Generate(); err == nil {
		t.Error("an empty shared_prefix config generated a trace")
	}
	if _, err := (SharedPrefix{Groups: 1, PromptsPerGroup: 1, SystemTokens: 1, QuestionTokens: 1, OutputTokens: 1,
		Stages: []Stage{{Rate: 1}}}).Generate(); err == nil {
		t.Error("a stage of no duration generated a trace")
	}
	if _, err := (MultiTurn{Groups: 1}).Generate(); err == nil {
		t.Error("an empty multi-turn config generated a trace")
	}
}

// inference-perf's constant stages space arrivals evenly at each stage's
// rate, the second stage starting where the first ends, and the n-th
// request sends prompt n mod groups×prompts: a run longer than one pass
// repeats whole prompts in the same shuffled order.
func TestSharedPrefixStagesPaceAndRepeat(t *testing.T) {
	c := SharedPrefix{Groups: 2, PromptsPerGroup: 3, SystemTokens: 1000, QuestionTokens: 100, OutputTokens: 10, Seed: 3,
		Stages: []Stage{{Rate: 1, Duration: 15 * time.Second}, {Rate: 10, Duration: 30 * time.Second}}}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 15+300 {
		t.Fatalf("%d requests, want 315 (15 at 1/s, then 300 at 10/s)", len(reqs))
	}
	for i, r := range reqs {
		want := int64(i) * 1000
		if i >= 15 {
			want = 15000 + int64(i-15)*100
		}
		if r.Timestamp != want {
			t.Fatalf("request %d at %d ms, want %d", i, r.Timestamp, want)
		}
		if !slices.Equal(r.HashIDs, reqs[i%6].HashIDs) {
			t.Fatalf("request %d does not repeat prompt %d", i, i%6)
		}
	}
	distinct := map[uint64]bool{}
	for _, r := range reqs[:6] {
		distinct[r.HashIDs[len(r.HashIDs)-1]] = true
	}
	if len(distinct) != 6 {
		t.Errorf("the first pass sends %d distinct questions, want 6", len(distinct))
	}
	capped := c
	capped.MaxDuration = 16 * time.Second
	if reqs, _ := capped.Generate(); len(reqs) != 15+10 {
		t.Errorf("-max-duration 16s kept %d requests, want 25", len(reqs))
	}
	capped.MaxRequests = 7
	if reqs, _ := capped.Generate(); len(reqs) != 7 {
		t.Errorf("a cap of 7 kept %d requests", len(reqs))
	}
	scaled := Scaled(c.Stages, 0.2, 1)
	if scaled[0].Rate != 0.2 || scaled[1].Rate != 2 || scaled[1].Duration != 30*time.Second || c.Stages[1].Rate != 10 {
		t.Errorf("Scaled(0.2) = %+v (original %+v)", scaled, c.Stages)
	}
}

// The published configurations of llm-d-router's test/perf/config, and
// prompts of exactly their token lengths: a system prompt shared by its
// group's prompts, then a question of their own.
func TestLLMDPerfPresets(t *testing.T) {
	for name, want := range map[string]struct {
		groups, prompts, system, question, requests int
		rates                                       [2]float64
	}{
		"shared_prefix_100k-1k-10qps": {10, 5, 95000, 5000, 15 + 3000, [2]float64{1, 10}},
		"shared_prefix_agentic-1m-1k": {5, 5, 994000, 5000, 8 + 3000, [2]float64{0.5, 10}},
		"shared_prefix_job1":          {150, 5, 9500, 500, 15 + 3000, [2]float64{1, 10}},
	} {
		t.Run(name, func(t *testing.T) {
			c, ok := LLMDPerf[name]
			if !ok {
				t.Fatal("no such preset")
			}
			if c.Groups != want.groups || c.PromptsPerGroup != want.prompts || c.SystemTokens != want.system || c.QuestionTokens != want.question ||
				c.OutputTokens != 1000 || len(c.Stages) != 2 || c.Stages[0].Rate != want.rates[0] || c.Stages[0].Duration != 15*time.Second ||
				c.Stages[1].Rate != want.rates[1] || c.Stages[1].Duration != 300*time.Second {
				t.Fatalf("preset %+v", c)
			}
			reqs, err := c.Generate()
			if err != nil {
				t.Fatal(err)
			}
			if len(reqs) != want.requests {
				t.Errorf("%d requests, want %d", len(reqs), want.requests)
			}
			bySystem := map[uint64]map[uint64]bool{}
			for _, r := range reqs {
				if r.InputLength != want.system+want.question {
					t.Fatalf("input length %d", r.InputLength)
				}
				q := bySystem[r.HashIDs[0]]
				if q == nil {
					q = map[uint64]bool{}
					bySystem[r.HashIDs[0]] = q
				}
				q[r.HashIDs[len(r.HashIDs)-1]] = true
			}
			if len(bySystem) != want.groups {
				t.Errorf("%d system prompts, want %d", len(bySystem), want.groups)
			}
			for _, q := range bySystem {
				if len(q) != want.prompts {
					t.Errorf("a system prompt with %d questions, want %d", len(q), want.prompts)
				}
			}
		})
	}
}

func TestSharedPrefixExactLengths(t *testing.T) {
	c := SharedPrefix{Groups: 1, PromptsPerGroup: 2, SystemTokens: 1300, QuestionTokens: 700, OutputTokens: 10, Rate: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Tokens(reqs[0].HashIDs)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Tokens(reqs[1].HashIDs)
	if len(a) != 2000 || len(b) != 2000 {
		t.Fatalf("%d and %d tokens, want 2000", len(a), len(b))
	}
	if !slices.Equal(a[:1300], b[:1300]) || slices.Equal(a[1300:], b[1300:]) {
		t.Error("the two prompts should share the system prompt's 1300 tokens and no question")
	}
	ta, err := c.Text(reqs[0].HashIDs)
	if err != nil {
		t.Fatal(err)
	}
	tb, _ := c.Text(reqs[1].HashIDs)
	wa, wb := strings.Fields(ta), strings.Fields(tb)
	if len(wa) != 2000 || len(wb) != 2000 || !slices.Equal(wa[:1300], wb[:1300]) || slices.Equal(wa[1300:], wb[1300:]) {
		t.Errorf("text prompts of %d and %d words, want 2000 sharing the first 1300", len(wa), len(wb))
	}
	if _, err := c.Tokens(reqs[0].HashIDs[1:]); err == nil {
		t.Error("a prompt of the wrong block count was accepted")
	}
}
