// Package randsrc is the selection service's one random source, shared under
// a lock: the streams each partition draws its tie-breaks and softmax samples
// from, the generated selection ids, and the replica id. A seeded source
// (selection.Config.Rand) makes every draw, and so every decision,
// reproducible.
package randsrc

import (
	"encoding/hex"
	"math/rand/v2"
	"sync"
)

// Source hands out draws of one *rand.Rand. It is safe for concurrent use;
// its mutex is a leaf, and the replica id's sync.Once comes before it (it
// draws the id under the once).
type Source struct {
	mu  sync.Mutex
	rnd *rand.Rand

	replicaOnce sync.Once
	replica     uint64
}

// New returns a source drawing from rnd, which it owns from then on.
func New(rnd *rand.Rand) *Source { return &Source{rnd: rnd} }

// Uint64 draws one value.
func (s *Source) Uint64() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rnd.Uint64()
}

// Child returns a stream of its own, seeded from two draws.
func (s *Source) Child() *rand.Rand {
	s.mu.Lock()
	defer s.mu.Unlock()
	return rand.New(rand.NewPCG(s.rnd.Uint64(), s.rnd.Uint64()))
}

// ReplicaID is this process's non-zero replica identity (Dynamo's router_id
// and writer_id), drawn on first use.
func (s *Source) ReplicaID() uint64 {
	s.replicaOnce.Do(func() {
		for s.replica == 0 {
			s.replica = s.Uint64()
		}
	})
	return s.replica
}

// UUID returns a random UUIDv4 string.
func (s *Source) UUID() string {
	var b [16]byte
	s.mu.Lock()
	for i := range 2 {
		v := s.rnd.Uint64()
		for j := range 8 {
			b[i*8+j] = byte(v >> (8 * j))
		}
	}
	s.mu.Unlock()
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}
