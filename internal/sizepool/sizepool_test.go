package sizepool

import (
	"runtime"
	"testing"
	"time"
)

func TestGetFitsAndReuses(t *testing.T) {
	tests := []struct {
		name      string
		put       int // capacity put back first; 0: nothing
		get       int
		reuses    bool
		wantCapGE int
	}{
		{"below the threshold is never pooled", 1 << 10, 1 << 10, false, 1 << 10},
		{"the same size comes back", 5_700_000, 5_700_000, true, 5_700_000},
		{"a smaller request takes a larger buffer of its class", 6_000_000, 5_000_000, true, 5_000_000},
		{"a buffer of the class above fits", 9_000_000, 5_000_000, true, 5_000_000},
		{"a buffer too small for the request is not handed out", 4_500_000, 5_000_000, false, 5_000_000},
		{"two classes up is not looked at", 20_000_000, 5_000_000, false, 5_000_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New[byte](64 << 10)
			var kept []byte
			if tt.put > 0 {
				kept = make([]byte, 10, tt.put)
				p.Put(kept)
			}
			b := p.Get(tt.get)
			if len(b) != 0 || cap(b) < tt.wantCapGE {
				t.Fatalf("Get(%d): len %d cap %d, want len 0 and cap >= %d", tt.get, len(b), cap(b), tt.wantCapGE)
			}
			if reused := kept != nil && &b[:1][0] == &kept[:1][0]; reused != tt.reuses {
				t.Errorf("Get(%d) after Put of capacity %d: reused %v, want %v", tt.get, tt.put, reused, tt.reuses)
			}
		})
	}
}

// A class's last keepPerClass buffers wait through collections (long
// prompts seconds apart); one more goes to the sync.Pool, which the
// collector empties.
func TestLastBuffersSurviveCollections(t *testing.T) {
	p := New[uint32](1 << 10)
	var kept [keepPerClass + 1][]uint32
	for i := range kept {
		kept[i] = make([]uint32, 0, 1<<20)
		p.Put(kept[i])
	}
	runtime.GC()
	runtime.GC() // sync.Pool keeps a victim cache through one collection
	for i := range keepPerClass {
		if b := p.Get(1 << 20); &b[:1][0] != &kept[i][:1][0] {
			t.Fatalf("kept buffer %d did not survive two collections", i)
		}
	}
	if v := p.classes[class(1<<20)].Get(); v != nil {
		t.Error("the class's buffer beyond keepPerClass is still held after two collections")
	}
}

// A new buffer is rounded up to an eighth of its class, so a request a
// little larger than the last fits the buffer it gave back.
func TestSlightlyLargerRequestsFit(t *testing.T) {
	p := New[byte](1 << 10)
	b := p.Get(5_700_000)
	if cap(b) < 5_700_000 || cap(b) > 5_700_000+(1<<22)/8 {
		t.Fatalf("Get(5,700,000): cap %d, want at most an eighth of the class more", cap(b))
	}
	p.Put(b)
	if got := p.Get(5_700_100); &got[:1][0] != &b[:1][0] {
		t.Error("a request 100 bytes larger did not get the buffer back")
	}
}

// A pool unused for its hold time lets its last buffers go.
func TestLastBuffersDroppedWhenUnused(t *testing.T) {
	p := New[byte](1 << 10)
	p.holdFor = 20 * time.Millisecond
	p.Put(make([]byte, 0, 1<<16))
	p.Put(make([]byte, 0, 1<<20))
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		held := p.last[class(1<<16)][0] != nil || p.last[class(1<<20)][0] != nil
		p.mu.Unlock()
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the last buffers were still held 10 s after the pool went unused")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// And it keeps working afterwards.
	b := make([]byte, 0, 1<<16)
	p.Put(b)
	if got := p.Get(1 << 16); &got[:1][0] != &b[:1][0] {
		t.Error("a buffer put after the drop was not reused")
	}
}

// The zero value pools every size, and takes empty buffers without
// trouble.
func TestZeroValue(t *testing.T) {
	var p Pool[uint64]
	if b := p.Get(0); cap(b) != 0 {
		t.Errorf("Get(0): cap %d", cap(b))
	}
	p.Put(nil)
	p.Put(make([]uint64, 0))
	b := p.Get(3)
	p.Put(b)
	if got := p.Get(3); &got[:1][0] != &b[:1][0] {
		t.Error("the zero value did not keep a small buffer")
	}
}

func TestClass(t *testing.T) {
	for _, tt := range []struct{ n, want int }{{1, 0}, {2, 1}, {3, 1}, {4, 2}, {65535, 15}, {65536, 16}, {5_700_000, 22}} {
		if got := class(tt.n); got != tt.want {
			t.Errorf("class(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}
