package discovery

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvselect/kvselect/selection/catalog"
)

// BenchmarkApplyConverged1000 is the cost of a snapshot that changes nothing
// (the common case: a pod event that leaves every worker as it was).
func BenchmarkApplyConverged1000(b *testing.B) {
	svc := newService(b)
	r := NewReconciler(svc, Options{Logger: quiet})
	ws := make([]catalog.Record, 1000)
	for i := range ws {
		ws[i] = rec(uint64(i+1), fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250))
	}
	snap := Snapshot{Workers: ws, State: State{Ready: true}}
	if _, err := r.Apply(context.Background(), snap); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := r.Apply(context.Background(), snap)
		if err != nil || res.Unchanged != 1000 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkApplyOneChanged1000: one worker of 1,000 changes its endpoint.
func BenchmarkApplyOneChanged1000(b *testing.B) {
	svc := newService(b)
	r := NewReconciler(svc, Options{Logger: quiet})
	ws := make([]catalog.Record, 1000)
	for i := range ws {
		ws[i] = rec(uint64(i+1), fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250))
	}
	if _, err := r.Apply(context.Background(), Snapshot{Workers: ws, State: State{Ready: true}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		ws[0] = rec(1, fmt.Sprintf("http://10.9.9.9:%d", 1000+i%2))
		res, err := r.Apply(context.Background(), Snapshot{Workers: ws, State: State{Ready: true}})
		if err != nil || res.Upserted != 1 {
			b.Fatal(res, err)
		}
	}
}
