package vsepp

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/workload"
)

// A shared_prefix run sends prompts of the generator's exact lengths,
// encodes each distinct prompt once, caps the trace at Requests, and raises
// the simulator's body limit only for bodies over its default.
func TestSharedPrefixBodies(t *testing.T) {
	c := Defaults()
	c.SharedPrefix = &workload.SharedPrefix{Groups: 2, PromptsPerGroup: 2, SystemTokens: 1300, QuestionTokens: 300, OutputTokens: 1000,
		Stages: []workload.Stage{{Rate: 10, Duration: time.Second}}}
	c.Rate, c.Compress, c.BlockTokens, c.Requests = 0, 1, workload.BlockTokens, 6
	reqs, err := c.requests()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 6 {
		t.Fatalf("%d requests, want the cap of 6", len(reqs))
	}
	for _, prompts := range []string{PromptsTokens, PromptsText} {
		c.Prompts = prompts
		bodies, err := c.bodies(reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range bodies {
			var body struct {
				Prompt    json.RawMessage `json:"prompt"`
				MaxTokens int             `json:"max_tokens"`
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			n := 0
			if prompts == PromptsTokens {
				var ids []uint32
				if err := json.Unmarshal(body.Prompt, &ids); err != nil {
					t.Fatal(err)
				}
				n = len(ids)
			} else {
				var text string
				if err := json.Unmarshal(body.Prompt, &text); err != nil {
					t.Fatal(err)
				}
				n = len(strings.Fields(text))
			}
			if n != 1600 || body.MaxTokens != c.MaxOutput {
				t.Errorf("%s body %d: %d tokens, max_tokens %d; want 1600 and %d", prompts, i, n, body.MaxTokens, c.MaxOutput)
			}
		}
		// The fifth request repeats the first prompt: the same bytes.
		if &bodies[4][0] != &bodies[0][0] {
			t.Errorf("%s: a repeated prompt was encoded again", prompts)
		}
	}
	if got := simBodyLimit([][]byte{make([]byte, 3<<20)}); got != nil {
		t.Errorf("a 3 MiB body raised the simulator's limit: %q", got)
	}
	if got := simBodyLimit([][]byte{make([]byte, 6<<20+1)}); strings.Join(got, " ") != "--max-request-body-size-mb 8" {
		t.Errorf("a 6 MiB body: %q, want --max-request-body-size-mb 8", got)
	}
}

func TestSharedPrefixValidate(t *testing.T) {
	c := Defaults()
	c.Sim, c.EPP = "sim", "epp"
	job1 := workload.LLMDPerf["shared_prefix_job1"]
	c.SharedPrefix = &job1
	c.Requests = 0
	if err := c.Validate(); err == nil {
		t.Error("a shared_prefix run with the trace's -block-tokens and -compress was accepted")
	}
	c.Compress, c.BlockTokens = 1, workload.BlockTokens
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	c.Rate = 3
	if err := c.Validate(); err == nil {
		t.Error("a fixed -rate beside the generator's pace was accepted")
	}
}
