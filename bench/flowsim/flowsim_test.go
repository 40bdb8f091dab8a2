package flowsim

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

var bg = context.Background()

// small is a short run of the default scenario.
func small() Config {
	c := DefaultConfig()
	c.Duration = 30 * time.Second
	return c
}

func run(t *testing.T, c Config, mode string) Result {
	t.Helper()
	r, err := Run(bg, c, mode) // fails on any request unaccounted for
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Every request sent is finished, expired or shed, in every mode, also
// when the queue overflows its TTL.
func TestEveryRequestAccountedFor(t *testing.T) {
	over := small()
	over.Classes[0].Rate *= 1.5
	over.TTL = 3 * time.Second
	for _, c := range []Config{small(), over} {
		for _, mode := range Modes {
			r := run(t, c, mode)
			for _, tr := range r.Tenants {
				if tr.Sent == 0 || tr.Finished+tr.Expired+tr.Shed != tr.Sent {
					t.Fatalf("%s: %+v", mode, tr)
				}
				if tr.WaitMax > float64(c.TTL/time.Millisecond) {
					t.Fatalf("%s: %s waited %.1f ms, longer than the TTL", mode, tr.Tenant, tr.WaitMax)
				}
				if tr.Priority < 0 && tr.Finished > 0 && tr.WaitMax > 0 {
					t.Fatalf("%s: a sheddable request waited: %+v", mode, tr)
				}
			}
		}
		if r := run(t, over, "cost"); r.Tenant("A").Expired == 0 {
			t.Fatalf("the overloaded run expired nothing: %+v", r.Tenants)
		}
	}
}

// On the saturated pool, fairness serves the short-prompt tenant before the
// queue of long prompts: its p90 wait and TTFT drop well below FIFO's,
// while the pool stays busy.
func TestFairnessProtectsTheSmallTenant(t *testing.T) {
	c := small()
	off, count, cost := run(t, c, "off"), run(t, c, "count"), run(t, c, "cost")
	for _, r := range []Result{count, cost} {
		if b, fifo := r.Tenant("B"), off.Tenant("B"); !(b.WaitP90*2 < fifo.WaitP90) || !(b.TTFTP90 < fifo.TTFTP90) {
			t.Errorf("%s: B waits p90 %.1f ms / TTFT %.1f ms, FIFO %.1f / %.1f", r.Mode, b.WaitP90, b.TTFTP90, fifo.WaitP90, fifo.TTFTP90)
		}
		if r.Utilisation < 0.9 {
			t.Errorf("%s: utilisation %.3f", r.Mode, r.Utilisation)
		}
	}
}

// Same seed, same result; another seed, other arrivals.
func TestDeterministic(t *testing.T) {
	c := small()
	a, b := run(t, c, "cost"), run(t, c, "cost")
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs differ:\n%+v\n%+v", a, b)
	}
	c.Seed++
	if d := run(t, c, "cost"); reflect.DeepEqual(a, d) {
		t.Fatal("another seed gave the same run")
	}
}

// One request alone: its TTFT is the model's arithmetic — its prompt in
// chunks, each step a decode step plus the chunk's prefill time.
func TestSingleRequestTTFT(t *testing.T) {
	c := DefaultConfig()
	c.Classes = []Class{{Tenant: "x", Rate: 0.01, PromptTokens: 5000, OutputTokens: 3}}
	c.Duration = 200 * time.Second // about two requests, far apart
	r := run(t, c, "cost")
	// 5000 tokens in chunks of 2048: 3 steps, 30 ms of decode steps and
	// 5000 × 50 µs of prefill.
	want := float64((3*c.DecodeStep + 5000*c.PrefillPerToken) / time.Microsecond)
	if got := r.Tenant("x").TTFTP90 * 1000; got != want || r.Tenant("x").Finished == 0 {
		t.Fatalf("TTFT %.0f µs, want %.0f: %+v", got, want, r.Tenants)
	}
}

func TestValidate(t *testing.T) {
	c := DefaultConfig()
	c.Workers = 0
	c.Classes[1].PromptTokens = 0
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "workers") || !strings.Contains(err.Error(), `class "B"`) {
		t.Fatalf("err %v", err)
	}
	if _, err := Run(bg, DefaultConfig(), "wfq"); err == nil {
		t.Fatal("unknown mode accepted")
	}
}
