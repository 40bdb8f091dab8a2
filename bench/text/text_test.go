package text

import (
	"reflect"
	"strings"
	"testing"
)

// The workload is a function of its seed, and it has the shape it claims:
// shared system prompts, documents quoted across sessions, histories that
// extend the previous turn.
func TestTextWorkloadIsSeededAndShaped(t *testing.T) {
	c := DefaultWorkload()
	c.Sessions = 40
	a, b := Workload(c), Workload(c)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two workloads")
	}
	c.Seed++
	if reflect.DeepEqual(a, Workload(c)) {
		t.Fatal("another seed gave the same workload")
	}
	systems, quoted := map[string]int{}, map[string]int{}
	for _, s := range a {
		if n := len(s.Turns); n < c.Turns[0] || n > c.Turns[1] {
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
	if len(systems) < 2 || len(systems) > c.SystemPrompts {
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

func TestConfigRejectsBadSettings(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"unknown phase":  func(c *Config) { c.Phases = []string{"tokens", "magic"} },
		"no sessions":    func(c *Config) { c.Load.Sessions = 0 },
		"no speed-up":    func(c *Config) { c.Engine.Speedup = 0 },
		"no concurrency": func(c *Config) { c.Concurrency = 0 },
	} {
		c := Defaults()
		change(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
