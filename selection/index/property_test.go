package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// refRank is the reference model of one worker rank and tier, after Dynamo's
// indexer harness (harness/reference.rs), written over content paths: the rank
// holds a set of blocks; a block is reachable while its chain from the root was
// stored through reachable parents and never cut.
type refRank struct {
	held      map[string]uint64 // content path → engine hash
	reachable map[string]bool
}

func newRefRank() *refRank { return &refRank{held: map[string]uint64{}, reachable: map[string]bool{}} }

func pathKey(p []uint64) string { return fmt.Sprint(p) }

func (r *refRank) prune() {
	// Keep a reachable path only while every prefix is reachable.
	for k := range r.reachable {
		p := parsePath(k)
		for i := 1; i < len(p); i++ {
			if !r.reachable[pathKey(p[:i])] {
				delete(r.reachable, k)
				break
			}
		}
	}
}

func parsePath(k string) []uint64 {
	var out []uint64
	for _, f := range strings.Fields(strings.Trim(k, "[]")) {
		var v uint64
		fmt.Sscan(f, &v)
		out = append(out, v)
	}
	return out
}

// prefix returns the held and reachable prefix lengths of q.
func (r *refRank) prefix(q []uint64) (held, reach int) {
	for held < len(q) && r.held[pathKey(q[:held+1])] != 0 {
		held++
	}
	for reach < len(q) && r.reachable[pathKey(q[:reach+1])] {
		reach++
	}
	return held, reach
}

// engineHash mimics an engine: a per-rank, per-tier hash of the content path.
func engineHash(wk WorkerKey, tier Tier, path []uint64) uint64 {
	h := xxh3.HashString(fmt.Sprint(wk, tier, path))
	if h == 0 {
		h = 1
	}
	return h
}

type refModel struct {
	ranks map[WorkerKey]*[numTiers]*refRank
}

func (m *refModel) rank(wk WorkerKey, t Tier) *refRank {
	r, ok := m.ranks[wk]
	if !ok {
		r = &[numTiers]*refRank{}
		m.ranks[wk] = r
	}
	if r[t] == nil {
		r[t] = newRefRank()
	}
	return r[t]
}

func (m *refModel) pathOf(wk WorkerKey, ext uint64) ([]uint64, bool) {
	for _, rr := range m.ranks[wk] {
		if rr == nil {
			continue
		}
		for k, e := range rr.held {
			if e == ext {
				return parsePath(k), true
			}
		}
	}
	return nil, false
}

// TestPropertyRandomEventsAgreeWithReference applies random store / remove /
// clear / remove-worker sequences and checks every lookup against the reference:
// a rank's device score lies between its reachable and held prefix (equal when no
// hole exists), the dump replays to the same scores, and removing everything
// leaves no node, set or slot behind.
func TestPropertyRandomEventsAgreeWithReference(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runProperty(t, seed, false) })
	}
}

// TestPropertyTieredLeafEviction restricts removals to leaves, as engines evict,
// so no holes arise; then every tier run must equal the reference exactly.
func TestPropertyTieredLeafEviction(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runProperty(t, 1000+seed, true) })
	}
}

func runProperty(t *testing.T, seed uint64, tiered bool) {
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	tr := NewTree()
	m := &refModel{ranks: map[WorkerKey]*[numTiers]*refRank{}}
	workers := []WorkerKey{{1, 0}, {1, 1}, {2, 0}, {3, 0}}
	tiers := []Tier{TierDevice}
	if tiered {
		tiers = []Tier{TierDevice, TierHostPinned, TierDisk, TierExternal}
	}
	var queries [][]uint64
	for step := 0; step < 400; step++ {
		wk := workers[rng.IntN(len(workers))]
		tier := tiers[rng.IntN(len(tiers))]
		rr := m.rank(wk, tier)
		switch op := rng.IntN(20); {
		case op < 11: // store
			var parent []uint64
			var parentExt uint64
			hasParent := rng.IntN(3) > 0
			if hasParent {
				p, ext, ok := pickHeld(rng, m, wk, tiered)
				if rng.IntN(12) == 0 || !ok {
					p, ext = []uint64{9, 9}, 12345 // a parent nobody holds
				}
				parent, parentExt = p, ext
			}
			n := 1 + rng.IntN(4)
			path := slices.Clone(parent)
			ev := &Event{Worker: wk, Tier: tier, Kind: EventStored, Parent: parentExt, HasParent: hasParent}
			var paths [][]uint64
			for range n {
				path = append(path, uint64(1+rng.IntN(3)))
				ev.Blocks = append(ev.Blocks, Block{Ext: engineHash(wk, tier, path), Local: path[len(path)-1]})
				paths = append(paths, slices.Clone(path))
			}
			_, parentHeld := m.pathOf(wk, parentExt)
			err := tr.Apply(ev)
			if hasParent && !parentHeld {
				if !errors.Is(err, ErrParentNotFound) {
					t.Fatalf("step %d: store under unheld parent: err = %v", step, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: store: %v", step, err)
			}
			reach := !hasParent || m.rank(wk, tier).reachable[pathKey(parent)]
			if tiered {
				reach = true // leaf-only eviction: no holes
			}
			for _, p := range paths {
				rr.held[pathKey(p)] = engineHash(wk, tier, p)
				if reach {
					rr.reachable[pathKey(p)] = true
				}
			}
			queries = append(queries, path)
		case op < 17: // remove
			var hashes []uint64
			var keys []string
			for k, e := range rr.held {
				if tiered && hasHeldChild(rr, k) {
					continue
				}
				hashes, keys = append(hashes, e), append(keys, k)
				if len(hashes) == 3 || rng.IntN(2) == 0 {
					break
				}
			}
			bogus := rng.IntN(8) == 0
			if bogus {
				hashes = append(hashes, 777)
			}
			err := tr.Apply(&Event{Worker: wk, Tier: tier, Kind: EventRemoved, Hashes: hashes})
			if bogus != errors.Is(err, ErrBlockNotFound) {
				t.Fatalf("step %d: remove: err = %v, bogus %v", step, err, bogus)
			}
			for _, k := range keys {
				delete(rr.held, k)
				delete(rr.reachable, k)
			}
			rr.prune()
		case op < 19:
			if err := tr.Apply(&Event{Worker: wk, Tier: tier, Kind: EventCleared}); err != nil {
				t.Fatal(err)
			}
			m.ranks[wk][tier] = newRefRank()
		default:
			tr.RemoveWorker(wk.WorkerID)
			for k := range m.ranks {
				if k.WorkerID == wk.WorkerID {
					delete(m.ranks, k)
				}
			}
		}
		queries = append(queries, []uint64{1, 1, 1, 1, 1}, []uint64{2, 3, 1, 2}, []uint64{3, 2, 1})
		if len(queries) > 40 {
			queries = queries[len(queries)-40:]
		}
		check(t, step, tr, m, queries, tiered)
		if step%50 == 49 {
			re := NewTree()
			for _, ev := range tr.appendSnapshot(nil) {
				e, err := ev.ToEvent()
				if err == nil {
					err = re.Apply(&e)
				}
				if err != nil {
					t.Fatalf("step %d: replaying the snapshot: %v", step, err)
				}
			}
			for _, q := range queries {
				a, b := tr.Match(q, false, nil), re.Match(q, false, nil)
				if !sameOverlaps(a, b) {
					t.Fatalf("step %d: query %v: replayed snapshot scores %v, original %v", step, q, b, a)
				}
			}
		}
	}
	for _, wk := range workers {
		tr.RemoveWorker(wk.WorkerID)
	}
	if s := tr.Stats(); s != (Stats{}) || int(tr.used)-1 != len(tr.freeIDs) || len(tr.children) != 0 {
		t.Fatalf("after removing every worker: %+v, %d nodes, %d free, %d children", s, int(tr.used)-1, len(tr.freeIDs), len(tr.children))
	}
}

func hasHeldChild(rr *refRank, k string) bool {
	prefix := strings.TrimSuffix(k, "]") + " "
	for other := range rr.held {
		if strings.HasPrefix(other, prefix) {
			return true
		}
	}
	return false
}

func pickHeld(rng *rand.Rand, m *refModel, wk WorkerKey, anyTier bool) ([]uint64, uint64, bool) {
	r := m.ranks[wk]
	if r == nil {
		return nil, 0, false
	}
	for _, tier := range rng.Perm(int(numTiers)) {
		if r[tier] == nil || (!anyTier && tier != int(TierDevice)) {
			continue
		}
		for k, e := range r[tier].held {
			return parsePath(k), e, true
		}
	}
	return nil, 0, false
}

func sameOverlaps(a, b []Overlap) bool {
	// Tree sizes may differ: a snapshot leaves out blocks no lookup can reach.
	key := func(o Overlap) string { return fmt.Sprint(o) }
	as, bs := make([]string, len(a)), make([]string, len(b))
	for i := range a {
		as[i] = key(a[i])
	}
	for i := range b {
		bs[i] = key(b[i])
	}
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(as, bs)
}

func check(t *testing.T, step int, tr *Tree, m *refModel, queries [][]uint64, tiered bool) {
	t.Helper()
	entries := 0
	for _, r := range m.ranks {
		for _, rr := range r {
			if rr != nil {
				entries += len(rr.held)
			}
		}
	}
	if got := tr.Stats().Entries; got != entries {
		t.Fatalf("step %d: %d entries, reference holds %d", step, got, entries)
	}
	for _, q := range queries {
		got := map[WorkerKey]Overlap{}
		for _, o := range tr.Match(q, false, nil) {
			if _, dup := got[o.Worker]; dup {
				t.Fatalf("step %d: worker %v reported twice", step, o.Worker)
			}
			got[o.Worker] = o
		}
		for wk, r := range m.ranks {
			o := got[wk]
			if !tiered {
				held, reach := r[TierDevice].prefix(q)
				if int(o.Device) < reach || int(o.Device) > held {
					t.Fatalf("step %d: query %v worker %v: device %d outside [reachable %d, held %d]", step, q, wk, o.Device, reach, held)
				}
				continue
			}
			want := tierRuns(r, q)
			if [4]uint32{o.Device, o.Host, o.Disk, o.External} != want {
				t.Fatalf("step %d: query %v worker %v: runs %v, want %v", step, q, wk, [4]uint32{o.Device, o.Host, o.Disk, o.External}, want)
			}
		}
		for wk, o := range got {
			if o.Total() == 0 {
				t.Fatalf("step %d: worker %v reported with no overlap", step, wk)
			}
			if _, ok := m.ranks[wk]; !ok {
				t.Fatalf("step %d: unknown worker %v reported", step, wk)
			}
		}
	}
}

// tierRuns is the continuation walk over the reference's held sets.
func tierRuns(r *[numTiers]*refRank, q []uint64) [4]uint32 {
	var runs [4]uint32
	pos := 0
	for tier := range numTiers {
		for pos < len(q) && r[tier] != nil && r[tier].held[pathKey(q[:pos+1])] != 0 {
			runs[tier]++
			pos++
		}
	}
	return runs
}
