package partition

import (
	"fmt"
	"sync"

	"github.com/kvselect/kvselect/selection/index"
)

// Builder makes the partition key, of the given block size and Eagle mode.
type Builder func(key index.Partition, blockSize uint32, eagle bool) (*Partition, error)

// Set holds a service's partitions. Partitions are made on first use and
// never removed. It is safe for concurrent use; its lock comes after the
// catalog's (it is never held with the catalog's own), and Ensure builds
// under it.
type Set struct {
	mu    sync.RWMutex
	m     map[index.Partition]*Partition
	build Builder
}

// NewSet returns an empty set whose partitions build makes.
func NewSet(build Builder) *Set {
	return &Set{m: make(map[index.Partition]*Partition), build: build}
}

// Get returns the partition key, nil if there is none.
func (s *Set) Get(key index.Partition) *Partition {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[key]
}

// All returns every partition, in no particular order.
func (s *Set) All() []*Partition {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Partition, 0, len(s.m))
	for _, p := range s.m {
		out = append(out, p)
	}
	return out
}

// Ensure returns the partition key, making it with the worker's block size
// and Eagle mode, which are frozen from then on: a worker whose differ is
// refused.
func (s *Set) Ensure(key index.Partition, blockSize uint32, eagle bool) (*Partition, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.m[key]; ok {
		if p.blockSize != blockSize {
			return nil, fmt.Errorf("block_size mismatch for %s: existing=%d requested=%d", Name(key), p.blockSize, blockSize)
		}
		if p.eagle != eagle {
			return nil, fmt.Errorf("is_eagle mismatch for %s: existing=%t requested=%t", Name(key), p.eagle, eagle)
		}
		return p, nil
	}
	p, err := s.build(key, blockSize, eagle)
	if err != nil {
		return nil, err
	}
	s.m[key] = p
	return p, nil
}

// AnySchedulable reports whether some partition has a schedulable rank.
func (s *Set) AnySchedulable() bool {
	for _, p := range s.All() {
		if len(p.Workers().Ranks) > 0 {
			return true
		}
	}
	return false
}

// WakeAll wakes every partition's waiting selections (shutdown).
func (s *Set) WakeAll() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, p := range s.m {
		p.Wake()
	}
}
