package replicas

import (
	"context"
	"testing"
	"time"
)

// TestRunCompletes runs both modes briefly: the harness books, mirrors (with
// sync) and samples. The figures themselves are measurements, not asserted.
func TestRunCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock experiment")
	}
	for _, sync := range []bool{false, true} {
		res, err := Run(context.Background(), Config{Duration: 300 * time.Millisecond, Clients: 2, Sync: sync})
		if err != nil {
			t.Fatal(err)
		}
		if res.Bookings == 0 || res.Samples == 0 || res.RequestsMaxOverMean < 1 {
			t.Fatalf("sync=%v: %+v", sync, res)
		}
		if sync != (res.Mirrored > 0) {
			t.Fatalf("sync=%v but %d mirrored events", sync, res.Mirrored)
		}
	}
}

func TestSpread(t *testing.T) {
	for _, c := range []struct {
		xs     []float64
		mm, cv float64
		ok     bool
	}{
		{[]float64{1, 1, 1, 1}, 1, 0, true},
		{[]float64{4, 0, 0, 0}, 4, 1.7320508075688772, true},
		{[]float64{0, 0}, 0, 0, false},
	} {
		mm, cv, ok := spread(c.xs)
		if ok != c.ok || mm != c.mm || cv != c.cv {
			t.Errorf("spread(%v) = %v %v %v, want %v %v %v", c.xs, mm, cv, ok, c.mm, c.cv, c.ok)
		}
	}
}
