package workload

import (
	"path/filepath"
	"slices"
	"testing"

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
	if _, err := (MultiTurn{Groups: 1}).Generate(); err == nil {
		t.Error("an empty multi-turn config generated a trace")
	}
}
