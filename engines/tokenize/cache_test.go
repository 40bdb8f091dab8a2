package tokenize

import (
	"testing"

	"github.com/zeebo/xxh3"
)

func TestCacheEvictsLeastRecentlyUsedWithinItsTokenBudget(t *testing.T) {
	c := newCache(10)
	k := func(i int) key { return xxh3.Hash128([]byte{byte(i)}) }
	c.put(k(1), make([]uint32, 4))
	c.put(k(2), make([]uint32, 4))
	if _, ok := c.get(k(1)); !ok { // 1 is now the most recent
		t.Fatal("entry 1 missing")
	}
	c.put(k(3), make([]uint32, 4)) // 12 > 10: the least recent, 2, goes
	if _, ok := c.get(k(2)); ok {
		t.Fatal("entry 2 survived past the budget")
	}
	for _, i := range []int{1, 3} {
		if _, ok := c.get(k(i)); !ok {
			t.Fatalf("entry %d evicted", i)
		}
	}
	c.put(k(4), make([]uint32, 11)) // larger than the whole cache: not kept
	if _, ok := c.get(k(4)); ok {
		t.Fatal("an entry over the budget was kept")
	}
	if j, _ := c.longest([]key{k(1), k(9), k(3), k(8)}); j != 2 {
		t.Fatalf("longest cached prefix at %d, want 2", j)
	}
	if n, tokens := c.size(); n != 2 || tokens != 8 {
		t.Fatalf("size %d entries, %d tokens", n, tokens)
	}
}
