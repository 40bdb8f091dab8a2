package selection

import (
	"fmt"
	"testing"
)

// BenchmarkApplyRemoteAddFree applies a peer's AddRequest (64 tracking hashes)
// and its Free to a service with 64 workers: the inbound cost per mirrored
// booking.
func BenchmarkApplyRemoteAddFree(b *testing.B) {
	s, _ := newService(b, nil)
	for id := uint64(1); id <= 64; id++ {
		mustUpsert(b, s, workerRec(id))
	}
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	prefill := uint64(256)
	p := s.parts.Get(partitionOf(PartitionKey{ModelName: "model"}))
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprint("req-", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev := BookingEvent{Kind: BookingAdded, Partition: p.Key(), BlockSize: p.BlockSize(), RequestID: ids[i%len(ids)],
			Worker: p.Workers().Ranks[i%64], Origin: s.Replica().ReplicaID() ^ 1, TrackingHashes: hashes, TrackPrefill: true, PrefillTokens: &prefill}
		if out := s.Replica().ApplyRemoteBooking(ev); out != RemoteApplied {
			b.Fatal(out)
		}
		ev.Kind = BookingFreed
		if out := s.Replica().ApplyRemoteBooking(ev); out != RemoteApplied {
			b.Fatal(out)
		}
	}
}
