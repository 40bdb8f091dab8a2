package scheduler

import (
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

func TestEngineCost(t *testing.T) {
	w := EngineWeights{UnbookedRequest: 16, KVUsage: 10, LoRAMiss: 8}
	tests := []struct {
		name string
		c    Candidate
		want float64
	}{
		{"no figures", Candidate{ActiveRequests: 3}, 0},
		{"stale figures are not passed", Candidate{EngineWaiting: 9, EngineRunning: 9}, 0},
		{"all engine requests booked", Candidate{EngineFresh: true, EngineRunning: 3, ActiveRequests: 3}, 0},
		{"bookings not yet at the engine", Candidate{EngineFresh: true, EngineRunning: 1, ActiveRequests: 3}, 0},
		{"two unbooked", Candidate{EngineFresh: true, EngineWaiting: 2, EngineRunning: 3, ActiveRequests: 3}, 32},
		{"kv usage", Candidate{EngineFresh: true, EngineKVUsage: 0.5}, 5},
		{"lora free slot", Candidate{LoRAFit: 1}, 8},
		{"lora no slot, with figures", Candidate{LoRAFit: 2, EngineFresh: true, EngineWaiting: 1}, 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := EngineCost(&w, &tt.c); got != tt.want {
				t.Fatalf("EngineCost = %g, want %g", got, tt.want)
			}
		})
	}
	// Dynamo's cost is untouched without engine figures.
	c := Candidate{ActivePrefillTokens: 64, ActiveDecodeBlocks: 4}
	req := &Request{ISL: 32, BlockSize: 16, Weights: DefaultWeights()}
	base, _ := CostScorer{}.Score(&Context{Request: req, RequestBlocks: 2}, &c)
	req.Weights.EngineWeights = w
	with, _ := CostScorer{}.Score(&Context{Request: req, RequestBlocks: 2}, &c)
	if base != with {
		t.Fatalf("engine weights changed the cost of a rank without engine figures: %g vs %g", base, with)
	}
}

func TestSaturatedIsBusy(t *testing.T) {
	req := &Request{ISL: 16, BlockSize: 16, Weights: DefaultWeights()}
	cands := []Candidate{{Worker: index.WorkerKey{WorkerID: 1}, Saturated: true}, {Worker: index.WorkerKey{WorkerID: 2}}}
	if AllBusy(req, cands, 1) {
		t.Fatal("one rank with room: AllBusy")
	}
	cands[1].Saturated = true
	if !AllBusy(req, cands, 1) {
		t.Fatal("every rank saturated: not AllBusy")
	}
	if _, err := DefaultPolicy().Select(seeded(1), req, cands, nil); err != ErrAllOverloaded {
		t.Fatalf("every rank saturated: %v, want ErrAllOverloaded", err)
	}
}
