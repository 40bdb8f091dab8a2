package mesh

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

func benchAdd(blocks int) selection.BookingEvent {
	hs := make([]uint64, blocks)
	for i := range hs {
		hs[i] = rand.Uint64()
	}
	return selection.BookingEvent{Kind: selection.BookingAdded, Partition: index.Partition{Model: "llama-3-70b", RoutingGroup: "default"},
		BlockSize: 16, RequestID: "0b6c1f9e-2f7c-4a55-9d0e-8d7f3f1b2a10", Worker: index.WorkerKey{WorkerID: 12, DPRank: 3},
		Origin: rand.Uint64(), TrackingHashes: hs, TrackPrefill: true, ExpectedOutputTokens: ptr(uint32(256)), PrefillTokens: ptr(uint64(blocks * 16))}
}

// BenchmarkAppendBooking encodes an AddRequest for a 128-block prompt.
func BenchmarkAppendBooking128Blocks(b *testing.B) {
	ev := benchAdd(128)
	buf := AppendBooking(nil, &ev)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		buf = AppendBooking(buf[:0], &ev)
	}
}

// BenchmarkDecodeBooking decodes the same AddRequest.
func BenchmarkDecodeBooking128Blocks(b *testing.B) {
	ev := benchAdd(128)
	p := AppendBooking(nil, &ev)
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := DecodeBooking(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMeshAddFree measures the mesh end to end over loopback ZMQ: A books
// and frees, and the benchmark waits until B has applied both events, one
// booking at a time (latency, not pipelined throughput).
func BenchmarkMeshAddFree(b *testing.B) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	build := func(seed uint64) (*selection.Service, *Mesh) {
		rc := routerconfig.Default()
		rc.UseKVEvents = false
		svc, err := selection.New(selection.Config{Router: rc, Clock: clk.Now, Rand: rand.New(rand.NewPCG(seed, seed))})
		if err != nil {
			b.Fatal(err)
		}
		ep, bs := "http://w:8000", uint32(16)
		if _, err := svc.UpsertWorker(bg, catalog.Record{WorkerID: 1, ModelName: "model", Endpoint: &ep, BlockSize: &bs}); err != nil {
			b.Fatal(err)
		}
		m, err := Start(bg, svc.Replica(), Options{Bind: "tcp://127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		return svc, m
	}
	a, am := build(1)
	_, bm := build(2)
	if _, err := bm.Register("tcp://" + am.Addr().String()); err != nil {
		b.Fatal(err)
	}
	hashes := make([]int64, 64)
	for i := range hashes {
		hashes[i] = int64(i + 1)
	}
	isl := uint64(64 * 16)
	book := func(id string) {
		if _, err := a.Reserve(bg, &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "model"}, SelectionID: &id,
			WorkerID: ptr(uint64(1)), PromptRequest: selection.PromptRequest{SequenceHashes: hashes, ISLTokens: &isl}}); err != nil {
			b.Fatal(err)
		}
		if err := a.Free(bg, id); err != nil {
			b.Fatal(err)
		}
	}
	applied := func() uint64 {
		return bm.c.bookingOutcomes[selection.RemoteApplied].Load() + bm.c.bookingOutcomes[selection.RemoteUnknownRequest].Load()
	}
	// Wait for the subscription to carry events (slow joiner).
	for i := 0; applied() == 0; i++ {
		if i > 3000 {
			b.Fatal("mesh never connected")
		}
		book(fmt.Sprint("warm-", i))
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		want := applied() + 2
		book(fmt.Sprint("r-", i))
		for applied() < want {
			time.Sleep(20 * time.Microsecond)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/add+free")
}

// benchSealVerify signs a message as the publisher does and verifies it as a
// subscriber does (tag check and replay window), per message.
func benchSealVerify(b *testing.B, payload []byte) {
	key := make([]byte, MinKeyBytes)
	pub, err := newAuthenticator([][]byte{key}, 1)
	if err != nil {
		b.Fatal(err)
	}
	sub, err := newAuthenticator([][]byte{key}, 2)
	if err != nil {
		b.Fatal(err)
	}
	topic := []byte(TopicSlotTracker)
	frames := [][]byte{topic, payload, nil}
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	var seq uint64
	for b.Loop() {
		seq++
		frames[2] = pub.seal(frames[2][:0], seq, topic, payload)
		if r := sub.open(frames); r != accepted {
			b.Fatal(r)
		}
	}
}

// BenchmarkAuthSealVerifyFree: a Free (≈180 bytes), the smallest message.
func BenchmarkAuthSealVerifyFree(b *testing.B) {
	ev := benchAdd(0)
	ev.Kind, ev.TrackingHashes, ev.ExpectedOutputTokens, ev.PrefillTokens = selection.BookingFreed, nil, nil, nil
	benchSealVerify(b, AppendBooking(nil, &ev))
}

// BenchmarkAuthSealVerify128Blocks: an AddRequest of 128 tracking hashes.
func BenchmarkAuthSealVerify128Blocks(b *testing.B) {
	ev := benchAdd(128)
	benchSealVerify(b, AppendBooking(nil, &ev))
}
