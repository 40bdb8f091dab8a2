package index

// handleMap maps a worker's engine block hashes to node ids: an open-addressing
// table with linear probing and backward-shift deletion, specialised for the
// index's hottest write path. Compared with a Go map it answers "insert, and tell
// me what was there" in one probe, and it stores 12 bytes per slot with no
// per-group metadata. A slot holds its key and value side by side, so that a
// probe of a table far larger than the caches (a thousand workers' tables are
// tens of MB) misses once, not once for the key and once for the value.
//
// Node id 0 (the root) is never a value, so a zero value marks an empty slot and
// any uint64 (zero included) can be a key. The zero handleMap is empty and ready.
// Growth doubles the table and rehashes it, like Rust's hashbrown behind Dynamo's
// maps; a worker's table is bounded by its engine's cache capacity.
type handleMap struct {
	slots []handleSlot
	count int
	shift uint8 // 64 - log2(len(slots))
}

// handleSlot is one entry: the key as two halves, so that a slot takes 12
// bytes, not the 16 a uint64 field's alignment would round it to.
type handleSlot struct {
	lo, hi uint32
	val    uint32 // 0 = empty
}

func (s *handleSlot) key() uint64 { return uint64(s.hi)<<32 | uint64(s.lo) }

func (s *handleSlot) set(k uint64, v uint32) {
	s.lo, s.hi, s.val = uint32(k), uint32(k>>32), v
}

const minHandleSlots = 16

func (m *handleMap) slot(k uint64) int {
	// Fibonacci hashing spreads sequential or clustered engine hashes.
	return int((k * 0x9e3779b97f4a7c15) >> m.shift)
}

func (m *handleMap) len() int { return m.count }

func (m *handleMap) get(k uint64) (uint32, bool) {
	if m.count == 0 {
		return 0, false
	}
	mask := len(m.slots) - 1
	for i := m.slot(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.val == 0 {
			return 0, false
		}
		if s.key() == k {
			return s.val, true
		}
	}
}

// put sets k to v (v != 0) and returns the previous value, if any.
func (m *handleMap) put(k uint64, v uint32) (old uint32, existed bool) {
	if (m.count+1)*4 > len(m.slots)*3 {
		m.grow()
	}
	mask := len(m.slots) - 1
	for i := m.slot(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		cur := s.val
		if cur == 0 {
			s.set(k, v)
			m.count++
			return 0, false
		}
		if s.key() == k {
			s.val = v
			return cur, true
		}
	}
}

// del removes k and returns its value, if it was present.
func (m *handleMap) del(k uint64) (uint32, bool) {
	if m.count == 0 {
		return 0, false
	}
	mask := len(m.slots) - 1
	i := m.slot(k)
	for {
		s := &m.slots[i]
		if s.val == 0 {
			return 0, false
		}
		if s.key() == k {
			break
		}
		i = (i + 1) & mask
	}
	old := m.slots[i].val
	// Backward-shift: pull later entries of the probe run into the hole so
	// lookups never need tombstones.
	for j := (i + 1) & mask; m.slots[j].val != 0; j = (j + 1) & mask {
		home := m.slot(m.slots[j].key())
		// Move j into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = handleSlot{}
	m.count--
	if m.count == 0 {
		*m = handleMap{} // give the memory back when a worker is cleared
	}
	return old, true
}

func (m *handleMap) grow() { m.resize(max(len(m.slots)*2, minHandleSlots)) }

// reserve sizes the table for n entries without further growth.
func (m *handleMap) reserve(n int) {
	slots := minHandleSlots
	for slots*3 < n*4 {
		slots *= 2
	}
	if slots > len(m.slots) {
		m.resize(slots)
	}
}

func (m *handleMap) resize(n int) {
	old := *m
	bits := uint8(0)
	for 1<<bits < n {
		bits++
	}
	*m = handleMap{slots: make([]handleSlot, n), shift: 64 - bits}
	mask := n - 1
	for _, s := range old.slots {
		if s.val == 0 {
			continue
		}
		j := m.slot(s.key())
		for m.slots[j].val != 0 {
			j = (j + 1) & mask
		}
		m.slots[j] = s
	}
	m.count = old.count
}

// all calls fn for every entry. fn must not modify the map.
func (m *handleMap) all(fn func(k uint64, v uint32)) {
	for i := range m.slots {
		if s := &m.slots[i]; s.val != 0 {
			fn(s.key(), s.val)
		}
	}
}
