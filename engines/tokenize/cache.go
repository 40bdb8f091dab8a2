package tokenize

import (
	"container/list"
	"sync"

	"github.com/zeebo/xxh3"
)

// key names a cache entry: xxh3-128 of everything that decides the ids (the
// model, the request fields passed to the engine, the prompt or messages).
// A false hit needs a 128-bit collision.
type key = xxh3.Uint128

// cache is an LRU of token lists bounded by their total length. Entries are
// shared with callers, who must not modify them.
type cache struct {
	mu     sync.Mutex
	max    int // total tokens
	tokens int
	lru    *list.List // of *cacheEntry, most recent first
	byKey  map[key]*list.Element
}

type cacheEntry struct {
	k   key
	ids []uint32
}

func newCache(maxTokens int) *cache {
	return &cache{max: maxTokens, lru: list.New(), byKey: map[key]*list.Element{}}
}

func (c *cache) get(k key) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[k]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*cacheEntry).ids, true
}

// longest returns the last i (and its ids) for which keys[i] is cached,
// trying from the end: the longest cached conversation prefix.
func (c *cache) longest(keys []key) (int, []uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(keys) - 1; i >= 0; i-- {
		if e, ok := c.byKey[keys[i]]; ok {
			c.lru.MoveToFront(e)
			return i, e.Value.(*cacheEntry).ids
		}
	}
	return -1, nil
}

func (c *cache) put(k key, ids []uint32) {
	if len(ids) > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[k]; ok {
		c.lru.MoveToFront(e)
		return
	}
	c.byKey[k] = c.lru.PushFront(&cacheEntry{k: k, ids: ids})
	c.tokens += len(ids)
	for c.tokens > c.max {
		last := c.lru.Back()
		ce := last.Value.(*cacheEntry)
		c.lru.Remove(last)
		delete(c.byKey, ce.k)
		c.tokens -= len(ce.ids)
	}
}

func (c *cache) size() (entries, tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len(), c.tokens
}
