package pending

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

const testTTL = 10 * time.Second

var (
	t0         = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	defaultPar = index.Partition{Model: "model", RoutingGroup: "default"}
)

func key(id string) Key { return Key{Partition: defaultPar, SelectionID: id} }

// pendingEntry mirrors pending.rs's test fixture: three tracking hashes,
// isl 12, effective prefill 8, 16 expected output tokens.
func pendingEntry(worker uint64) Entry {
	out := uint32(16)
	return Entry{
		Worker:                 index.WorkerKey{WorkerID: worker},
		TrackingHashes:         []uint64{1, 2, 3},
		ISL:                    12,
		EffectivePrefillTokens: 8,
		ExpectedOutputTokens:   &out,
		TrackPrefill:           true,
	}
}

func newCache(t testing.TB, maxEntries int, maxBytes int64) *Cache {
	t.Helper()
	c, err := New(Config{TTL: testTTL, MaxEntries: maxEntries, MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func mustPeek(t *testing.T, c *Cache, now time.Time, id string) (Entry, uint64) {
	t.Helper()
	e, gen, ok := c.Peek(now, key(id))
	if !ok {
		t.Fatalf("Peek(%q) missing", id)
	}
	return e, gen
}

func assertAbsent(t *testing.T, c *Cache, now time.Time, id string) {
	t.Helper()
	if _, _, ok := c.Peek(now, key(id)); ok {
		t.Fatalf("Peek(%q) present, want absent", id)
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
		ttl     time.Duration
		entries int
		bytes   int64
	}{
		{name: "zero takes Dynamo's defaults", ttl: 120 * time.Second, entries: 4096, bytes: 268435456},
		{name: "CLI overrides are kept", cfg: Config{TTL: 30 * time.Second, MaxEntries: 100, MaxBytes: 1048576}, ttl: 30 * time.Second, entries: 100, bytes: 1048576},
		{name: "negative ttl is rejected", cfg: Config{TTL: -1}, wantErr: true},
		{name: "negative max entries is rejected", cfg: Config{MaxEntries: -1}, wantErr: true},
		{name: "negative max bytes is rejected", cfg: Config{MaxBytes: -1}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("New() err = %v, want ErrInvalidConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.ttl != tt.ttl || c.maxEntries != tt.entries || c.maxBytes != tt.bytes {
				t.Fatalf("config = (%v, %d, %d), want (%v, %d, %d)", c.ttl, c.maxEntries, c.maxBytes, tt.ttl, tt.entries, tt.bytes)
			}
		})
	}
}

func TestEntryBytes(t *testing.T) {
	k := Key{Partition: index.Partition{Model: "llama", RoutingGroup: "team-a"}, SelectionID: "sel-1"}
	e := Entry{
		TrackingHashes: make([]uint64, 3),
		BlockHashes:    make([]uint64, 2),
		LoraName:       "adapter",
		SessionID:      "not counted",
	}
	// 8×2 + 8×3 + len("sel-1") + len("llama") + len("team-a") + len("adapter")
	if got, want := EntryBytes(k, e), int64(16+24+5+5+6+7); got != want {
		t.Fatalf("EntryBytes = %d, want %d", got, want)
	}
}

// Ports of pending.rs's unit tests (Dynamo's
// lib/kv-router/src/services/selection/pending.rs).
func TestPeekThenConsumeConsumesOnce(t *testing.T) {
	c := newCache(t, 2, 1<<40)
	c.Put(t0, key("req-1"), pendingEntry(1))

	e, gen := mustPeek(t, c, t0, "req-1")
	if e.Worker.WorkerID != 1 || e.ISL != 12 {
		t.Fatalf("peeked %+v", e)
	}
	// A peek leaves the entry; only Consume removes it.
	mustPeek(t, c, t0, "req-1")
	if !c.Consume(key("req-1"), gen) {
		t.Fatal("Consume of the peeked generation reported nothing removed")
	}
	assertAbsent(t, c, t0, "req-1")
	if c.Consume(key("req-1"), gen) {
		t.Fatal("second Consume removed something")
	}
}

func TestPeekRefusesExpiredEntry(t *testing.T) {
	c := newCache(t, 2, 1<<40)
	c.Put(t0, key("req-1"), pendingEntry(1))
	mustPeek(t, c, t0.Add(testTTL), "req-1") // exactly TTL old is still live
	assertAbsent(t, c, t0.Add(testTTL+time.Second), "req-1")
}

func TestPutSweepsExpiredEntries(t *testing.T) {
	c := newCache(t, 2, 1<<40)
	c.Put(t0, key("old"), pendingEntry(1))
	later := t0.Add(testTTL + time.Second)
	c.Put(later, key("new"), pendingEntry(2))
	if c.Len() != 1 {
		t.Fatalf("Len = %d, want 1", c.Len())
	}
	assertAbsent(t, c, later, "old")
	mustPeek(t, c, later, "new")
}

func TestBudgetsEvictOldestFirst(t *testing.T) {
	per := EntryBytes(key("a"), pendingEntry(1))
	tests := []struct {
		name       string
		maxEntries int
		maxBytes   int64
	}{
		{name: "entry cap", maxEntries: 2, maxBytes: 1 << 40},
		{name: "byte budget", maxEntries: 1024, maxBytes: 2 * per},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, tt.maxEntries, tt.maxBytes)
			c.Put(t0, key("a"), pendingEntry(1))
			c.Put(t0.Add(ms(1)), key("b"), pendingEntry(2))
			c.Put(t0.Add(ms(2)), key("c"), pendingEntry(3))
			now := t0.Add(ms(3))
			if c.Len() != 2 {
				t.Fatalf("Len = %d, want 2", c.Len())
			}
			assertAbsent(t, c, now, "a")
			mustPeek(t, c, now, "b")
			mustPeek(t, c, now, "c")
			if c.Bytes() != 2*per {
				t.Fatalf("Bytes = %d, want %d", c.Bytes(), 2*per)
			}
		})
	}
}

func TestEntryOverWholeBudgetEvictsItself(t *testing.T) {
	per := EntryBytes(key("a"), pendingEntry(1))
	c := newCache(t, 1024, per)
	c.Put(t0, key("a"), pendingEntry(1))
	huge := pendingEntry(2)
	huge.TrackingHashes = make([]uint64, 1000)
	c.Put(t0.Add(ms(1)), key("huge"), huge)
	assertAbsent(t, c, t0.Add(ms(2)), "huge")
	// The smaller, older entry is evicted first, then the oversized one itself.
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Fatalf("Len, Bytes = %d, %d; want 0, 0", c.Len(), c.Bytes())
	}
}

func TestConsumeYieldsToNewerSelection(t *testing.T) {
	c := newCache(t, 2, 1<<40)
	c.Put(t0, key("req-1"), pendingEntry(1))
	_, stale := mustPeek(t, c, t0, "req-1")
	// A newer select replaces the id while the first replay is booking.
	c.Put(t0.Add(ms(1)), key("req-1"), pendingEntry(2))
	if c.Consume(key("req-1"), stale) {
		t.Fatal("stale generation removed the newer selection")
	}
	e, _ := mustPeek(t, c, t0.Add(ms(2)), "req-1")
	if e.Worker.WorkerID != 2 {
		t.Fatalf("survivor worker = %d, want 2", e.Worker.WorkerID)
	}
}

func TestOrderIndexBoundedByLiveEntriesUnderPinnedFront(t *testing.T) {
	c := newCache(t, 1024, 1<<40)
	c.Put(t0, key("pinned"), pendingEntry(0)) // never consumed
	for i := 1; i <= 50; i++ {
		id := fmt.Sprintf("req-%d", i)
		at := t0.Add(ms(i))
		c.Put(at, key(id), pendingEntry(uint64(i)))
		_, gen := mustPeek(t, c, at, id)
		c.Consume(key(id), gen)
	}
	if c.Len() != 1 || len(c.order) != 1 {
		t.Fatalf("Len, order = %d, %d; want 1, 1", c.Len(), len(c.order))
	}
}

// Cache-level halves of the replay tests among Dynamo's HTTP-level tests
// (lib/kv-router/src/services/selection/tests.rs), each named in its case: the
// rest of each test (booking, loads) belongs to the service.
func TestReplayBehaviours(t *testing.T) {
	other := Key{Partition: index.Partition{Model: "other", RoutingGroup: "default"}, SelectionID: "sel-1"}
	tests := []struct {
		name string
		run  func(t *testing.T, c *Cache)
	}{
		{
			// cached_reservation_books_from_select: a replay books once; again → 404.
			name: "replay is single use",
			run: func(t *testing.T, c *Cache) {
				c.Put(t0, key("sel-1"), pendingEntry(1))
				_, gen := mustPeek(t, c, t0, "sel-1")
				c.Consume(key("sel-1"), gen)
				assertAbsent(t, c, t0, "sel-1")
			},
		},
		{
			// cached_reservation_ignores_request_overrides: the cached inputs are
			// returned as stored.
			name: "replay returns the cached inputs",
			run: func(t *testing.T, c *Cache) {
				in := pendingEntry(3)
				in.Worker.DPRank = 2
				in.BlockHashes = []uint64{9}
				in.LoraName = "lora"
				in.SessionID = "s"
				c.Put(t0, key("sel-1"), in)
				got, _ := mustPeek(t, c, t0, "sel-1")
				if got.Worker != in.Worker || got.EffectivePrefillTokens != 8 || *got.ExpectedOutputTokens != 16 ||
					got.LoraName != "lora" || got.SessionID != "s" || len(got.BlockHashes) != 1 || !got.TrackPrefill {
					t.Fatalf("got %+v, want %+v", got, in)
				}
			},
		},
		{
			// cached_reservation_needs_matching_model: a miss in another
			// partition does not consume.
			name: "other partition is a miss that does not consume",
			run: func(t *testing.T, c *Cache) {
				c.Put(t0, key("sel-1"), pendingEntry(1))
				if _, _, ok := c.Peek(t0, other); ok {
					t.Fatal("hit across partitions")
				}
				c.Discard(Key{Partition: index.Partition{Model: "model", RoutingGroup: "g2"}, SelectionID: "sel-1"})
				mustPeek(t, c, t0, "sel-1")
			},
		},
		{
			// failed_cached_booking_is_retryable,
			// cached_booking_retryable_after_scheduler_conflict,
			// cached_reservation_rejects_stale_dp_rank: a failed booking (not
			// ready, 409, stale rank) only peeked, so the entry and its TTL
			// anchor survive for the retry.
			name: "failed booking leaves the entry with its TTL anchor",
			run: func(t *testing.T, c *Cache) {
				c.Put(t0, key("sel-1"), pendingEntry(1))
				mustPeek(t, c, t0.Add(5*time.Second), "sel-1") // attempt 1 fails
				mustPeek(t, c, t0.Add(testTTL), "sel-1")       // retry within TTL
				assertAbsent(t, c, t0.Add(testTTL+ms(1)), "sel-1")
			},
		},
		{
			// explicit_reservation_discards_cached_selection.
			name: "explicit reservation discards the cached selection",
			run: func(t *testing.T, c *Cache) {
				c.Put(t0, key("req-1"), pendingEntry(1))
				c.Discard(key("req-1"))
				assertAbsent(t, c, t0, "req-1")
				if c.Bytes() != 0 {
					t.Fatalf("Bytes = %d after discard", c.Bytes())
				}
			},
		},
		{
			// cached_booking_honors_prefill_tracking: a later select with another
			// override replaces the entry (latest wins).
			name: "latest select wins",
			run: func(t *testing.T, c *Cache) {
				e := pendingEntry(1)
				e.TrackPrefill = false
				c.Put(t0, key("sel-1"), e)
				e.TrackPrefill = true
				g2 := c.Put(t0.Add(ms(1)), key("sel-1"), e)
				got, gen := mustPeek(t, c, t0.Add(ms(1)), "sel-1")
				if !got.TrackPrefill || gen != g2 || c.Len() != 1 {
					t.Fatalf("got track=%v gen=%d len=%d", got.TrackPrefill, gen, c.Len())
				}
			},
		},
		{
			name: "replacement restarts the TTL",
			run: func(t *testing.T, c *Cache) {
				c.Put(t0, key("sel-1"), pendingEntry(1))
				c.Put(t0.Add(8*time.Second), key("sel-1"), pendingEntry(2))
				mustPeek(t, c, t0.Add(15*time.Second), "sel-1")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newCache(t, 16, 1<<40)) })
	}
}

func TestOutOfOrderInsertTimesEvictOldestAnchor(t *testing.T) {
	c := newCache(t, 2, 1<<40)
	c.Put(t0.Add(ms(5)), key("late"), pendingEntry(1))
	c.Put(t0, key("early"), pendingEntry(2)) // `now` captured before the lock
	c.Put(t0.Add(ms(6)), key("newest"), pendingEntry(3))
	assertAbsent(t, c, t0.Add(ms(7)), "early")
	mustPeek(t, c, t0.Add(ms(7)), "late")
	mustPeek(t, c, t0.Add(ms(7)), "newest")
}

// refModel is the obvious O(n) reading of the cache rules (sweep expired on
// Put, latest select wins, evict oldest while over either budget), used to
// check Cache.
type refModel struct {
	ttl        time.Duration
	maxEntries int
	maxBytes   int64
	gen        uint64
	rows       map[Key]refRow
}

type refRow struct {
	e   Entry
	at  time.Time
	gen uint64
}

func (m *refModel) oldest() (Key, bool) {
	var best Key
	var br refRow
	found := false
	for k, r := range m.rows {
		if !found || r.at.Before(br.at) || (r.at.Equal(br.at) && r.gen < br.gen) {
			best, br, found = k, r, true
		}
	}
	return best, found
}

func (m *refModel) bytes() int64 {
	var n int64
	for k, r := range m.rows {
		n += EntryBytes(k, r.e)
	}
	return n
}

func (m *refModel) put(now time.Time, k Key, e Entry) uint64 {
	for k2, r := range m.rows {
		if now.Sub(r.at) > m.ttl {
			delete(m.rows, k2)
		}
	}
	g := m.gen
	m.gen++
	m.rows[k] = refRow{e: e, at: now, gen: g}
	for len(m.rows) > m.maxEntries || m.bytes() > m.maxBytes {
		o, _ := m.oldest()
		delete(m.rows, o)
	}
	return g
}

func TestRandomizedAgainstReferenceModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		maxEntries := 1 + rng.IntN(8)
		maxBytes := int64(30 + rng.IntN(200))
		c := newCache(t, maxEntries, maxBytes)
		m := &refModel{ttl: testTTL, maxEntries: maxEntries, maxBytes: maxBytes, rows: map[Key]refRow{}}
		now := t0
		ids := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
		parts := []index.Partition{defaultPar, {Model: "m2", RoutingGroup: "default"}}
		for step := 0; step < 2000; step++ {
			// Mostly forward, sometimes a little backward (callers' `now` races).
			now = now.Add(time.Duration(rng.IntN(3000)-300) * time.Millisecond)
			k := Key{Partition: parts[rng.IntN(2)], SelectionID: ids[rng.IntN(len(ids))]}
			switch op := rng.IntN(10); {
			case op < 5:
				e := Entry{Worker: index.WorkerKey{WorkerID: uint64(step)}, TrackingHashes: make([]uint64, rng.IntN(4))}
				if got, want := c.Put(now, k, e), m.put(now, k, e); got != want {
					t.Fatalf("seed %d step %d: generation %d, want %d", seed, step, got, want)
				}
			case op < 8:
				e, gen, ok := c.Peek(now, k)
				r, rok := m.rows[k]
				rok = rok && now.Sub(r.at) <= m.ttl
				if ok != rok || (ok && (gen != r.gen || e.Worker != r.e.Worker)) {
					t.Fatalf("seed %d step %d: Peek(%v) = (%v, %d, %v), want (%v, %d, %v)", seed, step, k, e.Worker, gen, ok, r.e.Worker, r.gen, rok)
				}
				if ok && rng.IntN(2) == 0 {
					c.Consume(k, gen)
					delete(m.rows, k)
				}
			case op < 9:
				g := uint64(rng.IntN(step + 1)) // usually stale
				r, ok := m.rows[k]
				want := ok && r.gen == g
				if got := c.Consume(k, g); got != want {
					t.Fatalf("seed %d step %d: Consume(%v, %d) = %v, want %v", seed, step, k, g, got, want)
				}
				if want {
					delete(m.rows, k)
				}
			default:
				c.Discard(k)
				delete(m.rows, k)
			}
			if c.Len() != len(m.rows) || c.Bytes() != m.bytes() || len(c.order) != c.Len() {
				t.Fatalf("seed %d step %d: len/bytes/order = %d/%d/%d, want %d/%d", seed, step, c.Len(), c.Bytes(), len(c.order), len(m.rows), m.bytes())
			}
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	c := newCache(t, 64, 1<<20)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				now := t0.Add(ms(i))
				k := key(fmt.Sprintf("%d-%d", g, i%100))
				c.Put(now, k, pendingEntry(uint64(i)))
				if _, gen, ok := c.Peek(now, k); ok {
					c.Consume(k, gen)
				}
				if i%7 == 0 {
					c.Discard(k)
				}
				_ = c.Len() + int(c.Bytes())
			}
		}()
	}
	wg.Wait()
	if c.Len() > 64 || len(c.order) != c.Len() {
		t.Fatalf("Len = %d, order = %d", c.Len(), len(c.order))
	}
}
