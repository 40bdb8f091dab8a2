package kvtarget

import (
	"testing"

	"github.com/kvselect/kvselect/bench/mooncake"
)

// TestAgreesWithMapTargetOnMooncake replays a slice of the Mooncake trace into
// both the index and the obviously-correct map target, and compares every
// lookup worker by worker.
func TestAgreesWithMapTargetOnMooncake(t *testing.T) {
	reqs, err := mooncake.LoadTrace("../testdata/mooncake/conversation_trace.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	// A small pool forces plenty of evictions.
	w := mooncake.Prepare(mooncake.Config{Workers: 8, BlocksPerWorker: 512, MaxRequests: 3000, Assign: mooncake.AssignPrefixHash}, reqs)
	kv, err := New(16)
	if err != nil {
		t.Fatal(err)
	}
	ref := mooncake.NewMapTarget()
	hits := 0
	for i := range w.Len() {
		worker, locals, events := w.Request(i)
		kv.Match(locals)
		got := kv.Overlaps()
		want := ref.Overlaps(8, locals)
		for wk, n := range want {
			if got[wk] != n {
				t.Fatalf("request %d worker %d: index overlap %d, reference %d", i, wk, got[wk], n)
			}
			hits += n
		}
		for _, ev := range events {
			mooncake.Apply(kv, worker, ev)
			mooncake.Apply(ref, worker, ev)
		}
	}
	if kv.Errors() != 0 {
		t.Fatalf("index rejected %d events", kv.Errors())
	}
	if hits == 0 {
		t.Fatal("the replay produced no cache hits; the test proves nothing")
	}
	entries := 0
	for wk := range 8 {
		entries += ref.Len(wk)
	}
	if got := kv.Index().Stats().Entries; got != entries {
		t.Fatalf("index holds %d entries, reference %d", got, entries)
	}
}
