package reservation

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/index"
)

func wantKind(t testing.TB, err error, k apierr.Kind, frag string) {
	t.Helper()
	if err == nil || apierr.KindOf(err) != k || !strings.Contains(err.Error(), frag) {
		t.Fatalf("err = %v (kind %v), want kind %v containing %q", err, apierr.KindOf(err), k, frag)
	}
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
	var tab Table
	if err := tab.Claim("a"); err != nil {
		t.Fatal(err)
	}
	wantKind(t, tab.Claim("a"), apierr.Conflict, "selection a is already reserved or being reserved")
	tab.Install("a", &Row{Worker: index.WorkerKey{WorkerID: 1}})
	wantKind(t, tab.Claim("a"), apierr.Conflict, "already reserved")
	if err := tab.Claim("b"); err != nil {
		t.Fatalf("another id: %v", err)
	}
}

func TestReservationTableUnclaimLeavesBookedRows(t *testing.T) {
	var tab Table
	for _, id := range []string{"claimed", "booked"} {
		if err := tab.Claim(id); err != nil {
			t.Fatal(err)
		}
	}
	tab.Install("booked", &Row{Worker: index.WorkerKey{WorkerID: 2}})
	tab.Unclaim("claimed")
	tab.Unclaim("booked")
	tab.Unclaim("never")
	if tab.Has("claimed") {
		t.Error("unclaim kept a claimed row")
	}
	if r, err := tab.Booked("booked"); err != nil || r.Worker.WorkerID != 2 {
		t.Errorf("unclaim dropped a booked row: %+v, %v", r, err)
	}
	if err := tab.Claim("claimed"); err != nil {
		t.Errorf("an unclaimed id is free again: %v", err)
	}
}

func TestReservationTableClaimedRowsAreNotBooked(t *testing.T) {
	var tab Table
	if err := tab.Claim("in-flight"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"in-flight", "unknown"} {
		_, err := tab.Booked(id)
		wantKind(t, err, apierr.NotFound, "reservation "+id+" not found")
	}
	if _, ok := tab.Drop("in-flight"); ok {
		t.Error("drop took a row whose booking is still in flight")
	}
	if !tab.Has("in-flight") {
		t.Error("drop removed a claimed row")
	}
}

func TestReservationTableDropReturnsTheLeaseOnce(t *testing.T) {
	var tab Table
	lease := testLease(t, "session-1")
	tab.Install("a", &Row{Worker: index.WorkerKey{WorkerID: 1}, Lease: lease})
	tab.Install("b", &Row{Worker: index.WorkerKey{WorkerID: 1}})
	got, ok := tab.Drop("a")
	if !ok || got != lease || got.SessionID() != "session-1" {
		t.Fatalf("first drop: lease %v ok %v, want the installed lease", got, ok)
	}
	if got, ok := tab.Drop("a"); ok || got != nil {
		t.Fatalf("second drop: lease %v ok %v, want nothing", got, ok)
	}
	if _, err := tab.Booked("a"); apierr.KindOf(err) != apierr.NotFound {
		t.Fatalf("dropped row still booked: %v", err)
	}
	if got, ok := tab.Drop("b"); !ok || got != nil {
		t.Fatalf("row without a lease: lease %v ok %v", got, ok)
	}
	if tab.Len() != 0 {
		t.Fatalf("%d rows left", tab.Len())
	}
}

func TestReservationTableMovesOnlyTheRowTheCallerRead(t *testing.T) {
	from, to := index.WorkerKey{WorkerID: 1}, index.WorkerKey{WorkerID: 2, DPRank: 1}
	lease := testLease(t, "s")
	for _, tc := range []struct {
		name string
		// between runs after the caller read the row and before it moves.
		between func(tab *Table)
		want    index.WorkerKey
		moved   bool
	}{
		{"unchanged row moves", func(*Table) {}, to, true},
		{"row moved by someone else stays", func(tab *Table) {
			r, _ := tab.Booked("m")
			tab.Move("m", r, index.WorkerKey{WorkerID: 3})
		}, index.WorkerKey{WorkerID: 3}, false},
		{"id booked again stays", func(tab *Table) {
			tab.Drop("m")
			tab.Install("m", &Row{Worker: from})
		}, from, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tab Table
			tab.Install("m", &Row{Worker: from, Lease: lease})
			read, err := tab.Booked("m")
			if err != nil {
				t.Fatal(err)
			}
			tc.between(&tab)
			if got := tab.Move("m", read, to); got != tc.moved {
				t.Fatalf("move = %v, want %v", got, tc.moved)
			}
			r, err := tab.Booked("m")
			if err != nil || r.Worker != tc.want {
				t.Fatalf("row on %v (%v), want %v", r.Worker, err, tc.want)
			}
			if tc.moved && r.Lease != lease {
				t.Fatal("the moved row lost its session lease")
			}
			if read.Worker != from {
				t.Fatal("move modified the row the caller holds")
			}
		})
	}
	t.Run("dropped row is not recreated", func(t *testing.T) {
		var tab Table
		tab.Install("m", &Row{Worker: from})
		read, _ := tab.Booked("m")
		tab.Drop("m")
		if tab.Move("m", read, to) || tab.Has("m") {
			t.Fatal("move brought a dropped row back")
		}
	})
}

func TestReservationTableEstimatedEnds(t *testing.T) {
	var tab Table
	now := time.Unix(1_700_000_000, 0)
	row := &Row{Worker: index.WorkerKey{WorkerID: 1}}
	tab.Install("a", row)
	if tab.SetEnd("a", &Row{}, End{At: now}) {
		t.Fatal("set an end on a row other than the one read")
	}
	if !tab.SetEnd("a", row, End{PrefillAt: now.Add(time.Second), At: now.Add(time.Minute)}) {
		t.Fatal("set no end on the current row")
	}
	if tab.SetEnd("a", row, End{At: now}) {
		t.Fatal("replaced an estimated end")
	}
	if p, e := tab.Due(now); len(p)+len(e) != 0 {
		t.Fatalf("due before anything is: %v %v", p, e)
	}
	// A move keeps the end: the booking is the same request.
	if !tab.Move("a", row, index.WorkerKey{WorkerID: 2}) {
		t.Fatal("move failed")
	}
	if p, e := tab.Due(now.Add(time.Second)); len(p) != 1 || len(e) != 0 {
		t.Fatalf("at the first token: prefill %v, ended %v", p, e)
	}
	if p, _ := tab.Due(now.Add(2 * time.Second)); len(p) != 0 {
		t.Fatalf("a prefill came due twice: %v", p)
	}
	if _, e := tab.Due(now.Add(time.Minute)); len(e) != 1 || e[0] != "a" {
		t.Fatalf("at the end: ended %v", e)
	}
	tab.Release("a", now)
	if tab.Ending() != 0 {
		t.Fatal("a released row is still ending")
	}
}

// TestDueReadsEstimatedEndsInOrder: ends come due in the order of their
// instants whatever the order they were set in, NextDue names the next one,
// and rows freed or moved before their instant leave nothing due and a
// queue no larger than twice the live ends.
func TestDueReadsEstimatedEndsInOrder(t *testing.T) {
	var tab Table
	now := time.Unix(1_700_000_000, 0)
	if _, ok := tab.NextDue(); ok {
		t.Fatal("something due in an empty table")
	}
	const n = 200
	ends := make([]time.Time, n)
	for i := range n {
		id := fmt.Sprintf("r%03d", i)
		row := &Row{Worker: index.WorkerKey{WorkerID: 1}}
		tab.Install(id, row)
		// Spread, not in id order: i*37 mod n milliseconds.
		ends[i] = now.Add(time.Duration((i*37)%n+1) * time.Millisecond)
		if !tab.SetEnd(id, row, End{PrefillAt: ends[i], At: ends[i]}) {
			t.Fatal("set no end")
		}
	}
	if next, ok := tab.NextDue(); !ok || !next.Equal(now.Add(time.Millisecond)) {
		t.Fatalf("next due = %v, %v; want the earliest end", next, ok)
	}
	// Free every other row before anything is due: their instants pass
	// without a trace, and the queue is rebuilt rather than kept whole.
	for i := 0; i < n; i += 2 {
		tab.Release(fmt.Sprintf("r%03d", i), now)
	}
	var got []string
	for step := 1; step <= n; step++ {
		_, ended := tab.Due(now.Add(time.Duration(step) * time.Millisecond))
		got = append(got, ended...)
	}
	if len(got) != n/2 {
		t.Fatalf("%d ends due, want %d", len(got), n/2)
	}
	for k := 1; k < len(got); k++ {
		var a, b int
		fmt.Sscanf(got[k-1], "r%03d", &a)
		fmt.Sscanf(got[k], "r%03d", &b)
		if a%2 == 0 || ends[a].After(ends[b]) {
			t.Fatalf("due out of order or freed: %s (%v) before %s (%v)", got[k-1], ends[a], got[k], ends[b])
		}
	}
	if len(tab.due) > 2*len(tab.ending)+64 {
		t.Fatalf("queue holds %d instants for %d ends", len(tab.due), len(tab.ending))
	}
}

func TestStoredMovesTheEnd(t *testing.T) {
	var tab Table
	now := time.Unix(1_700_000_000, 0)
	w := index.WorkerKey{WorkerID: 1}
	blocks := func(bs ...uint64) []index.Block {
		out := make([]index.Block, len(bs))
		for i, b := range bs {
			out[i] = index.Block{Ext: b, Local: b}
		}
		return out
	}
	row := &Row{Worker: w, LastBlock: 7, LastBlockKnown: true}
	tab.Install("a", row)
	if !tab.Watching() || tab.Watches() != 1 {
		t.Fatal("a row naming its last block is not watched")
	}
	tab.SetEnd("a", row, End{Start: now, PrefillAt: now.Add(100 * time.Millisecond), At: now.Add(300 * time.Millisecond)})
	if got := tab.Stored(nil, w, blocks(1, 2), now); len(got) != 0 {
		t.Fatalf("other blocks began %v", got)
	}
	// Seen 400 ms late: the end moves 400 ms, the prefill is for the
	// caller to complete (the estimate had not done it).
	got := tab.Stored(nil, w, blocks(6, 7), now.Add(500*time.Millisecond))
	if len(got) != 1 || got[0].ID != "a" || !got[0].Began || !got[0].Due.Equal(now.Add(700*time.Millisecond)) {
		t.Fatalf("Stored = %+v; want a's end at +700ms, its prefill to complete", got)
	}
	if tab.Watching() {
		t.Fatal("still watched once seen")
	}
	if p, e := tab.Due(now.Add(699 * time.Millisecond)); len(p)+len(e) != 0 {
		t.Fatalf("due before the moved end: %v %v (the old instants are stale)", p, e)
	}
	if _, e := tab.Due(now.Add(700 * time.Millisecond)); len(e) != 1 {
		t.Fatalf("not due at the moved end: %v", e)
	}

	// Never past start + the cap.
	rowB := &Row{Worker: w, LastBlock: 8, LastBlockKnown: true}
	tab.Install("b", rowB)
	tab.SetEnd("b", rowB, End{Start: now, PrefillAt: now.Add(100 * time.Millisecond), At: now.Add(900 * time.Millisecond), MaxLife: time.Second})
	if got := tab.Stored(nil, w, blocks(8), now.Add(800*time.Millisecond)); len(got) != 1 || !got[0].Due.Equal(now.Add(time.Second)) {
		t.Fatalf("Stored = %+v, want the end at the 1 s cap", got)
	}

	// Awaited: due at Await until seen, then at the moved end.
	rowC := &Row{Worker: w, LastBlock: 9, LastBlockKnown: true}
	tab.Install("c", rowC)
	tab.SetEnd("c", rowC, End{Start: now, PrefillAt: now.Add(100 * time.Millisecond), At: now.Add(200 * time.Millisecond), Await: now.Add(5 * time.Second)})
	if _, e := tab.Due(now.Add(4 * time.Second)); slices.Contains(e, "c") {
		t.Fatal("an awaited end came due at its estimate")
	}
	if got := tab.Stored(nil, w, blocks(9), now.Add(4*time.Second)); len(got) != 1 || !got[0].Due.Equal(now.Add(4100*time.Millisecond)) {
		t.Fatalf("Stored = %+v, want the end 100 ms (its decode) after the first token", got)
	}
	// A long prompt's store is read a chunk at a time: a block past the
	// first chunks is found all the same.
	rowD := &Row{Worker: w, LastBlock: 1_000_500, LastBlockKnown: true}
	tab.Install("d", rowD)
	tab.SetEnd("d", rowD, End{Start: now, PrefillAt: now.Add(5 * time.Second), At: now.Add(6 * time.Second)})
	long := make([]uint64, 3*storedChunk)
	for i := range long {
		long[i] = 1_000_000 + uint64(i)
	}
	if got := tab.Stored(nil, w, blocks(long...), now.Add(5*time.Second)); len(got) != 1 || got[0].ID != "d" {
		t.Fatalf("Stored = %+v over %d blocks, want d's first token", got, len(long))
	}
	if !tab.StoresWithin(nil, w, now.Add(4*time.Second)) || tab.StoresWithin(nil, index.WorkerKey{WorkerID: 2}, now) {
		t.Fatal("StoresWithin does not follow the stores")
	}
	tab.ForgetStores(now.Add(time.Hour))
	if tab.StoresWithin(nil, w, now) {
		t.Fatal("a forgotten rank still stores")
	}
}
