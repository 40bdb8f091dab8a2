package loads

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// model is a deliberately naive restatement of the accounting: it keeps each
// booking's prompt as a list of hashes and recomputes every number from
// scratch, identifying a prompt block by its whole prefix (the path).
type model struct {
	expiry   time.Duration
	ranks    map[index.WorkerKey]bool
	bookings map[string]*mbooking
	// frac holds the decay weight of a prompt block (rank, path) while some
	// booking holds it.
	frac map[index.WorkerKey]map[string]float64
}

type mbooking struct {
	w         index.WorkerKey
	hashes    []uint64
	prefill   int
	prefilled bool
	admitted  time.Time
	outputs   []float64
}

func refPathKey(h []uint64) string { return fmt.Sprint(h) }

func (m *model) holders(w index.WorkerKey, prefix []uint64) int {
	n := 0
	for _, b := range m.bookings {
		if b.w == w && len(b.hashes) >= len(prefix) && slices.Equal(b.hashes[:len(prefix)], prefix) {
			n++
		}
	}
	return n
}

func (m *model) add(now time.Time, id string, w index.WorkerKey, hashes []uint64, prefill int) error {
	if !m.ranks[w] {
		return ErrWorkerNotFound
	}
	if _, ok := m.bookings[id]; ok {
		return ErrDuplicateRequest
	}
	m.bookings[id] = &mbooking{w: w, hashes: slices.Clone(hashes), prefill: prefill, admitted: now}
	return nil
}

func (m *model) free(id string) error {
	b, ok := m.bookings[id]
	if !ok {
		return ErrRequestNotFound
	}
	delete(m.bookings, id)
	for d := 1; d <= len(b.hashes); d++ {
		if m.holders(b.w, b.hashes[:d]) == 0 {
			delete(m.frac[b.w], refPathKey(b.hashes[:d]))
		}
	}
	return nil
}

func (m *model) output(id string, f *float64) error {
	if f != nil && !(*f >= 0 && *f <= 1) {
		return ErrDecayFraction
	}
	b, ok := m.bookings[id]
	if !ok {
		return ErrRequestNotFound
	}
	b.outputs = append(b.outputs, 1)
	if f == nil {
		return nil
	}
	for i := range b.outputs {
		b.outputs[i] = *f
	}
	if m.frac[b.w] == nil {
		m.frac[b.w] = map[string]float64{}
	}
	for d := len(b.hashes); d > 0 && m.holders(b.w, b.hashes[:d]) == 1; d-- {
		m.frac[b.w][refPathKey(b.hashes[:d])] = *f
	}
	return nil
}

func (m *model) load(w index.WorkerKey) WorkerLoad {
	l := WorkerLoad{Worker: w}
	paths := map[string]bool{}
	weight := 0.0
	for _, b := range m.bookings {
		if b.w != w {
			continue
		}
		l.ActiveRequests++
		l.ActivePrefillTokens += b.prefill
		if !b.prefilled {
			l.PrefillingRequests++
		}
		for d := 1; d <= len(b.hashes); d++ {
			paths[refPathKey(b.hashes[:d])] = true
		}
		for _, o := range b.outputs {
			weight += o
		}
	}
	for p := range paths {
		if f, ok := m.frac[w][p]; ok {
			weight += f
		} else {
			weight++
		}
	}
	l.ActiveDecodeBlocks = int(math.Round(weight))
	return l
}

func (m *model) additional(w index.WorkerKey, q []uint64) int {
	d := 0
	for d < len(q) && m.holders(w, q[:d+1]) > 0 {
		d++
	}
	return len(q) - d
}

func (m *model) sortedRanks() []index.WorkerKey {
	var ws []index.WorkerKey
	for w := range m.ranks {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, compareKeys)
	return ws
}

// TestTrackerMatchesReferenceModel drives random lifecycles (with colliding,
// chain-breaking hashes, decays, expiry and rank churn) through the tracker
// and the model and compares every load and projection after every step.
func TestTrackerMatchesReferenceModel(t *testing.T) {
	allRanks := []index.WorkerKey{w1, w2, w3, {WorkerID: 7}}
	decays := []*float64{nil, nil, frac(0), frac(0.25), frac(0.5), frac(0.75), frac(1), frac(1.5)}
	for seed := range uint64(40) {
		rnd := rand.New(rand.NewPCG(seed, 0x10ad5))
		tr := newTracker(t, DefaultConfig(4), allRanks[:3]...)
		m := &model{expiry: DefaultExpiry, ranks: map[index.WorkerKey]bool{}, bookings: map[string]*mbooking{}, frac: map[index.WorkerKey]map[string]float64{}}
		for _, w := range allRanks[:3] {
			m.ranks[w] = true
		}
		randHashes := func() []uint64 {
			h := make([]uint64, rnd.IntN(6))
			for i := range h {
				h[i] = uint64(rnd.IntN(3) + 1)
			}
			return h
		}
		randID := func() string { return fmt.Sprintf("r%d", rnd.IntN(12)) }
		now := t0
		var trace []string
		for step := range 400 {
			now = now.Add(time.Duration(rnd.IntN(40)) * time.Second)
			var op string
			var errT, errM error
			switch k := rnd.IntN(100); {
			case k < 35:
				id, w, h := randID(), allRanks[rnd.IntN(len(allRanks))], randHashes()
				prefill, track := rnd.IntN(20), rnd.IntN(2) == 0
				op = fmt.Sprintf("add %s %v %v prefill=%d/%v", id, w, h, prefill, track)
				errT = tr.Add(now, Booking{RequestID: id, Worker: w, TrackingHashes: h, PrefillTokens: prefill, TrackPrefill: track})
				if !track {
					prefill = 0
				}
				errM = m.add(now, id, w, h, prefill)
			case k < 55:
				id := randID()
				op = "free " + id
				errT, errM = tr.Free(id), m.free(id)
			case k < 65:
				id := randID()
				op = "prefill_complete " + id
				errT = tr.PrefillComplete(id)
				if b, ok := m.bookings[id]; ok {
					b.prefill, b.prefilled = 0, true
				} else {
					errM = ErrRequestNotFound
				}
			case k < 85:
				id, d := randID(), decays[rnd.IntN(len(decays))]
				op = fmt.Sprintf("output %s %v", id, fmtDecay(d))
				errT, errM = tr.AddOutputBlock(id, d), m.output(id, d)
			case k < 93:
				op = "expire"
				got := tr.Expire(now)
				var want []string
				for id, b := range m.bookings {
					if now.Sub(b.admitted) > m.expiry {
						want = append(want, id)
					}
				}
				slices.Sort(want)
				for _, id := range want {
					_ = m.free(id)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: Expire = %v, want %v\n%s", seed, step, got, want, strings.Join(trace, "\n"))
				}
			default:
				var ws []index.WorkerKey
				for _, w := range allRanks {
					if rnd.IntN(4) > 0 {
						ws = append(ws, w)
					}
				}
				op = fmt.Sprintf("set_workers %v", ws)
				got := tr.SetWorkers(ws)
				keep := map[index.WorkerKey]bool{}
				for _, w := range ws {
					keep[w] = true
				}
				var want []string
				for id, b := range m.bookings {
					if !keep[b.w] {
						want = append(want, id)
					}
				}
				slices.Sort(want)
				for _, id := range want {
					_ = m.free(id)
				}
				for w := range m.ranks {
					if !keep[w] {
						delete(m.frac, w)
					}
				}
				m.ranks = keep
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: SetWorkers dropped %v, want %v", seed, step, got, want)
				}
			}
			trace = append(trace, op)
			if !errors.Is(errT, errM) || (errT == nil) != (errM == nil) {
				t.Fatalf("seed %d step %d %s: tracker error %v, model error %v\n%s", seed, step, op, errT, errM, strings.Join(trace, "\n"))
			}
			q := randHashes()
			proj := tr.Project(q, nil)
			ranks := m.sortedRanks()
			if len(proj) != len(ranks) {
				t.Fatalf("seed %d step %d: %d projection rows for %d ranks", seed, step, len(proj), len(ranks))
			}
			for i, w := range ranks {
				want := Projection{WorkerLoad: m.load(w), AdditionalBlocks: m.additional(w, q), TrackedBlocks: len(q)}
				if proj[i] != want {
					t.Fatalf("seed %d step %d after %s: query %v on %v: got %+v, want %+v\n%s", seed, step, op, q, w, proj[i], want, strings.Join(trace, "\n"))
				}
				if l := proj[i].WorkerLoad; l.ActiveDecodeBlocks < 0 || l.ActivePrefillTokens < 0 || l.ActiveRequests < 0 {
					t.Fatalf("seed %d step %d: negative load %+v", seed, step, l)
				}
			}
		}
		for id := range m.bookings {
			if err := tr.Free(id); err != nil {
				t.Fatalf("seed %d: final free %s: %v", seed, id, err)
			}
		}
		for _, l := range tr.Loads() {
			if l != (WorkerLoad{Worker: l.Worker}) {
				t.Fatalf("seed %d: load after freeing everything: %+v", seed, l)
			}
		}
		if len(tr.reqs) != 0 {
			t.Fatalf("seed %d: state left after draining: %d requests", seed, len(tr.reqs))
		}
		for _, r := range tr.sorted {
			if len(r.held) != 0 || r.unit != 0 || r.fracN != 0 || r.fracSum != 0 || r.prefill != 0 || r.prefilling != 0 || r.requests != 0 {
				t.Fatalf("seed %d: rank %v not drained: %+v", seed, r.key, r)
			}
		}
	}
}

func fmtDecay(d *float64) string {
	if d == nil {
		return "nil"
	}
	return fmt.Sprint(*d)
}
