package kvlisten

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/kvselect/kvselect/mockworker/kvpublish"
	"github.com/kvselect/kvselect/selection/index"
)

// BenchmarkIngest measures KV events decoded and applied per second through
// real loopback sockets: P engines (kvpublish PUB sockets with vLLM's send
// high-water mark) each alternate a 64-block BlockStored batch (block size 16,
// so 1,024 token ids that the decoder hashes) with the BlockRemoved batch of the
// same blocks, into one partition index through the listeners' writer lanes.
// One op is one 64-block batch; blocks/s counts stored plus removed blocks.
// Publishing runs in the same process and shares the 2 cores.
//
// mode=subscribe is vLLM's and Dynamo's topology: each engine binds its PUB
// socket and a listener dials it. mode=collector is llm-d's: every engine
// dials one bound collector socket, and messages are routed by topic.
//
//	go test -run '^$' -bench Ingest -benchtime 20000x -count 3 ./engines/kvlisten
func BenchmarkIngest(b *testing.B) {
	for _, mode := range []string{"subscribe", "collector"} {
		for _, tc := range []struct{ publishers, lanes int }{{1, 1}, {1, 4}, {16, 1}, {16, 4}} {
			b.Run(fmt.Sprintf("mode=%s/publishers=%d/lanes=%d", mode, tc.publishers, tc.lanes), func(b *testing.B) {
				benchIngest(b, mode == "collector", tc.publishers, tc.lanes)
			})
		}
	}
}

const (
	ingestBlocks    = 64
	ingestBlockSize = 16
)

// ingestPayloads pre-encodes one engine's store and remove batches, so the
// benchmark's publishing side costs a socket send, not an encode.
func ingestPayloads(engine int) (store, remove []byte) {
	hashes := make([]uint64, ingestBlocks)
	tokens := make([]uint32, ingestBlocks*ingestBlockSize)
	for i := range hashes {
		hashes[i] = uint64(engine)<<32 | uint64(i+1)
	}
	for i := range tokens {
		tokens[i] = uint32(engine*100000 + i)
	}
	rank := 0
	store = kvpublish.AppendBatch(nil, 1.7e9, []kvpublish.Event{&kvpublish.BlockStored{
		BlockHashes: hashes, TokenIDs: tokens, BlockSize: ingestBlockSize, Medium: "GPU"}}, &rank)
	remove = kvpublish.AppendBatch(nil, 1.7e9, []kvpublish.Event{&kvpublish.BlockRemoved{
		BlockHashes: hashes, Medium: "GPU"}}, &rank)
	return store, remove
}

func benchIngest(b *testing.B, collector bool, publishers, lanes int) {
	ix, err := index.New(index.Config{BlockSize: ingestBlockSize})
	if err != nil {
		b.Fatal(err)
	}
	l := New(context.Background(), Options{Logger: quietLogger(), Lanes: lanes, LaneQueue: 4096})
	defer l.Close()
	pubs := make([]*kvpublish.Publisher, publishers)
	keys := make([]index.WorkerKey, publishers)
	store := make([][]byte, publishers)
	remove := make([][]byte, publishers)
	collectorEP := ""
	if collector {
		if collectorEP, err = l.Bind("tcp://127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
	}
	for i := range pubs {
		opts := kvpublish.Options{Endpoint: "tcp://127.0.0.1:0",
			ReplayEndpoint: "tcp://127.0.0.1:0", HWM: 100_000, RingSize: 1 << 16, Logger: quietLogger()}
		hostPort := fmt.Sprintf("10.0.0.%d:8000", i+1) // what the topic names; nothing listens there
		if collector {
			opts.Endpoint, opts.Connect, opts.Topic = collectorEP, true, "kv@"+hostPort+"@m"
		}
		p, err := kvpublish.New(context.Background(), opts)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		pubs[i], keys[i] = p, index.WorkerKey{WorkerID: uint64(i + 1)}
		store[i], remove[i] = ingestPayloads(i)
		a := attachment(ix, keys[i], p.Endpoint(), p.ReplayEndpoint())
		if collector {
			a = collected(ix, part, keys[i], hostPort, "", p.ReplayEndpoint())
		}
		a.BlockSize = ingestBlockSize
		if err := l.Attach(a); err != nil {
			b.Fatal(err)
		}
	}
	// Synchronise every subscriber with a first batch so that the timed part
	// starts on live, caught-up streams.
	for i, p := range pubs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, _ := l.Status(part, keys[i])
			if st.Synced {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("publisher %d: subscriber never synced", i)
			}
			p.PublishRaw(remove[i]) // removing blocks nobody holds: a harmless no-op batch
			time.Sleep(5 * time.Millisecond)
		}
	}
	base := make([]uint64, publishers)
	for i := range keys {
		st, _ := l.Status(part, keys[i])
		base[i] = st.Blocks
	}
	per := (b.N + publishers - 1) / publishers
	want := uint64(per * ingestBlocks)

	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	errs := make(chan error, publishers)
	for i, p := range pubs {
		go func() {
			for n := range per {
				payload := store[i]
				if n%2 == 1 {
					payload = remove[i]
				}
				if _, err := p.PublishRaw(payload); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range pubs {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	var replays uint64
	for i := range keys {
		for {
			st, _ := l.Status(part, keys[i])
			// A batch the index rejects still counts its blocks as applied;
			// a lost one never arrives, so the wait below would not end.
			if st.Blocks-base[i] >= want || st.Lost > 0 {
				if st.Lost > 0 {
					b.Fatalf("publisher %d: %d batches lost: %+v", i, st.Lost, st)
				}
				replays += st.Replays
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	total := float64(per * publishers * ingestBlocks)
	b.ReportMetric(total/elapsed.Seconds(), "blocks/s")
	// CPU per block (publishers included) moves less than wall time when
	// other work shares the machine.
	b.ReportMetric(float64(cpu.Nanoseconds())/total, "cpu-ns/block")
	b.ReportMetric(float64(replays), "replays")
}

// processCPU is the user plus system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
