package scheduler

import (
	"errors"
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

// With ServeSaturated a saturated pool still routes, to the cheapest
// saturated rank, and never to a rank overloaded by the busy thresholds; a
// rank with room always wins over a saturated one.
func TestServeSaturated(t *testing.T) {
	key := func(id uint64) index.WorkerKey { return index.WorkerKey{WorkerID: id} }
	pin := key(2)
	tests := []struct {
		name    string
		pinned  *index.WorkerKey
		cands   []Candidate
		want    uint64
		wantErr error
	}{
		{"cheapest saturated rank", nil, []Candidate{
			{Worker: key(1), Saturated: true, ActivePrefillTokens: 4096},
			{Worker: key(2), Saturated: true}}, 2, nil},
		{"a rank with room beats a cheaper saturated one", nil, []Candidate{
			{Worker: key(1), Saturated: true},
			{Worker: key(2), ActivePrefillTokens: 4096}}, 2, nil},
		{"busy-overloaded ranks stay out", nil, []Candidate{
			{Worker: key(1), Saturated: true, Overloaded: true},
			{Worker: key(2), Saturated: true, ActivePrefillTokens: 4096}}, 2, nil},
		{"saturated and overloaded everywhere", nil, []Candidate{
			{Worker: key(1), Saturated: true, Overloaded: true}}, 0, ErrAllOverloaded},
		{"pinned saturated rank", &pin, []Candidate{
			{Worker: key(1)}, {Worker: key(2), Saturated: true}}, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &Request{ISL: 64, BlockSize: 16, Weights: DefaultWeights(), ServeSaturated: true, Pinned: tt.pinned}
			got, err := Policy{Scorer: CostScorer{}, Picker: ArgminPicker{}}.Select(seeded(1), req, tt.cands, nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && got.Worker.WorkerID != tt.want {
				t.Fatalf("picked worker %d, want %d", got.Worker.WorkerID, tt.want)
			}
			// Without the switch the same pool answers overloaded unless a
			// rank has room.
			req.ServeSaturated = false
			_, err = DefaultPolicy().Select(seeded(1), req, tt.cands, nil)
			room := false
			for _, c := range tt.cands {
				room = room || (!c.Saturated && !c.Overloaded && (tt.pinned == nil || c.Worker == *tt.pinned))
			}
			if room != (err == nil) {
				t.Fatalf("without ServeSaturated: err = %v with room %v", err, room)
			}
		})
	}
}
