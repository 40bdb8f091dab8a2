package affinity

import (
	"strconv"
	"testing"
	"time"
)

func filledTable(b *testing.B, n int) (*Table, []string) {
	tb, err := NewTable(Config{TTL: time.Hour, WriterID: 7}, t0)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "session-" + strconv.Itoa(i)
		h, _, _ := tb.Acquire(t0, ids[i], nil)
		l, _ := h.Commit(t0, rt(uint64(i%16), 0), nil)
		l.Release(t0)
	}
	tb.Events()
	return tb, ids
}

// BenchmarkBoundSessionBooking is one booking of an already bound session in
// a full 65,536-entry table: Acquire, Commit, Release, with replication on.
func BenchmarkBoundSessionBooking(b *testing.B) {
	tb, ids := filledTable(b, DefaultMaxEntries)
	live := func(Target) bool { return true }
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		sid := ids[i%len(ids)]
		h, _, _ := tb.Acquire(t0, sid, live)
		target, _ := h.Target()
		l, err := h.Commit(t0, target, live)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(t0)
		if i%1024 == 0 {
			tb.Events()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/booking")
}

// BenchmarkQuery is the /select lookup on a full table.
func BenchmarkQuery(b *testing.B) {
	tb, ids := filledTable(b, DefaultMaxEntries)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, ok, _ := tb.Query(t0, ids[i%len(ids)]); !ok {
			b.Fatal("unbound")
		}
	}
}
