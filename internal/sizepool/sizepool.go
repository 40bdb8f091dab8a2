// Package sizepool keeps large buffers for reuse between requests, sorted by
// size class.
//
// A buffer of megabytes (a 1M-token request body is ~6 MB as token ids) that
// is allocated per request and then dropped goes back to the Go heap, whose
// scavenger soon returns its pages to the system; the next request's buffer
// is then new memory, and writing it takes a page fault every 4 KiB. On a
// virtual machine a fault can cost 10–20 µs: tens of milliseconds for one
// body, more than parsing it. A Pool hands the last request's buffer to the
// next one instead, its pages still mapped.
//
// Buffers live in sync.Pools, one per power-of-two class, so what a burst
// leaves behind is dropped by the garbage collector after two collections
// without use, as sync.Pool does: the pool never holds memory for traffic
// that stopped.
package sizepool

import (
	"math/bits"
	"sync"
)

// classes covers buffers of up to 2^maxClass elements; larger ones are
// neither kept nor looked for.
const maxClass = 40

// Pool keeps []T buffers of at least Min elements. The zero value is not
// usable: New sets the threshold.
type Pool[T any] struct {
	min     int
	classes [maxClass + 1]sync.Pool // class k: 2^k <= cap < 2^(k+1)
}

// New returns a pool for buffers of at least minLen elements; smaller ones
// are cheap to allocate and are left to the allocator.
func New[T any](minLen int) *Pool[T] { return &Pool[T]{min: max(minLen, 1)} }

// Get returns a buffer of length 0 and capacity at least n: a kept one when
// one fits, else a new one of capacity n.
func (p *Pool[T]) Get(n int) []T {
	if n < p.min {
		return make([]T, 0, n)
	}
	k := class(n)
	// The class of n first: its buffers are the closest fit, though some
	// are smaller than n. A too-small one is dropped, not put back: it
	// would be met again by the next request of this size.
	for _, c := range [2]int{k, k + 1} {
		if c > maxClass {
			break
		}
		if b, ok := p.classes[c].Get().(*[]T); ok && cap(*b) >= n {
			return (*b)[:0]
		}
	}
	return make([]T, 0, n)
}

// Put keeps b for a later Get. The caller must not use b afterwards.
func (p *Pool[T]) Put(b []T) {
	c := cap(b)
	if c < p.min {
		return
	}
	k := class(c)
	if k > maxClass {
		return
	}
	b = b[:0]
	p.classes[k].Put(&b)
}

// class is floor(log2(n)) for n >= 1.
func class(n int) int { return bits.Len(uint(n)) - 1 }
