package pending

import (
	"strconv"
	"testing"
	"time"
)

// BenchmarkPutPeekConsumeFull4096 measures one select → replay cycle against a
// cache held at its default 4096-entry cap, so every Put also evicts.
func BenchmarkPutPeekConsumeFull4096(b *testing.B) {
	c, err := New(Config{TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]Key, 8192)
	for i := range keys {
		keys[i] = key("sel-" + strconv.Itoa(i))
	}
	e := pendingEntry(1)
	e.TrackingHashes = make([]uint64, 128)
	now := t0
	for i := range DefaultMaxEntries {
		now = now.Add(time.Microsecond)
		c.Put(now, keys[i], e)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now = now.Add(time.Microsecond)
		k := keys[i%len(keys)]
		c.Put(now, k, e)
		if _, gen, ok := c.Peek(now, k); ok && i%2 == 0 {
			c.Consume(k, gen)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/cycle")
}

// BenchmarkPutSweepsExpired measures Put when each insert sweeps one expired
// entry from the front: steady state of a cache whose selections are never
// replayed.
func BenchmarkPutSweepsExpired(b *testing.B) {
	c, err := New(Config{TTL: time.Millisecond, MaxEntries: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]Key, 4096)
	for i := range keys {
		keys[i] = key("sel-" + strconv.Itoa(i))
	}
	e := pendingEntry(1)
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now = now.Add(time.Microsecond)
		c.Put(now, keys[i%len(keys)], e)
	}
}
