package index

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestPartitionsBlockSizeIsFrozen(t *testing.T) {
	ps, err := NewPartitions(Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := Partition{"llama", "default"}
	a, err := ps.Ensure(p, 16)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := ps.Ensure(p, 16); err != nil || b != a {
		t.Fatalf("second Ensure: %v %v", b, err)
	}
	if _, err := ps.Ensure(p, 32); !errors.Is(err, ErrConfig) {
		t.Fatalf("block size change: err = %v, want ErrConfig", err)
	}
	if _, err := ps.Ensure(Partition{"llama", "tenant-b"}, 32); err != nil {
		t.Fatalf("another routing group may use another block size: %v", err)
	}
	if got := ps.List(); len(got) != 2 || got[0].RoutingGroup != "default" {
		t.Fatalf("list = %v", got)
	}
	ps.Remove(p)
	if ps.Get(p) != nil {
		t.Fatal("removed partition still present")
	}
	if _, err := NewPartitions(Config{CachePolicy: PolicyLRU}); !errors.Is(err, ErrConfig) {
		t.Fatalf("lru with events: err = %v", err)
	}
}

func TestPartitionsDumpRestore(t *testing.T) {
	src, _ := NewPartitions(Config{})
	a, _ := src.Ensure(Partition{"m", "default"}, 16)
	b, _ := src.Ensure(Partition{"m", "group:with:colons"}, 32)
	mustApplyIx(t, a, stored(w(1), 0, 1, 2, 3))
	mustApplyIx(t, b, stored(w(2), 0, 4, 5), onTier(stored(w(2), 5, 6), TierHostPinned))
	raw, err := json.Marshal(src.Dump())
	if err != nil {
		t.Fatal(err)
	}
	d, err := DecodeDump(raw)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := NewPartitions(Config{})
	// A conflicting local partition is reported, the rest restored.
	dst.Ensure(Partition{"m", "default"}, 64)
	res := dst.Restore(time.Unix(0, 0), d)
	if len(res) != 2 || !errors.Is(res[0].Err, ErrConfig) || res[1].Err != nil || res[1].Events != 2 {
		t.Fatalf("restore results: %+v", res)
	}
	got := dst.Get(Partition{"m", "group:with:colons"}).Match([]uint64{4, 5, 6}, false, nil)
	if len(got) != 1 || got[0].Device != 2 || got[0].Host != 1 {
		t.Fatalf("restored match = %+v", got)
	}
	empty, _ := NewPartitions(Config{})
	if res := empty.Restore(time.Unix(0, 0), Dump{}); len(res) != 0 {
		t.Fatal("an empty dump restores nothing")
	}
}

func mustApplyIx(t *testing.T, ix *Index, evs ...*Event) {
	t.Helper()
	for _, ev := range evs {
		if err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
}
