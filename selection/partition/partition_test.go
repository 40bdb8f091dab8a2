package partition

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/admission"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/loads"
	"github.com/kvselect/kvselect/selection/scheduler"
)

var t0 = time.Unix(1_700_000_000, 0)

func build(key index.Partition, blockSize uint32, eagle bool) (*Partition, error) {
	ix, err := index.New(index.Config{BlockSize: blockSize, Approximate: true, TTL: time.Minute})
	if err != nil {
		return nil, err
	}
	lt, err := loads.New(loads.Config{BlockSize: blockSize, TrackActiveBlocks: true, Expiry: time.Minute})
	if err != nil {
		return nil, err
	}
	return New(Parts{Key: key, BlockSize: blockSize, Eagle: eagle, Index: ix, Loads: lt, Rand: rand.New(rand.NewPCG(1, 2)),
		Queue: admission.New(key, Name(key), scheduler.FCFS, nil, t0)}), nil
}

func record(id uint64, dpSize uint32) *catalog.Record {
	ep, bs := "10.0.0.1:8000", uint32(4)
	r := &catalog.Record{WorkerID: id, ModelName: "m", Endpoint: &ep, BlockSize: &bs}
	if dpSize > 1 {
		r.DataParallelSize = &dpSize
	}
	return r
}

func TestSetFreezesBlockSizeAndEagleMode(t *testing.T) {
	set := NewSet(build)
	key := index.Partition{Model: "m", RoutingGroup: "default"}
	p, err := set.Ensure(key, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := set.Ensure(key, 4, false); err != nil || again != p {
		t.Fatalf("a second Ensure made another partition: %v", err)
	}
	for _, tc := range []struct {
		blockSize uint32
		eagle     bool
		frag      string
	}{
		{8, false, "block_size mismatch for model=m routing_group=default: existing=4 requested=8"},
		{4, true, "is_eagle mismatch for model=m routing_group=default: existing=false requested=true"},
	} {
		if _, err := set.Ensure(key, tc.blockSize, tc.eagle); err == nil || !strings.Contains(err.Error(), tc.frag) {
			t.Errorf("Ensure(%d, %v) = %v, want %q", tc.blockSize, tc.eagle, err, tc.frag)
		}
	}
	if set.AnySchedulable() {
		t.Fatal("a partition without workers counts as schedulable")
	}
	p.Publish(record(1, 1))
	if !set.AnySchedulable() || set.Get(key) != p || len(set.All()) != 1 {
		t.Fatal("the published worker is not schedulable through the set")
	}
}

func TestReplaceWorkersDropsTheBookingsOfRanksThatLeft(t *testing.T) {
	p, err := build(index.Partition{Model: "m", RoutingGroup: "default"}, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	if dropped := p.Publish(record(1, 2)); len(dropped) != 0 {
		t.Fatalf("joining dropped %v", dropped)
	}
	ranks := p.Workers().Ranks
	if len(ranks) != 2 || ranks[1] != (index.WorkerKey{WorkerID: 1, DPRank: 1}) {
		t.Fatalf("ranks %v", ranks)
	}
	if err := p.Book(func() time.Time { return t0 }, loads.Booking{RequestID: "r1", Worker: ranks[1], ISL: 4}); err != nil {
		t.Fatal(err)
	}
	if err := p.Book(func() time.Time { return t0 }, loads.Booking{RequestID: "r1", Worker: ranks[0], ISL: 4}); apierr.KindOf(err) != apierr.Conflict {
		t.Fatalf("a booking id booked twice: %v, want a conflict", err)
	}
	// The worker shrinks to one rank: the booking on rank 1 goes with it.
	if dropped := p.Publish(record(1, 1)); len(dropped) != 1 || dropped[0] != "r1" {
		t.Fatalf("shrinking dropped %v, want [r1]", dropped)
	}
	if ws := p.Workers(); ws.Schedulable(affinity.RankTarget(index.WorkerKey{WorkerID: 1, DPRank: 1})) ||
		!ws.Schedulable(affinity.WorkerTarget(1)) {
		t.Fatal("schedulable targets do not follow the shrink")
	}
}

func TestOverlapOf(t *testing.T) {
	rows := []index.Overlap{{Worker: index.WorkerKey{WorkerID: 1}, Device: 3}, {Worker: index.WorkerKey{WorkerID: 2, DPRank: 1}, Device: 5}}
	if got := OverlapOf(rows, index.WorkerKey{WorkerID: 2, DPRank: 1}); got.Device != 5 {
		t.Fatalf("found %+v", got)
	}
	if got := OverlapOf(rows, index.WorkerKey{WorkerID: 2}); got != (index.Overlap{}) {
		t.Fatalf("a missing rank has %+v, want a zero row", got)
	}
}
