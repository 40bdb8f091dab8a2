package selection

import (
	"fmt"
	"testing"
)

// BenchmarkLifecycle is a whole traced booking as the ext_proc picker makes
// it: select_and_reserve of a 128-block prompt over 64 workers, the first
// token (prefill_complete: the latency model's TTFT fit), 32 streamed output
// tokens, and the free (its ITL fit).
func BenchmarkLifecycle(b *testing.B) {
	s, prompts := benchService(b, 64)
	benchLifecycle(b, s, prompts)
}

func benchLifecycle(b *testing.B, s *Service, prompts [][]uint32) {
	reqs := make([]*SelectRequest, len(prompts))
	ids := make([]string, len(prompts))
	for i, t := range prompts {
		reqs[i] = &SelectRequest{PartitionKey: PartitionKey{ModelName: "m"}, PromptRequest: PromptRequest{TokenIDs: t}}
		ids[i] = fmt.Sprintf("bench-%d", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := i % len(reqs)
		reqs[k].SelectionID = &ids[k]
		if _, err := s.SelectAndReserve(bg, reqs[k]); err != nil {
			b.Fatal(err)
		}
		if err := s.PrefillComplete(bg, ids[k]); err != nil {
			b.Fatal(err)
		}
		if _, err := s.OutputTokens(bg, ids[k], 32); err != nil {
			b.Fatal(err)
		}
		if err := s.Free(bg, ids[k]); err != nil {
			b.Fatal(err)
		}
	}
}
