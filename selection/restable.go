package selection

import (
	"sync"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/index"
)

// reservation is one row of the process-wide reservation table: claimed while
// its booking is in flight, then booked on a (partition, worker rank). A row
// is never modified once installed; a move installs a new row, so a caller
// that read one can tell whether it is still current by comparing pointers.
type reservation struct {
	part   *partition
	worker index.WorkerKey
	booked bool
	lease  *affinity.Lease
	// prefill is the id of the remote-prefill booking made with this one
	// (disagg.go), "" for none: it is freed at this booking's prefill
	// completion or free, whichever comes first.
	prefill string
}

// reservationTable maps selection ids to their reservation rows, across every
// partition: a selection id is unique in the process, as Dynamo's standalone
// service keeps one reservation map whatever the model or routing group, so
// the same id booked in two partitions conflicts. Claiming an id first and
// installing the booked row after the load tracker took the booking lets two
// racing bookings of one id fail fast without touching the tracker. The zero
// value is an empty table, safe for concurrent use; its mutex is a leaf (see
// the lock order on Service).
type reservationTable struct {
	mu   sync.Mutex
	rows map[string]*reservation
}

// claim reserves id before its booking is made; an id that is claimed or
// booked is a 409.
func (t *reservationTable) claim(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, taken := t.rows[id]; taken {
		return apierr.New(KindConflict, "selection %s is already reserved or being reserved", id)
	}
	if t.rows == nil {
		t.rows = make(map[string]*reservation)
	}
	t.rows[id] = &reservation{}
	return nil
}

// unclaim gives back a claim whose booking failed. A booked row stays: the
// claim it came from was already consumed.
func (t *reservationTable) unclaim(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.rows[id]; ok && !r.booked {
		delete(t.rows, id)
	}
}

// install records id's booking on rank w of p, with the session lease the
// booking holds (nil when none).
func (t *reservationTable) install(id string, p *partition, w index.WorkerKey, lease *affinity.Lease) {
	t.installWithPrefill(id, p, w, lease, "")
}

// installWithPrefill is install for a decode booking whose prompt a separate
// booking, prefillID, prefills remotely.
func (t *reservationTable) installWithPrefill(id string, p *partition, w index.WorkerKey, lease *affinity.Lease, prefillID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rows == nil {
		t.rows = make(map[string]*reservation)
	}
	t.rows[id] = &reservation{part: p, worker: w, booked: true, lease: lease, prefill: prefillID}
}

// booked returns id's booked row. An id that is only claimed (its booking
// still in flight) is not found, like one never seen: lifecycle calls must
// not act on a booking that may yet fail.
func (t *reservationTable) booked(id string) (*reservation, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id]
	if !ok || !r.booked {
		return nil, apierr.New(KindNotFound, "reservation %s not found", id)
	}
	return r, nil
}

// drop forgets id's booked row and returns the session lease the caller must
// release; ok is false when there was no booked row, so a lease is handed out
// once however many callers race to drop the same id. A claimed row stays
// with its in-flight booking.
func (t *reservationTable) drop(id string) (lease *affinity.Lease, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, found := t.rows[id]
	if !found || !r.booked {
		return nil, false
	}
	delete(t.rows, id)
	return r.lease, true
}

// move re-points id's row to rank w of the same partition, only while the
// row is still read, the one the caller looked up before moving the load: a
// booking freed (and perhaps booked again under the same id) or moved by
// someone else in between is left alone. It reports whether it moved.
func (t *reservationTable) move(id string, read *reservation, w index.WorkerKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.rows[id]
	if !ok || cur != read || !cur.booked {
		return false
	}
	moved := *cur
	moved.worker = w
	t.rows[id] = &moved
	return true
}
