package reservation

import (
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/index"
)

// stored is a BlockStored of blocks (engine hash = public hash) chained to
// parent, on w.
func stored(w index.WorkerKey, parent uint64, hashes ...uint64) *index.Event {
	ev := &index.Event{Worker: w, Kind: index.EventStored, Parent: parent, HasParent: true}
	for _, h := range hashes {
		ev.Blocks = append(ev.Blocks, index.Block{Ext: h, Local: h})
	}
	return ev
}

// begun books id on w with its prompt's last block 7 and firstDecode
// output tokens to its first block of output, keeps it to e, and has its
// engine store block 7 (its first token) at first.
func begun(t *testing.T, tab *Table, id string, w index.WorkerKey, firstDecode uint32, e End, first time.Time) {
	t.Helper()
	row := &Row{Worker: w, LastBlock: 7, LastBlockKnown: true, FirstDecodeBlock: firstDecode}
	tab.Install(id, row)
	if !tab.SetEnd(id, row, e) {
		t.Fatalf("SetEnd(%s) refused", id)
	}
	if got := tab.Stored(nil, w, stored(w, 6, 7).Blocks, first); len(got) != 1 {
		t.Fatalf("Stored = %+v, want %s's first token", got, id)
	}
}

func TestDecodeProgressMovesTheEnd(t *testing.T) {
	const blockSize = 16
	const itl = 20 * time.Millisecond
	now := time.Unix(1_700_000_000, 0)
	w := index.WorkerKey{WorkerID: 1}
	// A 40-token prompt: 2 full blocks (the last is 7), 8 tokens past
	// them, so 8 output tokens complete block 100.
	first := now.Add(100 * time.Millisecond)
	est := End{Start: now, PrefillAt: now.Add(50 * time.Millisecond), At: now.Add(3 * time.Second), Tokens: 10, Limit: 10, ITL: 300 * time.Millisecond}

	t.Run("the pace replaces the prediction", func(t *testing.T) {
		var tab Table
		begun(t, &tab, "a", w, 8, est, first)
		if _, ok := tab.Decoded(nil, stored(w, 6, 99), blockSize, first); ok {
			t.Fatal("a block chained to another parent counted as decode")
		}
		at := first.Add(8 * itl) // the step that computed 8 output tokens' KV
		p, ok := tab.Decoded(nil, stored(w, 7, 100), blockSize, at)
		// 9 tokens sampled of 10: one more step at 20 ms, not 300.
		if want := at.Add(itl); !ok || p.ID != "a" || p.Generated != 8 || !p.Due.Equal(want) {
			t.Fatalf("Decoded = %+v, %v; want a due at %v with 8 tokens", p, ok, want.Sub(now))
		}
		if _, e := tab.Due(at.Add(itl)); len(e) != 1 || e[0] != "a" {
			t.Fatalf("not freed at the end its pace gives: %v", e)
		}
		tab.Release("a", at)
		if tab.Watching() {
			t.Fatal("a freed booking's decode is still watched")
		}
	})

	t.Run("a block at a time, chained", func(t *testing.T) {
		var tab Table
		long := est
		long.Tokens, long.Limit = 100, 0
		begun(t, &tab, "b", w, 8, long, first)
		tab.Decoded(nil, stored(w, 7, 100), blockSize, first.Add(8*itl))
		// The next block holds 16 more: 24 computed, 25 sampled, 75 left
		// at the pace of 24 steps in 24×40 ms (the batch grew).
		at := first.Add(24 * 2 * itl)
		p, ok := tab.Decoded(nil, stored(w, 100, 101), blockSize, at)
		if want := at.Add(75 * 2 * itl); !ok || p.Generated != 24 || !p.Due.Equal(want) {
			t.Fatalf("Decoded = %+v, %v; want 24 tokens, due %v", p, ok, want.Sub(now))
		}
		// Four blocks in one step (speculative decoding): 88 computed.
		at = first.Add(88 * 2 * itl)
		p, _ = tab.Decoded(nil, stored(w, 101, 102, 103, 104, 105), blockSize, at)
		if want := at.Add(11 * 2 * itl); p.Generated != 88 || !p.Due.Equal(want) {
			t.Fatalf("Decoded = %+v; want 88 tokens, due %v", p, want.Sub(now))
		}
		// Past the assumed length: one block more each time.
		at = first.Add(120 * 2 * itl)
		p, _ = tab.Decoded(nil, stored(w, 105, 106, 107), blockSize, at)
		if want := at.Add(16 * 2 * itl); p.Generated != 120 || !p.Due.Equal(want) {
			t.Fatalf("Decoded = %+v; want 120 tokens, due one block on at %v", p, want.Sub(now))
		}
		if _, ok := tab.Decoded(nil, stored(w, 107, 108, 109, 110, 111, 112), blockSize, at); ok {
			t.Fatal("a chain of 5 blocks counted as one step's decode")
		}
	})

	t.Run("too few tokens to pace", func(t *testing.T) {
		var tab Table
		begun(t, &tab, "c", w, 2, est, first)
		before, _ := tab.EndOf("c")
		if p, ok := tab.Decoded(nil, stored(w, 7, 100), blockSize, first.Add(time.Millisecond)); !ok || !p.Due.Equal(before.At) {
			t.Fatalf("2 tokens moved the end: %+v (was %v)", p, before.At.Sub(now))
		}
		// The watch follows the chain all the same.
		if p, ok := tab.Decoded(nil, stored(w, 100, 101), blockSize, first.Add(18*itl)); !ok || p.Generated != 18 {
			t.Fatalf("Decoded = %+v, %v; want 18 tokens", p, ok)
		}
	})

	t.Run("delivered with the first token", func(t *testing.T) {
		// An engine that flushes its events on a timer: the first token
		// and a block of output 2 ms later say nothing of the pace.
		var tab Table
		begun(t, &tab, "d", w, 8, est, first)
		before, _ := tab.EndOf("d")
		if p, ok := tab.Decoded(nil, stored(w, 7, 100), blockSize, first.Add(2*time.Millisecond)); !ok || !p.Due.Equal(before.At) {
			t.Fatalf("Decoded = %+v, %v; want the end left at %v", p, ok, before.At.Sub(now))
		}
	})

	t.Run("stored before the hang-up, two on one prompt", func(t *testing.T) {
		var tab Table
		rowA := &Row{Worker: w, LastBlock: 7, LastBlockKnown: true, FirstDecodeBlock: 8}
		tab.Install("a", rowA)
		tab.Stored(nil, w, stored(w, 6, 7).Blocks, first) // before SetEnd
		tab.SetEnd("a", rowA, est)
		begun(t, &tab, "b", w, 8, est, first.Add(time.Second))
		p, ok := tab.Decoded(nil, stored(w, 7, 200), blockSize, first.Add(8*itl))
		if !ok || p.ID != "a" {
			t.Fatalf("Decoded = %+v, %v; want the older booking a", p, ok)
		}
		p, ok = tab.Decoded(nil, stored(w, 7, 300), blockSize, first.Add(time.Second+8*itl))
		if !ok || p.ID != "b" || !p.Due.Equal(first.Add(time.Second+9*itl)) {
			t.Fatalf("Decoded = %+v, %v; want b at its own pace", p, ok)
		}
		tab.Release("a", now)
		tab.Release("b", now)
		if tab.Watching() || len(tab.decoding) != 0 {
			t.Fatalf("watches left after both were freed: %v", tab.decoding)
		}
	})
}

func TestAwaitedOutputBlockKeepsTheBooking(t *testing.T) {
	const blockSize = 16
	now := time.Unix(1_700_000_000, 0)
	w := index.WorkerKey{WorkerID: 1}
	ms := func(n int) time.Time { return now.Add(time.Duration(n) * time.Millisecond) }
	// 10 tokens predicted at 10 ms; 4 output tokens complete the block
	// after the prompt, so it should come 40 ms after the first token,
	// long before the output's estimated end.
	est := End{Start: now, PrefillAt: ms(50), At: ms(150), Tokens: 10, Limit: 10, ITL: 10 * time.Millisecond, MaxLife: time.Minute}
	start := func(t *testing.T) *Table {
		var tab Table
		begun(t, &tab, "a", w, 4, est, ms(100)) // first token: end at +200 ms
		return &tab
	}
	t.Run("held until the block, then its pace", func(t *testing.T) {
		tab := start(t)
		if _, e := tab.Due(ms(389)); len(e) != 0 {
			t.Fatalf("freed at %v before its first output block or the give-up (+390 ms)", e)
		}
		// The engine runs at 50 ms a token: the block comes at +300 ms.
		p, ok := tab.Decoded(nil, stored(w, 7, 100), blockSize, ms(300))
		if want := ms(300 + 5*50); !ok || !p.Due.Equal(want) {
			t.Fatalf("Decoded = %+v, %v; want due at +550 ms (5 tokens left at 50 ms)", p, ok)
		}
		if _, e := tab.Due(ms(549)); len(e) != 0 {
			t.Fatalf("freed at %v before its paced end", e)
		}
		if _, e := tab.Due(ms(550)); len(e) != 1 {
			t.Fatal("not freed at its paced end")
		}
		if e, _ := tab.EndOf("a"); e.BlockAwaited() {
			t.Fatal("an end that came at its pace reads as a block given up on")
		}
	})
	t.Run("given up", func(t *testing.T) {
		tab := start(t)
		if _, e := tab.Due(ms(390)); len(e) != 1 {
			t.Fatal("not freed when it gave up waiting (+390 ms: 4 × 40 ms, at least 40 + 250)")
		}
		if e, _ := tab.EndOf("a"); !e.BlockAwaited() {
			t.Fatal("a booking freed at the give-up does not read as one")
		}
	})
	t.Run("no block before the end", func(t *testing.T) {
		var tab Table
		begun(t, &tab, "a", w, 10, est, ms(100))
		if _, e := tab.Due(ms(200)); len(e) != 1 {
			t.Fatal("held for a block that completes only with the last token")
		}
	})
}
