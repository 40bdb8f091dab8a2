package index

// warm reads, ahead of applying a batch, the engine-hash table slots its
// events will probe, then the nodes those slots name, then their parents. A
// batch comes from one engine, whose table and nodes a thousand other
// engines' batches have evicted from the CPU caches since its last one;
// applied event by event, each probe's miss, and then its node's, waits for
// the one before. Read here without depending on one another, the misses
// overlap. It changes nothing: a slot read for an event that an earlier event
// of the batch moves is only a wasted read. At most warmMax hashes are read,
// so that a long prefill does not evict what the rest of the batch needs.
func (t *Tree) warm(evs []Event) uint32 {
	var (
		sink   uint32
		tables [warmMax]*handleMap
		keys   [warmMax]uint64
		named  [warmMax]bool // a removal's or a parent's: names a node
		n      int
	)
	add := func(m *handleMap, h uint64, names bool) bool {
		i := m.slot(h)
		sink += m.vals[i] + uint32(m.keys[i])
		tables[n], keys[n], named[n] = m, h, names
		n++
		return n < warmMax
	}
	// A batch's events are one rank's: its table is found once.
	var m *handleMap
	var mw WorkerKey
	var mt Tier
scan:
	for i := range evs {
		ev := &evs[i]
		if m == nil || ev.Worker != mw || ev.Tier != mt {
			m, mw, mt = t.warmTable(ev), ev.Worker, ev.Tier
		}
		if m == nil {
			continue
		}
		switch ev.Kind {
		case EventRemoved:
			for _, h := range ev.Hashes {
				if !add(m, h, true) {
					break scan
				}
			}
		case EventStored:
			if ev.HasParent && !add(m, ev.Parent, true) {
				break scan
			}
			for _, b := range ev.Blocks {
				if !add(m, b.Ext, false) {
					break scan
				}
			}
		}
	}
	// The slots are in the caches now: find the nodes the removals and the
	// parents name and read those, and then their parents, which a removal
	// may reclaim or a store descend from, and their owner sets, which
	// change.
	var ids [warmMax]uint32
	for i := range n {
		if named[i] {
			if id, ok := tables[i].get(keys[i]); ok {
				ids[i] = id
				sink += t.node(id).set + t.meta(id).kids
			}
		}
	}
	for i := range n {
		if id := ids[i]; id != 0 {
			p := t.meta(id).parent
			s := &t.sets.sets[t.node(id).set]
			sink += t.node(p).child + t.meta(p).kids + s.gen + uint32(len(s.elems))
		}
	}
	return sink
}

// warmMax bounds the hashes warm reads per batch: about what the caches
// hold comfortably beside the rest of the batch's work.
const warmMax = 64

// warmTable is the table of an event's rank and tier, or nil when it has
// none.
func (t *Tree) warmTable(ev *Event) *handleMap {
	if ev.Tier >= numTiers {
		return nil
	}
	slot, ok := t.slotOf(ev.Worker)
	if !ok {
		return nil
	}
	m := &t.workers[slot].lookup[ev.Tier]
	if m.count == 0 {
		return nil
	}
	return m
}
