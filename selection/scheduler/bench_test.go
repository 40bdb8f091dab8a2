package scheduler

import (
	"fmt"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// benchCandidates is a DP=8 fleet with mixed overlap, tier hits, load and taints.
func benchCandidates(n int) []Candidate {
	cands := make([]Candidate, n)
	for i := range cands {
		cands[i] = Candidate{
			Worker:              index.WorkerKey{WorkerID: uint64(i / 8), DPRank: uint32(i % 8)},
			Overlap:             index.Overlap{Device: uint32(i * 7 % 64), Host: uint32(i % 5), Disk: uint32(i % 3)},
			ActivePrefillTokens: i * 97 % 8192,
			ActiveDecodeBlocks:  i * 31 % 4096,
			ActiveRequests:      i % 17,
			AdditionalBlocks:    64 - i*7%64,
			Taints:              []string{"zone-a", "gpu=h100"}[:1+i%2],
		}
	}
	return cands
}

func benchRequest(temp float64) *Request {
	w := DefaultWeights()
	w.Temperature = temp
	w.OverlapScoreCreditDecay = 0.5
	return &Request{
		ISL: 1024, BlockSize: 16, Weights: w, TrackedBlocks: 64,
		PreferredTaints: map[string]float64{"gpu=h100": 0.3},
	}
}

// BenchmarkSelect measures scoring plus picking over n candidates with a
// reused Scratch, the service's hot path.
func BenchmarkSelect(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		for _, mode := range []struct {
			name string
			temp float64
		}{{"argmin", 0}, {"softmax", 0.5}} {
			b.Run(fmt.Sprintf("%s/%d", mode.name, n), func(b *testing.B) {
				cands := benchCandidates(n)
				req := benchRequest(mode.temp)
				rnd := seeded(1)
				var s Scratch
				p := DefaultPolicy()
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.Select(rnd, req, cands, &s); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/candidate")
			})
		}
	}
}

func BenchmarkQueuePushPop(b *testing.B) {
	for _, policy := range []QueuePolicy{FCFS, WSPT} {
		b.Run(policy.String(), func(b *testing.B) {
			q := NewQueue[int](policy, epoch)
			for i := range 1024 {
				q.Push(epoch.Add(secs(float64(i))), Entry[int]{Payload: i, ISL: 100 + i%900})
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				e, _ := q.Pop()
				q.Push(epoch.Add(secs(float64(i))), e)
				i++
			}
		})
	}
}
