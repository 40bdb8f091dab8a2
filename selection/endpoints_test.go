package selection

import (
	"testing"
)

// rankLoads is /loads by (worker, dp rank), busy ranks only.
func rankLoads(s *Service) map[WorkerRank]PotentialLoad {
	out := map[WorkerRank]PotentialLoad{}
	for _, m := range s.Inspect().Loads(nil, nil) {
		for _, l := range m.Loads {
			if l.ActiveRequests > 0 {
				out[WorkerRank{WorkerID: l.WorkerID, DPRank: l.DPRank}] = l
			}
		}
	}
	return out
}

// Workers 1 and 2 have one rank each at worker-N:8000; worker 3 is a
// data-parallel worker whose two ranks share worker-3:8000. The booking
// starts on worker 1.
func TestRebookServedResolvesTheAddressToOneRank(t *testing.T) {
	onWorker1 := WorkerRank{WorkerID: 1}
	for _, tc := range []struct {
		name      string
		id        string
		addr      string
		preferred []WorkerRank
		want      WorkerRank // where the booking is afterwards
		wantKind  *Kind
		wantFrag  string
	}{
		{name: "own address is a no-op", id: "b", addr: "worker-1:8000",
			preferred: []WorkerRank{{WorkerID: 2}}, want: onWorker1},
		{name: "the one rank at the address", id: "b", addr: "worker-2:8000", want: WorkerRank{WorkerID: 2}},
		{name: "a preferred rank settles a data-parallel address", id: "b", addr: "worker-3:8000",
			preferred: []WorkerRank{{WorkerID: 2}, {WorkerID: 3, DPRank: 1}, {WorkerID: 3}}, want: WorkerRank{WorkerID: 3, DPRank: 1}},
		{name: "a preferred rank that is not schedulable is passed over", id: "b", addr: "worker-2:8000",
			preferred: []WorkerRank{{WorkerID: 2, DPRank: 5}}, want: WorkerRank{WorkerID: 2}},
		{name: "a data-parallel address alone is ambiguous", id: "b", addr: "worker-3:8000",
			want: onWorker1, wantKind: ptr(KindConflict), wantFrag: "worker 3 dp_rank 0, worker 3 dp_rank 1"},
		{name: "an address nobody has", id: "b", addr: "worker-9:8000",
			want: onWorker1, wantKind: ptr(KindNotFound), wantFrag: "no schedulable worker of model=model routing_group=default is at worker-9:8000"},
		{name: "an unknown booking", id: "nope", addr: "worker-2:8000",
			want: onWorker1, wantKind: ptr(KindNotFound), wantFrag: "reservation nope not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newService(t, nil)
			mustUpsert(t, s, workerRec(1))
			mustUpsert(t, s, workerRec(2))
			dp := workerRec(3)
			dp.DataParallelStartRank, dp.DataParallelSize = ptr(uint32(0)), ptr(uint32(2))
			mustUpsert(t, s, dp)
			req := selReq("b", 1, 2, 3, 4, 5, 6, 7, 8)
			req.PinnedWorker = &onWorker1
			if _, err := s.SelectAndReserve(bg, req); err != nil {
				t.Fatal(err)
			}
			booked := rankLoads(s)[onWorker1]

			resp, err := s.RebookServed(bg, tc.id, tc.addr, tc.preferred)
			if tc.wantKind != nil {
				wantKind(t, err, *tc.wantKind, tc.wantFrag)
			} else if err != nil {
				t.Fatal(err)
			} else if resp.SelectionID != "b" || resp.WorkerID != tc.want.WorkerID || resp.DPRank != tc.want.DPRank {
				t.Fatalf("response %+v, want the booking on %+v", resp, tc.want)
			}
			ls := rankLoads(s)
			got, ok := ls[tc.want]
			got.WorkerID, got.DPRank = booked.WorkerID, booked.DPRank
			if len(ls) != 1 || !ok || got != booked {
				t.Fatalf("loads %+v, want only %+v carrying the booking's %+v", ls, tc.want, booked)
			}
			// The row follows the load: a free after the move empties the rank.
			if err := s.Free(bg, "b"); err != nil {
				t.Fatal(err)
			}
			if ls := rankLoads(s); len(ls) != 0 {
				t.Fatalf("load left after free: %+v", ls)
			}
		})
	}
}
