package tokenize_test

import (
	"context"
	"testing"

	"github.com/kvselect/kvselect/engines/tokenize"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// The same randomised check against an engine kvselect's authors did not
// write: llm-d-inference-sim's /tokenize (github.com/llm-d/llm-d-inference-sim),
// its dummy tokenizer and its chat template. Whatever the probe decides about
// its template, no answer may differ from the simulator's own.
func TestCacheAnswersOnlyTheSimulatorsOwnIDs(t *testing.T) {
	bin := peerproc.SimBinary(t)
	port, err := peerproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var log peerproc.LogBuffer
	sim, err := peerproc.StartSim(context.Background(), peerproc.Sim{Binary: bin, Port: port, Log: &log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(sim.Stop)
	st := checkAgainstEngine(t, sim.URL(), sim.Config().Model, tokenize.Config{}, false)
	t.Logf("llm-d-inference-sim: %+v", st)
}
