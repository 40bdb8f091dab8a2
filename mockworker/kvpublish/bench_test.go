package kvpublish

import (
	"context"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/engines/kvevents"
)

// BenchmarkPublish64BlocksThroughSockets publishes 64-block BlockStored
// batches through a real PUB socket on loopback to a SUB socket that parses
// and decodes every batch with kvselect's decoder, and reports the blocks per
// second that arrive. Each iteration is one batch.
func BenchmarkPublish64BlocksThroughSockets(b *testing.B) {
	for _, shape := range []Shape{ShapeMap, ShapePositional} {
		b.Run(shape.String(), func(b *testing.B) { benchSockets(b, shape) })
	}
}

func benchSockets(b *testing.B, shape Shape) {
	const bs, n = 16, 64
	p, err := New(context.Background(), Options{Endpoint: "tcp://127.0.0.1:0", HWM: -1, Shape: shape, Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(p.Endpoint()); err != nil {
		b.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		b.Fatal(err)
	}
	dec, err := kvevents.NewDecoder(kvevents.Config{WorkerID: 1, BlockSize: bs})
	if err != nil {
		b.Fatal(err)
	}
	// received carries the seq of each batch the subscriber decoded.
	received := make(chan uint64, 1<<16)
	go func() {
		defer close(received)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			_, seq, payload, err := kvevents.ParseMessage(msg.Frames)
			if err == nil {
				_, _, err = dec.Decode(payload, nil)
			}
			if err != nil {
				b.Error(err)
				return
			}
			received <- seq
		}
	}()
	// Warm up until the subscription is live.
	got := ^uint64(0)
	for got == ^uint64(0) {
		if _, err := p.Publish(nil); err != nil {
			b.Fatal(err)
		}
		select {
		case got = <-received:
		case <-time.After(20 * time.Millisecond):
		}
	}
	for warm := p.NextSeq() - 1; got != warm; {
		got = <-received
	}

	rank := 0
	ev := &BlockStored{BlockSize: bs, Medium: "GPU", TokenIDs: tokens(30000, n*bs), BlockHashes: make([]uint64, n)}
	b.ReportAllocs()
	b.ResetTimer()
	var last uint64
	for i := range b.N {
		for j := range ev.BlockHashes {
			ev.BlockHashes[j] = uint64(i*n+j) | 1<<63
		}
		if last, err = p.Publish(&rank, ev); err != nil {
			b.Fatal(err)
		}
	}
	for s := range received {
		if s == last {
			break
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkPublish64BlocksNoSubscriber is the publisher's own cost per
// 64-block batch: encode, one frame allocation, ring, and zmq4's PUB queue
// (whose writer goroutine drops the message for want of subscribers).
func BenchmarkPublish64BlocksNoSubscriber(b *testing.B) {
	const bs, n = 16, 64
	p, err := New(context.Background(), Options{Endpoint: "tcp://127.0.0.1:0", Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	rank := 0
	ev := &BlockStored{BlockSize: bs, Medium: "GPU", TokenIDs: tokens(30000, n*bs), BlockHashes: make([]uint64, n)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range ev.BlockHashes {
			ev.BlockHashes[j] = uint64(i*n+j) | 1<<63
		}
		if _, err := p.Publish(&rank, ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "blocks/s")
}
