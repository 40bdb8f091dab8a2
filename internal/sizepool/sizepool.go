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
// Each class keeps the last few buffers put back (keepPerClass) in slots of
// its own, which survive garbage collections: long prompts that come seconds
// apart, with collections in between, still find them. The slots are
// emptied once the pool has gone unused for a while (HoldFor), so a pool
// never holds memory for traffic that stopped. Further buffers of a class
// wait in a sync.Pool, which the collector empties after two collections
// without use. New buffers are rounded up to an eighth of their class, so
// that the next request of nearly the same size (a body a few bytes longer)
// fits the buffer the last one gave back.
package sizepool

import (
	"math/bits"
	"sync"
	"time"
)

// classes covers buffers of up to 2^maxClass elements; larger ones are
// neither kept nor looked for.
const maxClass = 40

// HoldFor is how long a pool keeps its last buffers of each class without
// being used.
const HoldFor = 30 * time.Second

// keepPerClass is how many buffers of a class are kept through collections:
// as many long prompts as are commonly in flight at once.
const keepPerClass = 4

// Pool keeps []T buffers of at least a threshold's elements (New); the zero
// value keeps buffers of every size.
type Pool[T any] struct {
	min int

	mu      sync.Mutex
	last    [maxClass + 1][keepPerClass][]T // the last buffers put back in each class
	idle    *time.Timer                     // empties last once the pool goes unused
	holdFor time.Duration                   // HoldFor; tests shorten it
	classes [maxClass + 1]sync.Pool         // class k: 2^k <= cap < 2^(k+1)
}

// New returns a pool for buffers of at least minLen elements; smaller ones
// are cheap to allocate and are left to the allocator.
func New[T any](minLen int) *Pool[T] { return &Pool[T]{min: max(minLen, 1)} }

// Get returns a buffer of length 0 and capacity at least n: a kept one when
// one fits, else a new one of capacity n rounded up to an eighth of its
// class.
func (p *Pool[T]) Get(n int) []T {
	if n < max(p.min, 1) {
		return make([]T, 0, n)
	}
	k := class(n)
	// The class of n first: its buffers are the closest fit, though some
	// are smaller than n. A too-small last buffer stays; a too-small one
	// from the sync.Pool is dropped, not put back: it would be met again
	// by the next request of this size.
	for _, c := range [2]int{k, k + 1} {
		if c > maxClass {
			break
		}
		if b := p.takeLast(c, n); b != nil {
			return b
		}
		if b, ok := p.classes[c].Get().(*[]T); ok && cap(*b) >= n {
			return (*b)[:0]
		}
	}
	return make([]T, 0, roundUp(n))
}

// roundUp is n rounded up to an eighth of its class.
func roundUp(n int) int {
	step := max(1<<class(n)/8, 1)
	return (n + step - 1) / step * step
}

// takeLast takes one of class c's kept buffers that holds at least n.
func (p *Pool[T]) takeLast(c, n int) []T {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.touch()
	for i, b := range p.last[c] {
		if cap(b) >= n {
			p.last[c][i] = nil
			return b[:0]
		}
	}
	return nil
}

// Put keeps b for a later Get. The caller must not use b afterwards.
func (p *Pool[T]) Put(b []T) {
	c := cap(b)
	if c < max(p.min, 1) {
		return
	}
	k := class(c)
	if k > maxClass {
		return
	}
	b = b[:0]
	p.mu.Lock()
	p.touch()
	for i := range p.last[k] {
		if p.last[k][i] == nil {
			p.last[k][i] = b
			p.mu.Unlock()
			return
		}
	}
	p.mu.Unlock()
	p.classes[k].Put(&b)
}

// touch restarts the idle timer, under mu.
func (p *Pool[T]) touch() {
	if p.idle != nil {
		p.idle.Reset(p.hold())
		return
	}
	p.idle = time.AfterFunc(p.hold(), p.dropLast)
}

func (p *Pool[T]) hold() time.Duration {
	if p.holdFor > 0 {
		return p.holdFor
	}
	return HoldFor
}

// dropLast empties the classes' kept buffers: the pool went unused for
// HoldFor.
func (p *Pool[T]) dropLast() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.last[:])
}

// class is floor(log2(n)) for n >= 1.
func class(n int) int { return bits.Len(uint(n)) - 1 }
