package selection

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// Text prompts learn from routing into their own index: the second request
// with the same prefix goes where the first went, and the token index never
// sees the text hashes (Dump stays empty even in approximate mode).
func TestTextPromptLearnsFromRoutingInItsOwnIndex(t *testing.T) {
	s, _ := newService(t, nil)
	for id := uint64(1); id <= 4; id++ {
		mustUpsert(t, s, workerRec(id))
	}
	prefix := strings.Repeat("system prompt: you are helpful. ", 20)
	first, err := s.SelectAndReserve(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
		PromptRequest: PromptRequest{PromptText: prefix + "question one"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PrefillComplete(bg, *first.SelectionID); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(bg, *first.SelectionID); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r, err := s.Select(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
			PromptRequest: PromptRequest{PromptText: prefix + "another question " + itoa(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if r.WorkerID != first.WorkerID || r.Overlap.GPU == 0 {
			t.Fatalf("request %d went to worker %d (gpu overlap %d), want worker %d with overlap", i, r.WorkerID, r.Overlap.GPU, first.WorkerID)
		}
	}
	if d := s.Inspect().Dump(); len(d[index.PartitionKey("model", "default")].Events) != 0 {
		t.Fatalf("text hashes leaked into the token index: %+v", d)
	}
}

func TestFallbacksAreTheNextCheapestRanksInCostOrder(t *testing.T) {
	s, _ := newService(t, nil)
	for id := uint64(1); id <= 4; id++ {
		mustUpsert(t, s, workerRec(id))
	}
	// Load workers 2 and 3 unevenly so the order is determined by cost.
	book := func(id string, w uint64, prefill uint64) {
		t.Helper()
		r := explicit(id, w, prefill)
		r.ISLTokens = ptr(prefill)
		if _, err := s.Reserve(bg, r); err != nil {
			t.Fatal(err)
		}
	}
	book("a", 2, 40)
	book("b", 3, 80)
	book("c", 4, 8)
	req := selReq("", 1, 2, 3, 4, 5, 6, 7, 8)
	req.Fallbacks = 2
	r, err := s.SelectAndReserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	if r.WorkerID != 1 {
		t.Fatalf("picked %d, want the idle worker 1", r.WorkerID)
	}
	want := []uint64{4, 2}
	if len(r.Fallbacks) != 2 || r.Fallbacks[0].WorkerID != want[0] || r.Fallbacks[1].WorkerID != want[1] {
		t.Fatalf("fallbacks %+v, want workers %v in order", r.Fallbacks, want)
	}
	if r.Fallbacks[0].Endpoint != "http://worker-4:8000" {
		t.Fatalf("fallback endpoint %q", r.Fallbacks[0].Endpoint)
	}
	plain, err := s.Select(bg, selReq("", 1, 2, 3, 4))
	if err != nil || plain.Fallbacks != nil {
		t.Fatalf("no fallbacks unless asked: %+v %v", plain.Fallbacks, err)
	}
}

func TestRebookMovesTheLoadToTheServingRank(t *testing.T) {
	s, _ := newService(t, nil)
	for id := uint64(1); id <= 2; id++ {
		mustUpsert(t, s, workerRec(id))
	}
	r, err := s.SelectAndReserve(bg, selReq("m", 1, 2, 3, 4, 5, 6, 7, 8))
	if err != nil {
		t.Fatal(err)
	}
	other := uint64(3) - r.WorkerID
	if err := s.OutputBlock(bg, "m", nil); err != nil {
		t.Fatal(err)
	}
	before := loadsByWorker(s)
	if _, err := s.rebook(bg, "m", WorkerRank{WorkerID: other}); err != nil {
		t.Fatal(err)
	}
	after := loadsByWorker(s)
	moved := after[other]
	moved.WorkerID = r.WorkerID
	if moved != before[r.WorkerID] || after[r.WorkerID] != (PotentialLoad{WorkerID: r.WorkerID}) {
		t.Fatalf("load did not move from %d to %d: before %+v after %+v", r.WorkerID, other, before, after)
	}
	if _, err := s.rebook(bg, "m", WorkerRank{WorkerID: 9}); KindOf(err) != KindNotFound {
		t.Fatalf("rebook to an unknown worker: %v", err)
	}
	if err := s.Free(bg, "m"); err != nil {
		t.Fatal(err)
	}
	for w, l := range loadsByWorker(s) {
		if l.ActiveRequests != 0 || l.PotentialDecodeBlocks != 0 || l.PotentialPrefillTokens != 0 {
			t.Fatalf("worker %d keeps load after free: %+v", w, l)
		}
	}
	if _, err := s.rebook(bg, "m", WorkerRank{WorkerID: 1}); KindOf(err) != KindNotFound {
		t.Fatalf("rebook of a freed booking: %v", err)
	}
}

func loadsByWorker(s *Service) map[uint64]PotentialLoad {
	out := map[uint64]PotentialLoad{}
	for _, m := range s.Inspect().Loads(nil, nil) {
		for _, l := range m.Loads {
			out[l.WorkerID] = l
		}
	}
	return out
}

// Every way a booking is made teaches the text index the prompt's text
// chain when the request came with its text: /select_and_reserve, and a
// /select with a selection id followed by POST /reservations replaying it,
// for a text prompt and for token ids that came with their text. Ids alone,
// or a select that is never reserved, teach nothing.
func TestBookingsTeachTheTextIndex(t *testing.T) {
	text := strings.Repeat("a system prompt shared by many sessions. ", 30)
	tokens := make([]uint32, 300)
	for i := range tokens {
		tokens[i] = uint32(2000 + i)
	}
	for _, tc := range []struct {
		name      string
		ids, text bool
		how       string // select_and_reserve, replay, or select (never reserved)
		wantLearn bool
	}{
		{"ids only, select_and_reserve", true, false, "select_and_reserve", false},
		{"ids with text, select_and_reserve", true, true, "select_and_reserve", true},
		{"text, replayed", false, true, "replay", true},
		{"ids with text, replayed", true, true, "replay", true},
		{"text, selected only", false, true, "select", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newService(t, nil)
			for id := uint64(1); id <= 4; id++ {
				mustUpsert(t, s, workerRec(id))
			}
			id := "sel-1"
			req := &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"}, SelectionID: &id, AllowedWorkerIDs: []uint64{3}}
			if tc.ids {
				req.TokenIDs = tokens
			}
			if tc.text {
				req.PromptText = text
			}
			switch tc.how {
			case "select_and_reserve":
				if _, err := s.SelectAndReserve(bg, req); err != nil {
					t.Fatal(err)
				}
			default:
				if _, err := s.Select(bg, req); err != nil {
					t.Fatal(err)
				}
				if tc.how == "replay" {
					if _, err := s.Reserve(bg, &ReservationRequest{PartitionKey: req.PartitionKey, SelectionID: &id}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.how != "select" {
				if err := s.Free(bg, id); err != nil {
					t.Fatal(err)
				}
			}
			probe, err := s.Select(bg, &SelectRequest{PartitionKey: PartitionKey{ModelName: "model"},
				PromptRequest: PromptRequest{PromptText: text}})
			if err != nil {
				t.Fatal(err)
			}
			learned := probe.WorkerID == 3 && probe.Overlap.GPU > 0
			if learned != tc.wantLearn {
				t.Fatalf("text probe went to worker %d with gpu overlap %d; learned=%v, want %v",
					probe.WorkerID, probe.Overlap.GPU, learned, tc.wantLearn)
			}
		})
	}
}

// FuzzAppendJSONString holds ChatText's string reader to encoding/json: the
// same string for every literal encoding/json takes, and a refusal (dst
// unchanged) for every one it refuses.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{`""`, `"a"`, `"a\nb\"c\\d\/e\bf\fg\rh\ti"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`,
		`"\ude00\ud83d"`, `"\ud83d\u0041"`, `"\uD83D\uDE00"`, "\"\xff\xfe\"", "\"\xed\xa0\x80\"", `"\x"`, `"\u12"`, `"a"b"`, "\"\x01\"", `"\`, `"`,
		`"é中😀"`, `"\ud83d\uzzzz"`, `x`, `"a" `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		raw = bytes.TrimSpace(raw) // as ChatText hands it over
		prefix := []byte("p:")
		got, ok := appendJSONString(prefix, raw)
		var want string
		err := json.Unmarshal(raw, &want)
		if ok != (err == nil) {
			t.Fatalf("%q: ok %v, encoding/json %v", raw, ok, err)
		}
		if !ok {
			if string(got) != "p:" {
				t.Fatalf("%q refused but dst changed to %q", raw, got)
			}
			return
		}
		if string(got) != "p:"+want {
			t.Fatalf("%q: %q, encoding/json %q", raw, got[2:], want)
		}
	})
}
