// Package pending is the pending-selection cache behind the two-phase
// select → reservation flow (the replay form of POST /reservations): a `/select`
// carrying a selection_id stores the booking inputs it computed, and a later
// `POST /reservations` without worker_id replays them by id instead of
// re-sending the prompt.
//
// The cache is a deterministic state machine: it reads no clock (every
// operation that looks at age takes `now`), starts no goroutines and does no
// I/O. Unclaimed entries are swept and the count and byte budgets enforced
// only on Put, as Dynamo's lib/kv-router/src/services/selection/pending.rs
// (commit 647ceeb1) does; there is no background sweeper to own. The cache is
// process-local: a replay must reach the replica that served the /select.
package pending

import (
	"container/heap"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// Dynamo's defaults (pending.rs SELECTION_CACHE_*; the CLI flags
// --selection-cache-ttl-secs, --selection-cache-max-entries and
// --selection-cache-max-bytes override them).
const (
	DefaultTTL        = 120 * time.Second
	DefaultMaxEntries = 4096
	DefaultMaxBytes   = 256 << 20 // 268,435,456
)

// ErrInvalidConfig is wrapped by every error New returns.
var ErrInvalidConfig = errors.New("invalid pending-selection cache config")

// Config bounds the cache. A zero field takes its default; a negative one is
// an error (the CLI overrides --selection-cache-* are never negative in
// Dynamo either, so a negative value here is a wiring bug worth surfacing).
type Config struct {
	TTL        time.Duration
	MaxEntries int
	MaxBytes   int64
}

// Key scopes a pending selection by partition and selection id: the same id
// selected in another partition is another entry, and a replay naming the
// wrong model or routing group is a plain miss that consumes nothing (Dynamo's
// HTTP test cached_reservation_needs_matching_model).
type Key struct {
	Partition   index.Partition
	SelectionID string
}

// Entry is what a `/select` hands to the later replay. Slices are shared with
// the caller on Put and with readers on Peek; neither side may mutate them.
type Entry struct {
	Worker         index.WorkerKey
	TrackingHashes []uint64
	// BlockHashes are the public block hashes, kept only when an approximate
	// indexer will record the routing decision when the replay books; nil
	// otherwise, as pending.rs stores them.
	BlockHashes            []uint64
	ISL                    int
	EffectivePrefillTokens int
	ExpectedOutputTokens   *uint32
	TrackPrefill           bool
	LoraName               string
	// SessionID is the select's session: a query-only /select never binds
	// a session, so the replay of POST /reservations binds it instead.
	SessionID string
	// SessionFinal: the select was the session's last request, so the
	// replay's booking ends the binding when it is freed.
	SessionFinal bool
	// TextBlockHashes are the character-block hashes of a prompt the select
	// knew as text (kvselect's text index, not Dynamo's), kept so that the
	// replay's booking teaches the text index as /select_and_reserve's
	// does; nil for a prompt known only by ids or hashes.
	TextBlockHashes []uint64
}

// EntryBytes is pending.rs's resident-size estimate: eight bytes per block
// and tracking hash plus the id, scope and LoRA strings. The session id is not
// counted, matching the read versions of pending.rs (entry_bytes). Text block
// hashes, which Dynamo does not have, count like block hashes, so an entry
// without them is sized exactly as pending.rs sizes it.
func EntryBytes(k Key, e Entry) int64 {
	return int64(8*len(e.BlockHashes)+8*len(e.TrackingHashes)+8*len(e.TextBlockHashes)) +
		int64(len(k.SelectionID)+len(k.Partition.Model)+len(k.Partition.RoutingGroup)+len(e.LoraName))
}

type slot struct {
	key        Key
	entry      Entry
	insertedAt time.Time
	generation uint64
	bytes      int64
	pos        int // index in Cache.order
}

// Cache maps (partition, selection_id) to pending booking inputs. It is safe
// for concurrent use.
type Cache struct {
	ttl        time.Duration
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex
	entries map[Key]*slot
	// order is a min-heap by (insertedAt, generation), Dynamo's BTreeMap
	// order index: the sweep and the evictions pop its front in O(log n). A
	// heap rather than a FIFO list because callers pass `now` captured before
	// taking the lock, so insertion times need not arrive in order.
	order      slotHeap
	nextGen    uint64
	totalBytes int64
	// spare is the last removed slot, reused by the next Put so a cache at
	// its cap (every insert evicts one) does not allocate per select.
	spare *slot
}

// New validates cfg, fills in defaults and returns an empty cache.
func New(cfg Config) (*Cache, error) {
	switch {
	case cfg.TTL < 0:
		return nil, fmt.Errorf("ttl %v is negative: %w", cfg.TTL, ErrInvalidConfig)
	case cfg.MaxEntries < 0:
		return nil, fmt.Errorf("max entries %d is negative: %w", cfg.MaxEntries, ErrInvalidConfig)
	case cfg.MaxBytes < 0:
		return nil, fmt.Errorf("max bytes %d is negative: %w", cfg.MaxBytes, ErrInvalidConfig)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return &Cache{
		ttl:        cfg.TTL,
		maxEntries: cfg.MaxEntries,
		maxBytes:   cfg.MaxBytes,
		entries:    make(map[Key]*slot),
	}, nil
}

// expired reports whether an entry inserted at t is past the TTL at now.
// Strictly greater, as pending.rs keeps an entry exactly TTL old; a `now`
// before t (a clock step back) counts as fresh.
func (c *Cache) expired(t, now time.Time) bool { return now.Sub(t) > c.ttl }

// Put stores e under k and returns its generation. It first sweeps expired
// entries from the oldest end, then inserts or replaces (latest select wins
// and restarts the TTL, as in pending.rs), then evicts oldest-first while the
// cache is over its entry count or byte budget. An entry larger than the
// whole byte budget therefore evicts itself at once.
func (c *Cache) Put(now time.Time, k Key, e Entry) (generation uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()

	for len(c.order) > 0 && c.expired(c.order[0].insertedAt, now) {
		c.removeSlot(c.order[0])
	}

	if old, ok := c.entries[k]; ok {
		c.removeSlot(old)
	}
	generation = c.nextGen
	c.nextGen++
	s := c.spare
	if s == nil {
		s = new(slot)
	}
	c.spare = nil
	*s = slot{key: k, entry: e, insertedAt: now, generation: generation, bytes: EntryBytes(k, e)}
	c.entries[k] = s
	heap.Push(&c.order, s)
	c.totalBytes += s.bytes

	for len(c.order) > 0 && (len(c.entries) > c.maxEntries || c.totalBytes > c.maxBytes) {
		c.removeSlot(c.order[0])
	}
	return generation
}

// Peek returns the entry under k and its generation without removing it; an
// entry past its TTL is absent. The replay books from the peeked inputs and
// calls Consume only once the booking lands, so a failed booking (not ready,
// worker gone, id conflict) leaves the entry for a retry with its TTL anchor
// unchanged, as Dynamo leaves the entry for every failure but a Hard-mode
// session conflict.
func (c *Cache) Peek(now time.Time, k Key) (Entry, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.entries[k]
	if !ok || c.expired(s.insertedAt, now) {
		return Entry{}, 0, false
	}
	return s.entry, s.generation, true
}

// Consume removes the entry under k only if its generation is still the one
// the caller peeked: a newer /select that replaced the id while the replay was
// booking survives (pending.rs remove). It reports whether it removed.
func (c *Cache) Consume(k Key, generation uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.entries[k]
	if !ok || s.generation != generation {
		return false
	}
	c.removeSlot(s)
	return true
}

// Discard drops any entry under k, whatever its generation: an explicit
// reservation (worker_id given) for the id supersedes the cached selection,
// as its first step in Dynamo.
func (c *Cache) Discard(k Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.entries[k]; ok {
		c.removeSlot(s)
	}
}

// Len is the number of resident entries, expired ones not yet swept included.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Bytes is the summed EntryBytes of the resident entries.
func (c *Cache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.totalBytes
}

func (c *Cache) removeSlot(s *slot) {
	heap.Remove(&c.order, s.pos)
	delete(c.entries, s.key)
	c.totalBytes -= s.bytes
	*s = slot{} // drop the hash slices now, not at the next Put
	c.spare = s
}

// slotHeap orders slots by (insertedAt, generation); generation breaks ties
// between equal timestamps, as in pending.rs.
type slotHeap []*slot

func (h slotHeap) Len() int { return len(h) }
func (h slotHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if !a.insertedAt.Equal(b.insertedAt) {
		return a.insertedAt.Before(b.insertedAt)
	}
	return a.generation < b.generation
}
func (h slotHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos = i
	h[j].pos = j
}
func (h *slotHeap) Push(x any) {
	s := x.(*slot)
	s.pos = len(*h)
	*h = append(*h, s)
}
func (h *slotHeap) Pop() any {
	old := *h
	n := len(old) - 1
	s := old[n]
	old[n] = nil
	*h = old[:n]
	s.pos = -1
	return s
}
