package selection

import (
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/index"
)

// has reports whether id has a row, claimed or booked.
func (t *reservationTable) has(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.rows[id]
	return ok
}

// size counts the rows, claimed or booked.
func (t *reservationTable) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

// testLease binds session sid to worker 1 in a real affinity table and returns
// the lease the booking would hold.
func testLease(t *testing.T, sid string) *affinity.Lease {
	t.Helper()
	now := time.Unix(1_700_000_000, 0)
	tab, err := affinity.NewTable(affinity.Config{TTL: time.Minute, Mode: affinity.Hard}, now)
	if err != nil {
		t.Fatal(err)
	}
	anywhere := func(affinity.Target) bool { return true }
	hold, _, err := tab.Acquire(now, sid, anywhere)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := hold.Commit(now, affinity.WorkerTarget(1), anywhere)
	if err != nil || lease == nil {
		t.Fatalf("commit: lease %v, err %v", lease, err)
	}
	return lease
}

func TestReservationTableClaimConflicts(t *testing.T) {
	var tab reservationTable
	if err := tab.claim("a"); err != nil {
		t.Fatal(err)
	}
	wantKind(t, tab.claim("a"), KindConflict, "selection a is already reserved or being reserved")
	tab.install("a", nil, index.WorkerKey{WorkerID: 1}, nil)
	wantKind(t, tab.claim("a"), KindConflict, "already reserved")
	if err := tab.claim("b"); err != nil {
		t.Fatalf("another id: %v", err)
	}
}

func TestReservationTableUnclaimLeavesBookedRows(t *testing.T) {
	var tab reservationTable
	for _, id := range []string{"claimed", "booked"} {
		if err := tab.claim(id); err != nil {
			t.Fatal(err)
		}
	}
	tab.install("booked", nil, index.WorkerKey{WorkerID: 2}, nil)
	tab.unclaim("claimed")
	tab.unclaim("booked")
	tab.unclaim("never")
	if tab.has("claimed") {
		t.Error("unclaim kept a claimed row")
	}
	if r, err := tab.booked("booked"); err != nil || r.worker.WorkerID != 2 {
		t.Errorf("unclaim dropped a booked row: %+v, %v", r, err)
	}
	if err := tab.claim("claimed"); err != nil {
		t.Errorf("an unclaimed id is free again: %v", err)
	}
}

func TestReservationTableClaimedRowsAreNotBooked(t *testing.T) {
	var tab reservationTable
	if err := tab.claim("in-flight"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"in-flight", "unknown"} {
		_, err := tab.booked(id)
		wantKind(t, err, KindNotFound, "reservation "+id+" not found")
	}
	if _, ok := tab.drop("in-flight"); ok {
		t.Error("drop took a row whose booking is still in flight")
	}
	if !tab.has("in-flight") {
		t.Error("drop removed a claimed row")
	}
}

func TestReservationTableDropReturnsTheLeaseOnce(t *testing.T) {
	var tab reservationTable
	lease := testLease(t, "session-1")
	tab.install("a", nil, index.WorkerKey{WorkerID: 1}, lease)
	tab.install("b", nil, index.WorkerKey{WorkerID: 1}, nil)
	got, ok := tab.drop("a")
	if !ok || got != lease || got.SessionID() != "session-1" {
		t.Fatalf("first drop: lease %v ok %v, want the installed lease", got, ok)
	}
	if got, ok := tab.drop("a"); ok || got != nil {
		t.Fatalf("second drop: lease %v ok %v, want nothing", got, ok)
	}
	if _, err := tab.booked("a"); KindOf(err) != KindNotFound {
		t.Fatalf("dropped row still booked: %v", err)
	}
	if got, ok := tab.drop("b"); !ok || got != nil {
		t.Fatalf("row without a lease: lease %v ok %v", got, ok)
	}
	if tab.size() != 0 {
		t.Fatalf("%d rows left", tab.size())
	}
}

func TestReservationTableMovesOnlyTheRowTheCallerRead(t *testing.T) {
	from, to := index.WorkerKey{WorkerID: 1}, index.WorkerKey{WorkerID: 2, DPRank: 1}
	lease := testLease(t, "s")
	for _, tc := range []struct {
		name string
		// between runs after the caller read the row and before it moves.
		between func(tab *reservationTable)
		want    index.WorkerKey
		moved   bool
	}{
		{"unchanged row moves", func(*reservationTable) {}, to, true},
		{"row moved by someone else stays", func(tab *reservationTable) {
			r, _ := tab.booked("m")
			tab.move("m", r, index.WorkerKey{WorkerID: 3})
		}, index.WorkerKey{WorkerID: 3}, false},
		{"id booked again stays", func(tab *reservationTable) {
			tab.drop("m")
			tab.install("m", nil, from, nil)
		}, from, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tab reservationTable
			tab.install("m", nil, from, lease)
			read, err := tab.booked("m")
			if err != nil {
				t.Fatal(err)
			}
			tc.between(&tab)
			if got := tab.move("m", read, to); got != tc.moved {
				t.Fatalf("move = %v, want %v", got, tc.moved)
			}
			r, err := tab.booked("m")
			if err != nil || r.worker != tc.want {
				t.Fatalf("row on %v (%v), want %v", r.worker, err, tc.want)
			}
			if tc.moved && r.lease != lease {
				t.Fatal("the moved row lost its session lease")
			}
			if read.worker != from {
				t.Fatal("move modified the row the caller holds")
			}
		})
	}
	t.Run("dropped row is not recreated", func(t *testing.T) {
		var tab reservationTable
		tab.install("m", nil, from, nil)
		read, _ := tab.booked("m")
		tab.drop("m")
		if tab.move("m", read, to) || tab.has("m") {
			t.Fatal("move brought a dropped row back")
		}
	})
}
