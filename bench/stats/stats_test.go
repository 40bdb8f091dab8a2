package stats

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	vals := []int64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	for _, tc := range []struct {
		vals []int64
		q    float64
		want int64
	}{
		{vals, 0.50, 60},
		{vals, 0.90, 100},
		{vals, 0.99, 100},
		{vals, 1, 100},
		{vals, 0.01, 10},
		{vals, 0, 10},
		{vals, 0.45, 50}, // 4.5: the nearest rank
		{[]int64{7}, 0.5, 7},
		{nil, 0.99, 0},
	} {
		if got := SortedQuantile(tc.vals, tc.q); got != tc.want {
			t.Errorf("SortedQuantile(%v, %v) = %d, want %d", tc.vals, tc.q, got, tc.want)
		}
		shuffled := slices.Clone(tc.vals)
		slices.Reverse(shuffled)
		before := slices.Clone(shuffled)
		if got := Quantile(shuffled, tc.q); got != tc.want {
			t.Errorf("Quantile(%v, %v) = %d, want %d", shuffled, tc.q, got, tc.want)
		}
		if !slices.Equal(shuffled, before) {
			t.Errorf("Quantile reordered its samples: %v", shuffled)
		}
	}
	if got := Quantile([]time.Duration{3 * time.Second, time.Second, 2 * time.Second}, 0.5); got != 2*time.Second {
		t.Errorf("median of durations = %v", got)
	}
}

func TestCV(t *testing.T) {
	for _, tc := range []struct {
		n    []int
		want float64
	}{
		{[]int{5, 5, 5}, 0},
		{[]int{0, 10}, 1},
		{[]int{2, 4, 6}, math.Sqrt(8.0/3) / 4},
		{nil, 0},
		{[]int{0, 0}, 0},
	} {
		if got := CV(tc.n); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("CV(%v) = %v, want %v", tc.n, got, tc.want)
		}
	}
}
