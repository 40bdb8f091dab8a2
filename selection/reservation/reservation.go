// Package reservation is the selection service's reservation table: selection
// id → the (partition, worker rank) its booking is on, and the session lease
// the booking holds. A selection id is unique in the process, as Dynamo's
// standalone service keeps one reservation map whatever the model or routing
// group, so the same id booked in two partitions conflicts.
package reservation

import (
	"container/heap"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/latency"
	"github.com/kvselect/kvselect/selection/partition"
)

// Row is one row of the table: claimed while its booking is in flight, then
// booked on a (partition, worker rank). A row is never modified once
// installed; a move installs a new row, so a caller that read one can tell
// whether it is still current by comparing pointers.
type Row struct {
	Part   *partition.Partition
	Worker index.WorkerKey
	Lease  *affinity.Lease
	// Prefill is the id of the remote-prefill booking made with this one,
	// "" for none: it is freed at this booking's prefill completion or free,
	// whichever comes first.
	Prefill string
	// Trace is the booking's latency forecast and what its response path
	// reported (zero when the booking was not traced).
	Trace latency.Trace
	// Expected is the booking's expected output tokens as its request
	// stated them (nil: none), for an estimated end (EndAt).
	Expected *uint32
	// LastBlock is the public hash (LocalBlockHash) of the prompt's last
	// full block when the engine's KV events can name it (a prompt hashed
	// from its token ids; LastBlockKnown), for an estimated end: the engine
	// stores that block when the prefill is done.
	LastBlock      uint64
	LastBlockKnown bool
	// StoreExpected says the rank did not hold the prompt's last block at
	// the decision: its engine will store it (and say so) when it begins
	// the request.
	StoreExpected bool
	// FirstDecodeBlock is how many output tokens complete the first block
	// after the prompt's last full one (the block size less the prompt's
	// tokens past that block), 0 when unknown: the engine stores that block,
	// chained to the prompt's, once its decode has produced them
	// (decode.go).
	FirstDecodeBlock uint32
	booked           bool
	// stored is when the engine stored the prompt's last block before the
	// row had an estimated end (Stored), storedExt that block's engine
	// hash; guarded by the table's mutex.
	stored    time.Time
	storedExt uint64
	// watchedOn is the block the row's watch waits for (Install) while
	// watching: a moved row keeps its predecessor's. Guarded by the
	// table's mutex.
	watchedOn watchKey
	watching  bool
	// decodeOn is the block whose child the row's decode watch waits for
	// (decode.go) while decoding.
	decodeOn watchKey
	decoding bool
	// end is the booking's estimated end once its response path was lost
	// (SetEnd); guarded by the table's mutex, the one field set after
	// installation, so the row stays the same row for Move's comparison.
	end *End
}

// End is the estimated course of a booking whose end the picker cannot see
// (a gateway that never sends the response phase): the upkeep marks its
// prefill complete at PrefillAt and frees it at At, as if its response had
// begun and ended then. Start is the booking's start; Lifetime and TTFT
// are At and PrefillAt less Start as first estimated, for the estimate's
// metrics.
//
// Await, when set, says the engine will report the first token (it stores
// the prompt's last block, PrefillSeen): until it does the booking is not
// freed at At but at Await, when it gives up waiting. A request still in
// its engine's queue at its estimated end is still in flight.
//
// Tokens is the output length the estimate assumed, Limit the request's
// max_tokens (0: none) and ITL the predicted inter-token latency: the
// decode's progress in the engine's KV events moves At by them (decode.go).
// No event moves At or the waits past Start plus MaxLife (zero: no bound).
type End struct {
	Start, PrefillAt, At time.Time
	Lifetime, TTFT       time.Duration
	Await                time.Time
	Tokens, Limit        int
	ITL, MaxLife         time.Duration
	prefillDone          bool
	seen                 bool // the engine reported the first token (PrefillSeen)
	// firstAt is when the first token was seen, generated how many output
	// tokens the blocks stored since then hold, blockDue until when the
	// next block of output is awaited (zero: none is; decode.go).
	firstAt   time.Time
	generated int
	blockDue  time.Time
}

// Awaited reports whether e waited for a first token that was not seen.
func (e *End) Awaited() bool { return !e.Await.IsZero() && !e.seen }

// due is when the end comes: At, or Await while the first token that is
// awaited was not seen, or blockDue while a block of output is awaited.
func (e *End) due() time.Time {
	if !e.Await.IsZero() && !e.seen && e.Await.After(e.At) {
		return e.Await
	}
	if e.BlockAwaited() {
		return e.blockDue
	}
	return e.At
}

// capped is t, or Start plus MaxLife when t is later: the furthest an
// event may move e's end.
func (e *End) capped(t time.Time) time.Time {
	if latest := e.Start.Add(e.MaxLife); e.MaxLife > 0 && t.After(latest) {
		return latest
	}
	return t
}

// firstTokenSeen moves e by its first token, seen at now: the end comes
// its estimated decode after it, however much later (the request waited in
// its engine's queue) or earlier than estimated the first token came, within
// the cap (capped). It reports whether the prefill completes now (the estimate
// had not completed it).
func (e *End) firstTokenSeen(now time.Time) (began bool) {
	e.seen = true
	e.At = e.capped(now.Add(e.At.Sub(e.PrefillAt)))
	if e.At.Before(now) {
		e.At = now
	}
	e.PrefillAt, e.firstAt = now, now
	began = !e.prefillDone
	e.prefillDone = true
	return began
}

// Table maps selection ids to their rows, across every partition. Claiming
// an id first and installing the booked row after the load tracker took the
// booking lets two racing bookings of one id fail fast without touching the
// tracker. The zero value is an empty table, safe for concurrent use; its
// mutex is a leaf (see the lock order on selection.Service).
type Table struct {
	mu   sync.Mutex
	rows map[string]*Row
	// ending are the rows with an estimated end, so nothing that acts on
	// estimated ends reads every booking.
	ending map[string]*Row
	// due orders the estimated ends' next instants (first token, end) so
	// that Due and NextDue read only what is due: a server wakes at each
	// estimated end rather than sweeping on a tick, since behind a gateway
	// that hides every response how late a booking is freed is how much
	// the loads overcount.
	due dueHeap
	// watched are the rows whose prompt's last block is named
	// (Row.LastBlockKnown) by the block an engine would store, so that a
	// batch of KV events finds the bookings it begins (Stored); watches
	// counts them, read without the lock. lastStore is when each rank last
	// stored a block: a rank that stores nothing (prefix caching off, no
	// events) will not report a first token.
	watched   map[watchKey]watchIDs
	watches   atomic.Int64
	lastStore map[watchRank]time.Time
	// decoding are the rows whose first token was seen, by the last block
	// of theirs the engine stored: the next one it stores is chained to it
	// (decode.go); decodes counts them, read without the lock.
	decoding map[watchKey]watchIDs
	decodes  atomic.Int64
}

// watchRank is one rank of one partition; watchKey a block on it.
type watchRank struct {
	part   *partition.Partition
	worker index.WorkerKey
}

type watchKey struct {
	watchRank
	block uint64
}

// watchIDs are the rows waiting for one block: nearly always one, held
// without an allocation of its own; the rare others (the same prompt
// booked twice on a rank at once) in more.
type watchIDs struct {
	first string
	more  []string
}

func (w watchIDs) all() []string { return append([]string{w.first}, w.more...) }

// Claim reserves id before its booking is made; an id that is claimed or
// booked is a 409.
func (t *Table) Claim(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, taken := t.rows[id]; taken {
		return apierr.New(apierr.Conflict, "selection %s is already reserved or being reserved", id)
	}
	if t.rows == nil {
		t.rows = make(map[string]*Row)
	}
	t.rows[id] = &Row{}
	return nil
}

// Unclaim gives back a claim whose booking failed. A booked row stays: the
// claim it came from was already consumed.
func (t *Table) Unclaim(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.rows[id]; ok && !r.booked {
		delete(t.rows, id)
	}
}

// Install records id's booking: row, filled by the caller (partition,
// worker rank, the session lease it holds, the remote prefill booked with
// it, its trace) and not touched by it afterwards.
func (t *Table) Install(id string, row *Row) {
	row.booked = true
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rows == nil {
		t.rows = make(map[string]*Row)
	}
	t.rows[id] = row
	if row.LastBlockKnown {
		k := watchKey{watchRank{row.Part, row.Worker}, row.LastBlock}
		row.watchedOn, row.watching = k, true
		add(&t.watched, id, k)
		t.watches.Add(1)
	}
}

// unwatch forgets id's watch on k. Called with t.mu held.
func (t *Table) unwatch(id string, k watchKey) {
	if forget(t.watched, id, k) {
		t.watches.Add(-1)
	}
}

// forget takes id out of the ids watching k in m, reporting whether it was
// there.
func forget(m map[watchKey]watchIDs, id string, k watchKey) bool {
	w, ok := m[k]
	if !ok {
		return false
	}
	switch i := slices.Index(w.more, id); {
	case i >= 0:
		w.more = slices.Delete(w.more, i, i+1)
	case w.first == id && len(w.more) > 0:
		w.first, w.more = w.more[0], w.more[1:]
	case w.first == id:
		delete(m, k)
		return true
	default:
		return false
	}
	m[k] = w
	return true
}

// add appends id to the ids watching k in m, allocating m when nil.
func add(m *map[watchKey]watchIDs, id string, k watchKey) {
	if *m == nil {
		*m = make(map[watchKey]watchIDs)
	}
	if w, ok := (*m)[k]; ok {
		w.more = append(w.more, id)
		(*m)[k] = w
	} else {
		(*m)[k] = watchIDs{first: id}
	}
}

// Booked returns id's booked row. An id that is only claimed (its booking
// still in flight) is not found, like one never seen: lifecycle calls must
// not act on a booking that may yet fail.
func (t *Table) Booked(id string) (*Row, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id]
	if !ok || !r.booked {
		return nil, apierr.New(apierr.NotFound, "reservation %s not found", id)
	}
	return r, nil
}

// Drop forgets id's booked row and returns the session lease the caller must
// release; ok is false when there was no booked row, so a lease is handed out
// once however many callers race to drop the same id. A claimed row stays
// with its in-flight booking.
func (t *Table) Drop(id string) (lease *affinity.Lease, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, found := t.rows[id]
	if !found || !r.booked {
		return nil, false
	}
	delete(t.rows, id)
	delete(t.ending, id)
	if r.watching {
		t.unwatch(id, r.watchedOn)
	}
	if r.decoding {
		t.undecode(id, r.decodeOn)
	}
	return r.Lease, true
}

// Release forgets a row whose booking is gone (freed, expired, or its worker
// left) and releases, at now, the session lease it held. The lease is
// released after the table let go of its lock: the affinity table's lock is
// a leaf of its own.
func (t *Table) Release(id string, now time.Time) {
	if lease, ok := t.Drop(id); ok && lease != nil {
		lease.Release(now)
	}
}

// Move re-points id's row to rank w of the same partition, only while the
// row is still read, the one the caller looked up before moving the load: a
// booking freed (and perhaps booked again under the same id) or moved by
// someone else in between is left alone. It reports whether it moved.
func (t *Table) Move(id string, read *Row, w index.WorkerKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.rows[id]
	if !ok || cur != read || !cur.booked {
		return false
	}
	// The trace stays behind: its features describe the rank the booking
	// left, so what the moved request observes would fit the wrong model.
	// The watch stays on the rank the row left: its key is the
	// predecessor's, dropped with the moved row.
	moved := &Row{Part: cur.Part, Worker: w, Lease: cur.Lease, Prefill: cur.Prefill, Expected: cur.Expected,
		LastBlock: cur.LastBlock, LastBlockKnown: cur.LastBlockKnown, FirstDecodeBlock: cur.FirstDecodeBlock, booked: true, end: cur.end,
		stored: cur.stored, storedExt: cur.storedExt, watchedOn: cur.watchedOn, watching: cur.watching,
		decodeOn: cur.decodeOn, decoding: cur.decoding}
	t.rows[id] = moved
	if cur.end != nil {
		t.ending[id] = moved
	}
	return true
}

// SetEnd gives id's row, only while it is still read, an estimated end: from
// then on the booking ends when Due says so, unless it is freed first. It
// reports whether it was set; a row that already has one keeps it.
func (t *Table) SetEnd(id string, read *Row, e End) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.rows[id]
	if !ok || cur != read || !cur.booked || cur.end != nil {
		return false
	}
	e.prefillDone, e.seen, e.firstAt, e.generated = false, false, time.Time{}, 0
	cur.end = &e
	if !cur.stored.IsZero() {
		// Stored before its end was set: the gateway's hang-up came after
		// the engine began. Nothing to wait for; its decode is watched from
		// that block on.
		e.seen, e.firstAt = true, cur.stored
		t.decodeFrom(id, cur, cur.storedExt)
	}
	if t.ending == nil {
		t.ending = make(map[string]*Row)
	}
	t.ending[id] = cur
	t.schedule(id, cur.end)
	return true
}

// schedule queues end's next instant: its first token until that is done,
// then its end. Called with t.mu held.
func (t *Table) schedule(id string, end *End) {
	at, prefill := end.due(), false
	if !end.prefillDone && end.PrefillAt.Before(at) {
		at, prefill = end.PrefillAt, true
	}
	heap.Push(&t.due, dueEntry{at: at, id: id, end: end, prefill: prefill})
	// Entries of rows freed or rescheduled before their instant stay
	// queued until it comes; rebuild once they outnumber the live ones,
	// so the queue stays within twice the ending rows.
	if n := len(t.due); n > 64 && n > 2*len(t.ending) {
		live := t.due[:0]
		for _, d := range t.due {
			if t.current(d) {
				live = append(live, d)
			}
		}
		clear(t.due[len(live):])
		t.due = live
		heap.Init(&t.due)
	}
}

// current reports whether d is still its row's next instant. Called with
// t.mu held.
func (t *Table) current(d dueEntry) bool {
	r, ok := t.ending[d.id]
	if !ok || r.end != d.end {
		return false
	}
	if d.prefill {
		return !d.end.prefillDone && d.end.PrefillAt.Equal(d.at)
	}
	return d.end.due().Equal(d.at)
}

// FirstToken is a booking whose first token an engine reported (Stored):
// Due is when its estimated end now comes; Began says the caller completes
// its prefill, which the estimate had not done yet. Part, Start and TTFT
// are its row's and its estimate's, for the caller's metrics.
type FirstToken struct {
	ID    string
	Due   time.Time
	Began bool
	Part  *partition.Partition
	Start time.Time
	TTFT  time.Duration
}

// Watching reports whether any row waits for its prompt's last block or
// for its decode's next one, so a batch of KV events needs reading; it
// takes no lock.
func (t *Table) Watching() bool { return t.watches.Load() > 0 || t.decodes.Load() > 0 }

// Watches counts the rows waiting for their prompt's last block.
func (t *Table) Watches() int64 { return t.watches.Load() }

// Stored records that worker's engine in part stored blocks at now (a KV
// events batch): a row waiting for one of them as its prompt's last block
// has its first token now. Its estimated end moves (End.firstTokenSeen),
// within its cap (End.MaxLife); a row without one yet keeps the time
// for SetEnd. It returns the moved ends; each row is seen once.
//
// The blocks are read storedChunk at a time, the lock let go in between: a
// long prompt stores tens of thousands at once, and every booking waits
// on this lock.
func (t *Table) Stored(part *partition.Partition, worker index.WorkerKey, blocks []index.Block, now time.Time) []FirstToken {
	rank := watchRank{part, worker}
	var out []FirstToken
	for start := 0; ; start += storedChunk {
		chunk := blocks[start:min(start+storedChunk, len(blocks))]
		t.mu.Lock()
		if start == 0 {
			if t.lastStore == nil {
				t.lastStore = make(map[watchRank]time.Time)
			}
			t.lastStore[rank] = now
		}
		out = t.stored(rank, chunk, now, out)
		t.mu.Unlock()
		if start+len(chunk) >= len(blocks) || t.watches.Load() == 0 {
			return out
		}
	}
}

// storedChunk is how many stored blocks Stored reads under one hold of
// the lock.
const storedChunk = 256

// stored is Stored's reading of blocks, with t.mu held: it appends to out.
func (t *Table) stored(rank watchRank, blocks []index.Block, now time.Time, out []FirstToken) []FirstToken {
	if t.watches.Load() == 0 {
		return out
	}
	for _, b := range blocks {
		k := watchKey{rank, b.Local}
		w, ok := t.watched[k]
		if !ok {
			continue
		}
		delete(t.watched, k)
		ids := w.all()
		t.watches.Add(-int64(len(ids)))
		for _, id := range ids {
			r, found := t.rows[id]
			if !found {
				continue
			}
			r.watching = false
			if r.end == nil {
				if r.stored.IsZero() {
					r.stored, r.storedExt = now, b.Ext
				}
				continue
			}
			if r.end.seen {
				continue
			}
			began := r.end.firstTokenSeen(now)
			t.decodeFrom(id, r, b.Ext)
			t.schedule(id, r.end)
			out = append(out, FirstToken{ID: id, Due: r.end.due(), Began: began, Part: r.Part, Start: r.end.Start, TTFT: r.end.TTFT})
		}
	}
	return out
}

// ForgetStores forgets the ranks that stored nothing since before: a rank
// gone for good is not remembered forever.
func (t *Table) ForgetStores(before time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, last := range t.lastStore {
		if last.Before(before) {
			delete(t.lastStore, k)
		}
	}
}

// StoresWithin reports whether worker's engine in part stored a block
// since since: one that does reports the first tokens of the prompts it
// begins (Stored).
func (t *Table) StoresWithin(part *partition.Partition, worker index.WorkerKey, since time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	last, ok := t.lastStore[watchRank{part, worker}]
	return ok && !last.Before(since)
}

// NextDue is the earliest instant an estimated end has something due (its
// first token or its end); ok is false when no row has an estimated end.
func (t *Table) NextDue() (at time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.due) > 0 {
		if d := t.due[0]; t.current(d) {
			return d.at, true
		}
		heap.Pop(&t.due)
	}
	return time.Time{}, false
}

// EndOf returns id's estimated end, if it has one.
func (t *Table) EndOf(id string) (End, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id]
	if !ok || r.end == nil {
		return End{}, false
	}
	return *r.end, true
}

// Due returns, at now, the ids with an estimated end whose prefill is due
// (once each) and those whose end is due (once each); the caller completes
// and frees them. It reads only what is due, in the order it came due.
func (t *Table) Due(now time.Time) (prefill, ended []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.due) > 0 && !t.due[0].at.After(now) {
		d := heap.Pop(&t.due).(dueEntry)
		if !t.current(d) {
			continue
		}
		if !d.prefill || !d.end.due().After(now) {
			ended = append(ended, d.id)
			continue
		}
		d.end.prefillDone = true
		prefill = append(prefill, d.id)
		t.schedule(d.id, d.end)
	}
	return prefill, ended
}

// EndingOn returns the ids with an estimated end booked on worker's ranks
// in part that started before startedBefore, or whose first token was seen
// (Stored) by seenBefore whenever they started, oldest first: an engine's
// counts asked for from then on include those.
func (t *Table) EndingOn(part *partition.Partition, worker uint64, ranks []uint32, startedBefore, seenBefore time.Time) []string {
	type aged struct {
		id    string
		start time.Time
	}
	var found []aged
	t.mu.Lock()
	for id, r := range t.ending {
		if r.Part == part && r.Worker.WorkerID == worker && slices.Contains(ranks, r.Worker.DPRank) &&
			(r.end.seen && !r.end.firstAt.After(seenBefore) || r.end.Start.Before(startedBefore)) {
			found = append(found, aged{id, r.end.Start})
		}
	}
	t.mu.Unlock()
	slices.SortFunc(found, func(a, b aged) int {
		if c := a.start.Compare(b.start); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	out := make([]string, len(found))
	for i, a := range found {
		out[i] = a.id
	}
	return out
}

// Ending counts the rows with an estimated end.
func (t *Table) Ending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ending)
}

// Has reports whether id has a row, claimed or booked.
func (t *Table) Has(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.rows[id]
	return ok
}

// Len counts the rows, claimed or booked.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

// dueEntry is one queued instant of an estimated end: its first token
// (prefill) or its end.
type dueEntry struct {
	at      time.Time
	id      string
	end     *End
	prefill bool
}

// dueHeap is a min-heap of dueEntry by instant (container/heap).
type dueHeap []dueEntry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueEntry)) }
func (h *dueHeap) Pop() any {
	old := *h
	n := len(old) - 1
	x := old[n]
	old[n] = dueEntry{}
	*h = old[:n]
	return x
}
