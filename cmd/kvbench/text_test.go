package main

import (
	"reflect"
	"strings"
	"testing"
)

// The workload is a function of its seed, and it has the shape it claims:
// shared system prompts, documents quoted across sessions, histories that
// extend the previous turn.
func TestTextWorkloadIsSeededAndShaped(t *testing.T) {
	c := defaultTextWorkload()
	c.sessions = 40
	a, b := textWorkload(c), textWorkload(c)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two workloads")
	}
	c.seed++
	if reflect.DeepEqual(a, textWorkload(c)) {
		t.Fatal("another seed gave the same workload")
	}
	systems, quoted := map[string]int{}, map[string]int{}
	for _, s := range a {
		if n := len(s.Turns); n < c.turns[0] || n > c.turns[1] {
			t.Fatalf("session %d has %d turns", s.ID, n)
		}
		systems[s.Turns[0][0].Content]++
		for i, turn := range s.Turns {
			if len(turn) != 2+2*i || turn[len(turn)-1].Role != "user" {
				t.Fatalf("session %d turn %d: %d messages", s.ID, i, len(turn))
			}
			if i > 0 && !reflect.DeepEqual(turn[:len(turn)-2], s.Turns[i-1]) {
				t.Fatalf("session %d turn %d does not extend the previous turn", s.ID, i)
			}
			if u := turn[len(turn)-1].Content; strings.HasPrefix(u, "Read this:\nDocument ") {
				quoted[strings.SplitN(u, ":", 3)[1]]++
			}
		}
	}
	if len(systems) < 2 || len(systems) > c.systemPrompts {
		t.Fatalf("%d distinct system prompts", len(systems))
	}
	shared := 0
	for _, n := range quoted {
		if n > 1 {
			shared++
		}
	}
	if shared == 0 {
		t.Fatalf("no document is quoted twice: %v", quoted)
	}
}

func TestRunTextRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-phases", "tokens,magic"},
		{"-sessions", "0"},
		{"-speedup", "0"},
		{"extra"},
	} {
		var out, errOut strings.Builder
		if err := runText(t.Context(), append(args, "-out", t.TempDir()), &out, &errOut); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}
