package selection

import (
	"testing"
)

// OutputTokens is checked against OutputBlock: a booking on worker 1 reports
// streamed token counts, its twin on worker 2 gets the output blocks those
// counts should add, each with the decay fraction 1 − tokens so far /
// expected output tokens (floored at 0; none without an expectation). Both
// ranks must then show the same load in /loads. Block size is 4.
func TestOutputTokensAddsDecayedBlocksLikeOutputBlock(t *testing.T) {
	for _, tc := range []struct {
		name      string
		expected  *uint32
		counts    []int // cumulative streamed tokens, one OutputTokens call each
		wantAdded []int
		fractions []*float64 // the twin's OutputBlock calls
	}{
		{"one block per whole block size", ptr(uint32(16)), []int{3, 4, 9}, []int{0, 1, 1}, []*float64{ptr(0.75), ptr(0.5)}},
		{"several blocks in one report", ptr(uint32(16)), []int{12}, []int{3}, []*float64{ptr(0.75), ptr(0.5), ptr(0.25)}},
		{"a repeated or smaller count adds nothing", ptr(uint32(16)), []int{8, 8, 5, 0}, []int{2, 0, 0, 0}, []*float64{ptr(0.75), ptr(0.5)}},
		{"past the expected length the weight is zero", ptr(uint32(4)), []int{8}, []int{2}, []*float64{ptr(0.0), ptr(0.0)}},
		{"without an expected length blocks weigh one", nil, []int{8}, []int{2}, []*float64{nil, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newService(t, nil)
			mustUpsert(t, s, workerRec(1))
			mustUpsert(t, s, workerRec(2))
			for i, id := range []string{"streamed", "blocks"} {
				req := selReq(id, 1, 2, 3, 4, 5, 6, 7, 8)
				req.PinnedWorker = &WorkerRank{WorkerID: uint64(i + 1)}
				req.ExpectedOutputTokens = tc.expected
				if _, err := s.SelectAndReserve(bg, req); err != nil {
					t.Fatal(err)
				}
			}
			before := loadsByWorker(s)[1]
			for i, n := range tc.counts {
				added, err := s.OutputTokens(bg, "streamed", n)
				if err != nil || added != tc.wantAdded[i] {
					t.Fatalf("OutputTokens(%d) = %d, %v; want %d", n, added, err, tc.wantAdded[i])
				}
			}
			for _, f := range tc.fractions {
				if err := s.OutputBlock(bg, "blocks", f); err != nil {
					t.Fatal(err)
				}
			}
			ls := loadsByWorker(s)
			got, want := ls[1], ls[2]
			want.WorkerID = 1
			if got != want {
				t.Fatalf("streamed booking's load %+v, OutputBlock twin's %+v", got, want)
			}
			undecayed := before.PotentialDecodeBlocks + uint64(len(tc.fractions))
			if tc.expected != nil && got.PotentialDecodeBlocks == undecayed {
				t.Fatalf("decode blocks %d: the output blocks were not decayed", got.PotentialDecodeBlocks)
			}
		})
	}
}

func TestOutputTokensErrors(t *testing.T) {
	s, _ := newService(t, nil)
	mustUpsert(t, s, workerRec(1))
	if _, err := s.SelectAndReserve(bg, selReq("live", 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	before := loadOf(t, s)
	_, err := s.OutputTokens(bg, "live", -1)
	wantKind(t, err, KindBadRequest, "must not be negative")
	_, err = s.OutputTokens(bg, "nope", 4)
	wantKind(t, err, KindNotFound, "reservation nope not found")
	if err := s.Free(bg, "live"); err != nil {
		t.Fatal(err)
	}
	_, err = s.OutputTokens(bg, "live", 4)
	wantKind(t, err, KindNotFound, "reservation live not found")
	if before.ActiveRequests != 1 || loadOf(t, s).ActiveRequests != 0 {
		t.Fatalf("loads before %+v after %+v", before, loadOf(t, s))
	}
}
