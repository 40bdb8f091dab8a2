package index

// handleMap maps a worker's engine block hashes to node ids: an open-addressing
// table with linear probing and backward-shift deletion, specialised for the
// index's hottest write path. Compared with a Go map it answers "insert, and tell
// me what was there" in one probe, and it stores 12 bytes per slot with no
// per-group metadata.
//
// Node id 0 (the root) is never a value, so a zero value marks an empty slot and
// any uint64 (zero included) can be a key. The zero handleMap is empty and ready.
// Growth doubles the table and rehashes it, like Rust's hashbrown behind Dynamo's
// maps; a worker's table is bounded by its engine's cache capacity.
type handleMap struct {
	keys  []uint64
	vals  []uint32
	count int
	shift uint8 // 64 - log2(len(keys))
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
	mask := len(m.keys) - 1
	for i := m.slot(k); ; i = (i + 1) & mask {
		v := m.vals[i]
		if v == 0 {
			return 0, false
		}
		if m.keys[i] == k {
			return v, true
		}
	}
}

// put sets k to v (v != 0) and returns the previous value, if any.
func (m *handleMap) put(k uint64, v uint32) (old uint32, existed bool) {
	if (m.count+1)*4 > len(m.keys)*3 {
		m.grow()
	}
	mask := len(m.keys) - 1
	for i := m.slot(k); ; i = (i + 1) & mask {
		cur := m.vals[i]
		if cur == 0 {
			m.keys[i], m.vals[i] = k, v
			m.count++
			return 0, false
		}
		if m.keys[i] == k {
			m.vals[i] = v
			return cur, true
		}
	}
}

// del removes k and returns its value, if it was present.
func (m *handleMap) del(k uint64) (uint32, bool) {
	if m.count == 0 {
		return 0, false
	}
	mask := len(m.keys) - 1
	i := m.slot(k)
	for {
		v := m.vals[i]
		if v == 0 {
			return 0, false
		}
		if m.keys[i] == k {
			break
		}
		i = (i + 1) & mask
	}
	old := m.vals[i]
	// Backward-shift: pull later entries of the probe run into the hole so
	// lookups never need tombstones. The entry at j moves into the hole at i
	// unless its home lies cyclically in (i, j], that is unless it is
	// nearer to its home than the hole is; one comparison of distances,
	// where comparing positions took four hard-to-predict branches.
	for j := (i + 1) & mask; m.vals[j] != 0; j = (j + 1) & mask {
		if (j-m.slot(m.keys[j]))&mask >= (j-i)&mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.keys[i], m.vals[i] = 0, 0
	m.count--
	if m.count == 0 {
		*m = handleMap{} // give the memory back when a worker is cleared
	}
	return old, true
}

func (m *handleMap) grow() { m.resize(max(len(m.keys)*2, minHandleSlots)) }

// reserve sizes the table for n entries without further growth.
func (m *handleMap) reserve(n int) {
	slots := minHandleSlots
	for slots*3 < n*4 {
		slots *= 2
	}
	if slots > len(m.keys) {
		m.resize(slots)
	}
}

func (m *handleMap) resize(n int) {
	old := *m
	bits := uint8(0)
	for 1<<bits < n {
		bits++
	}
	*m = handleMap{keys: make([]uint64, n), vals: make([]uint32, n), shift: 64 - bits}
	mask := n - 1
	for i, v := range old.vals {
		if v == 0 {
			continue
		}
		k := old.keys[i]
		j := m.slot(k)
		for m.vals[j] != 0 {
			j = (j + 1) & mask
		}
		m.keys[j], m.vals[j] = k, v
	}
	m.count = old.count
}

// all calls fn for every entry. fn must not modify the map.
func (m *handleMap) all(fn func(k uint64, v uint32)) {
	for i, v := range m.vals {
		if v != 0 {
			fn(m.keys[i], v)
		}
	}
}
