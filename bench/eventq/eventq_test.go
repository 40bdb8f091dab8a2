package eventq

import (
	"slices"
	"testing"
	"time"
)

func TestTimeOrderWithTiesInPushOrder(t *testing.T) {
	var q Queue[string]
	if _, ok := q.Next(); ok {
		t.Fatal("an empty queue has a next event")
	}
	for _, e := range []struct {
		at time.Duration
		ev string
	}{{3, "c1"}, {1, "a1"}, {3, "c2"}, {2, "b"}, {1, "a2"}, {3, "c3"}} {
		q.Push(e.at, e.ev)
	}
	if at, ok := q.Next(); !ok || at != 1 {
		t.Fatalf("Next = %v %v, want 1", at, ok)
	}
	var got []string
	for q.Len() > 0 {
		got = append(got, q.Pop())
	}
	if want := []string{"a1", "a2", "b", "c1", "c2", "c3"}; !slices.Equal(got, want) {
		t.Errorf("popped %v, want %v", got, want)
	}
}

func TestPushWhilePopping(t *testing.T) {
	var q Queue[int]
	q.Push(5, 1)
	q.Push(5, 2)
	first := q.Pop()
	q.Push(5, 3) // same time, pushed later: after 2
	q.Push(4, 4)
	got := []int{first}
	for q.Len() > 0 {
		got = append(got, q.Pop())
	}
	if want := []int{1, 4, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("popped %v, want %v", got, want)
	}
}
