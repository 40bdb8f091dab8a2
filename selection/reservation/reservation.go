// Package reservation is the selection service's reservation table: selection
// id → the (partition, worker rank) its booking is on, and the session lease
// the booking holds. A selection id is unique in the process, as Dynamo's
// standalone service keeps one reservation map whatever the model or routing
// group, so the same id booked in two partitions conflicts.
package reservation

import (
	"slices"
	"strings"
	"sync"
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
	booked   bool
	// end is the booking's estimated end once its response path was lost
	// (SetEnd); guarded by the table's mutex, the one field set after
	// installation, so the row stays the same row for Move's comparison.
	end *End
}

// End is the estimated course of a booking whose end the picker cannot see
// (a gateway that never sends the response phase): the upkeep marks its
// prefill complete at PrefillAt and frees it at At, as if its response had
// begun and ended then. Start is the booking's start, and Lifetime At less
// Start, for the estimate's metrics.
type End struct {
	Start, PrefillAt, At time.Time
	Lifetime             time.Duration
	prefillDone          bool
}

// Table maps selection ids to their rows, across every partition. Claiming
// an id first and installing the booked row after the load tracker took the
// booking lets two racing bookings of one id fail fast without touching the
// tracker. The zero value is an empty table, safe for concurrent use; its
// mutex is a leaf (see the lock order on selection.Service).
type Table struct {
	mu   sync.Mutex
	rows map[string]*Row
	// ending are the rows with an estimated end, so the upkeep's sweep
	// (Due) reads only them, not every booking.
	ending map[string]*Row
}

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
	moved := &Row{Part: cur.Part, Worker: w, Lease: cur.Lease, Prefill: cur.Prefill, Expected: cur.Expected, booked: true, end: cur.end}
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
	e.prefillDone = false
	cur.end = &e
	if t.ending == nil {
		t.ending = make(map[string]*Row)
	}
	t.ending[id] = cur
	return true
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
// (once each) and those whose end is due; the caller completes and frees
// them. An id stays in the table until the caller frees it, so a free that
// fails is seen again on the next sweep.
func (t *Table) Due(now time.Time) (prefill, ended []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, r := range t.ending {
		e := r.end
		if !e.At.After(now) {
			ended = append(ended, id)
			continue
		}
		if !e.prefillDone && !e.PrefillAt.After(now) {
			e.prefillDone = true
			prefill = append(prefill, id)
		}
	}
	return prefill, ended
}

// EndingOn returns the ids with an estimated end booked on worker's ranks
// in part that started before startedBefore, oldest first.
func (t *Table) EndingOn(part *partition.Partition, worker uint64, ranks []uint32, startedBefore time.Time) []string {
	type aged struct {
		id    string
		start time.Time
	}
	var found []aged
	t.mu.Lock()
	for id, r := range t.ending {
		if r.Part == part && r.Worker.WorkerID == worker && slices.Contains(ranks, r.Worker.DPRank) && r.end.Start.Before(startedBefore) {
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
