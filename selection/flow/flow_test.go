package flow

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)

// drain dispatches every waiting request in the controller's order and
// returns their names.
func drain(c *Controller, names map[*Ticket]string) []string {
	var out []string
	for h := c.Head(); h != nil; h = c.Head() {
		out = append(out, names[h])
		c.Dispatch(h)
	}
	return out
}

type push struct {
	name     string
	priority int
	tenant   string
	cost     int64
}

func pushAll(t *testing.T, c *Controller, ps []push) map[*Ticket]string {
	t.Helper()
	names := map[*Ticket]string{}
	for i, p := range ps {
		tk, err := c.Push(t0.Add(time.Duration(i)*time.Millisecond), Request{Priority: p.priority, Tenant: p.tenant, Cost: p.cost})
		if err != nil {
			t.Fatalf("push %s: %v", p.name, err)
		}
		names[tk] = p.name
	}
	return names
}

// A heavy tenant's long backlog and a light tenant's two short requests that
// arrive after it, under each fairness.
func TestFairnessOrders(t *testing.T) {
	var ps []push
	for i := range 4 {
		ps = append(ps, push{name: fmt.Sprintf("A%d", i+1), tenant: "a", cost: 16})
	}
	ps = append(ps, push{name: "B1", tenant: "b", cost: 1}, push{name: "B2", tenant: "b", cost: 1})
	for _, tc := range []struct {
		f    Fairness
		want string
	}{
		// Cost: A1 (S=0) then B's (S=0, 1) before A2 (S=16).
		{FairnessCost, "A1 B1 B2 A2 A3 A4"},
		// Count: one each in turn.
		{FairnessCount, "A1 B1 A2 B2 A3 A4"},
		{FairnessFIFO, "A1 A2 A3 A4 B1 B2"},
	} {
		t.Run(tc.f.String(), func(t *testing.T) {
			c := New(Config{Fairness: tc.f})
			if got := strings.Join(drain(c, pushAll(t, c, ps)), " "); got != tc.want {
				t.Errorf("order %s, want %s", got, tc.want)
			}
		})
	}
}

// Bands go strictly by priority, highest first; inside a tenant, FIFO.
func TestStrictPriorityAndFIFO(t *testing.T) {
	c := New(Config{})
	names := pushAll(t, c, []push{
		{"low1", 0, "x", 5}, {"high1", 10, "x", 500}, {"low2", 0, "x", 1}, {"neg", -1, "y", 1}, {"high2", 10, "y", 1}, {"high3", 10, "x", 1},
	})
	got := strings.Join(drain(c, names), " ")
	// In band 10, x's high1 (S=0) first, then y's high2 (S=0, later), then x's
	// high3 (S=500).
	if want := "high1 high2 high3 low1 low2 neg"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	if c.Len() != 0 || c.PendingISL() != 0 || len(c.bands) != 0 || c.tenants != 0 || c.idle.Len() != 0 {
		t.Errorf("after the drain: len %d, bands %d, tenants %d, idle %d", c.Len(), len(c.bands), c.tenants, c.idle.Len())
	}
}

// A tenant that empties its queue while the band stays busy keeps its finish
// tag: coming back buys no head start over a tenant that kept waiting.
func TestIdleTenantKeepsItsTag(t *testing.T) {
	c := New(Config{})
	names := pushAll(t, c, []push{{"a1", 0, "a", 100}, {"b1", 0, "b", 10}, {"b2", 0, "b", 10}})
	if h := c.Head(); names[h] != "a1" {
		t.Fatalf("head %s", names[h])
	}
	c.Dispatch(c.Head()) // a: F=100, idle; V=0
	tk, _ := c.Push(t0.Add(time.Second), Request{Tenant: "a", Cost: 1})
	names[tk] = "a2"
	// a2's S = max(V=0, F=100) = 100; b1 S=0, b2 then S=10.
	if got := strings.Join(drain(c, names), " "); got != "b1 b2 a2" {
		t.Errorf("order %s, want b1 b2 a2", got)
	}
}

// An abandoned request charges nobody; a busy period's end forgets every tag.
func TestAbandonChargesNothingAndBusyPeriodsReset(t *testing.T) {
	c := New(Config{})
	names := pushAll(t, c, []push{{"a1", 0, "a", 100}, {"a2", 0, "a", 100}, {"b1", 0, "b", 1}})
	var a1 *Ticket
	for tk, n := range names {
		if n == "a1" {
			a1 = tk
		}
	}
	c.Abandon(a1)
	c.Abandon(a1) // twice is harmless
	// a2 is a's head now with S = max(0, 0) = 0 and arrived before b1.
	if got := strings.Join(drain(c, names), " "); got != "a2 b1" {
		t.Errorf("order %s, want a2 b1", got)
	}
	// The band emptied: a's tag of 100 is forgotten.
	names = pushAll(t, c, []push{{"b2", 0, "b", 1}, {"a3", 0, "a", 1}})
	if got := strings.Join(drain(c, names), " "); got != "b2 a3" {
		t.Errorf("after the reset %s, want b2 a3", got)
	}
}

func TestByteLimits(t *testing.T) {
	c := New(Config{MaxBytes: 100, MaxBandBytes: 60})
	if _, err := c.Push(t0, Request{Bytes: 50}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		r    Request
		frag string
	}{
		{Request{Bytes: 11}, "at priority 0"},
		{Request{Priority: 1, Bytes: 61}, "per-priority limit of 60"},
		{Request{Priority: 1, Bytes: 51}, "limit of 100"},
	} {
		if _, err := c.Push(t0, tc.r); !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), tc.frag) {
			t.Errorf("%+v: %v, want ErrQueueFull naming %q", tc.r, err, tc.frag)
		}
	}
	if c.Len() != 1 || c.bytes != 50 || len(c.bands) != 1 {
		t.Errorf("a refused push changed the queue: %d requests, %d bytes, %d bands", c.Len(), c.bytes, len(c.bands))
	}
	if _, err := c.Push(t0, Request{Priority: 1, Bytes: 50}); err != nil {
		t.Errorf("a push within both limits: %v", err)
	}
}

// The tenant bound: the longest-idle tenant is forgotten (counted); when
// every remembered tenant is waiting, a new one is refused.
func TestTenantBound(t *testing.T) {
	c := New(Config{MaxTenants: 2})
	a, _ := c.Push(t0, Request{Tenant: "a"})
	_, _ = c.Push(t0, Request{Tenant: "b"})
	_, _ = c.Push(t0, Request{Tenant: "b"})
	if _, err := c.Push(t0, Request{Tenant: "c"}); !errors.Is(err, ErrTooManyTenants) {
		t.Fatalf("a third tenant while two wait: %v", err)
	}
	c.Dispatch(a) // a is idle now, the band still busy with b
	if _, err := c.Push(t0, Request{Tenant: "c"}); err != nil {
		t.Fatalf("c after a went idle: %v", err)
	}
	if c.Evicted() != 1 || c.tenants != 2 {
		t.Errorf("evicted %d, tenants %d; want 1 and 2", c.Evicted(), c.tenants)
	}
	if _, ok := c.bands[0].tenants["a"]; ok {
		t.Error("a is still remembered")
	}
}

func TestTTLAndDefaults(t *testing.T) {
	c := New(Config{})
	tk, _ := c.Push(t0, Request{Cost: -5, Bytes: -1})
	if r := tk.Request(); r.Tenant != DefaultTenant || r.Cost != 1 || r.Bytes != 0 {
		t.Errorf("defaults: %+v", r)
	}
	if c.Expired(tk, t0.Add(DefaultTTL-time.Nanosecond)) || !c.Expired(tk, t0.Add(DefaultTTL)) || !c.Deadline(tk).Equal(t0.Add(DefaultTTL)) {
		t.Error("TTL boundaries")
	}
	if err := (Config{TTL: -1, MaxBytes: -1, MaxTenants: -1, Fairness: 9}).Validate(); err == nil || strings.Count(err.Error(), "\n") != 3 {
		t.Errorf("Validate: %v", err)
	}
	for _, s := range []string{"cost", "count", "fifo"} {
		if f, err := ParseFairness(s); err != nil || f.String() != s {
			t.Errorf("ParseFairness(%s) = %v, %v", s, f, err)
		}
	}
	if _, err := ParseFairness("wfq"); err == nil {
		t.Error("ParseFairness accepts wfq")
	}
}

// Expire removes exactly the requests past their TTL, charging nobody.
func TestExpire(t *testing.T) {
	c := New(Config{TTL: 10 * time.Second})
	names := pushAll(t, c, []push{{"a1", 0, "a", 100}, {"b1", 0, "b", 1}})
	late, _ := c.Push(t0.Add(5*time.Second), Request{Tenant: "a", Cost: 1})
	names[late] = "a2"
	if n := c.Expire(t0.Add(10*time.Second + time.Millisecond)); n != 2 || c.Len() != 1 || late.Expired() {
		t.Fatalf("expired %d, %d left, a2 expired %v", n, c.Len(), late.Expired())
	}
	for tk, n := range names {
		if n != "a2" && !tk.Expired() {
			t.Errorf("%s not marked expired", n)
		}
	}
	// a1 charged nothing: a2 starts at 0 and goes first against a new b.
	b2, _ := c.Push(t0.Add(11*time.Second), Request{Tenant: "b", Cost: 1})
	names[b2] = "b2"
	if got := strings.Join(drain(c, names), " "); got != "a2 b2" {
		t.Errorf("order %s, want a2 b2", got)
	}
}

func TestState(t *testing.T) {
	c := New(Config{})
	_, _ = c.Push(t0, Request{Priority: 1, Tenant: "z", Bytes: 3})
	_, _ = c.Push(t0.Add(time.Second), Request{Tenant: "y", Bytes: 4, Cost: 7})
	_, _ = c.Push(t0.Add(time.Second), Request{Tenant: "x", Bytes: 5})
	c.Dispatch(c.Head()) // z
	c.Dispatch(c.Head()) // y: idle, remembered with F=7
	st := c.State(t0.Add(3 * time.Second))
	if st.Queued != 1 || st.QueuedBytes != 5 || st.Tenants != 2 || len(st.Bands) != 1 {
		t.Fatalf("state %+v", st)
	}
	b := st.Bands[0]
	if b.Priority != 0 || len(b.Tenants) != 2 || b.Tenants[0].Tenant != "x" || b.Tenants[0].OldestMS != 2000 ||
		b.Tenants[1].Tenant != "y" || b.Tenants[1].Queued != 0 || b.Tenants[1].FinishTag != 7 {
		t.Errorf("band %+v", b)
	}
}

// Random pushes, dispatches and abandons keep the bookkeeping exact, and the
// order inside each tenant first in, first out.
func TestRandomOperationsKeepInvariants(t *testing.T) {
	for seed := range uint64(20) {
		rnd := rand.New(rand.NewPCG(seed, 1))
		c := New(Config{Fairness: Fairness(seed % 3), MaxTenants: 5, MaxBytes: 400})
		var live []*Ticket
		last := map[string]uint64{} // tenant/priority -> seq of the last dispatched
		for step := range 2000 {
			now := t0.Add(time.Duration(step) * time.Millisecond)
			switch op := rnd.IntN(10); {
			case op < 5:
				r := Request{Priority: rnd.IntN(3) - 1, Tenant: fmt.Sprint(rnd.IntN(8)), Cost: rnd.Int64N(100), Bytes: rnd.Int64N(30), ISL: rnd.IntN(50)}
				if tk, err := c.Push(now, r); err == nil {
					live = append(live, tk)
				} else if !errors.Is(err, ErrQueueFull) && !errors.Is(err, ErrTooManyTenants) {
					t.Fatal(err)
				}
			case op < 8:
				if h := c.Head(); h != nil {
					k := fmt.Sprint(h.req.Priority, "/", h.req.Tenant)
					if s, ok := last[k]; ok && h.seq < s {
						t.Fatalf("seed %d: tenant %s went out of order", seed, k)
					}
					last[k] = h.seq
					c.Dispatch(h)
				}
			default:
				if len(live) > 0 {
					c.Abandon(live[rnd.IntN(len(live))])
				}
			}
			n, bytes, isl := 0, int64(0), 0
			for _, tk := range live {
				if tk.elem != nil {
					n, bytes, isl = n+1, bytes+tk.req.Bytes, isl+tk.req.ISL
				}
			}
			if n != c.Len() || bytes != c.bytes || isl != c.PendingISL() || c.tenants > 5 || bytes > 400 {
				t.Fatalf("seed %d step %d: len %d/%d bytes %d/%d isl %d/%d tenants %d", seed, step, c.Len(), n, c.bytes, bytes, c.PendingISL(), isl, c.tenants)
			}
			if (c.Head() == nil) != (n == 0) {
				t.Fatalf("seed %d step %d: head %v with %d queued", seed, step, c.Head(), n)
			}
		}
	}
}

// BenchmarkPushDispatch is one request through a controller that holds
// tenants × 4 waiting requests: a Push, then the head's Dispatch.
func BenchmarkPushDispatch(b *testing.B) {
	for _, tenants := range []int{1, 100, 10000} {
		b.Run(strconv.Itoa(tenants), func(b *testing.B) {
			c := New(Config{Fairness: FairnessCost})
			now := time.Unix(0, 0)
			names := make([]string, tenants)
			for i := range names {
				names[i] = "t" + strconv.Itoa(i)
				for range 4 {
					if _, err := c.Push(now, Request{Tenant: names[i], Cost: int64(100 + i%1000)}); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := c.Push(now, Request{Tenant: names[i%tenants], Cost: 500}); err != nil {
					b.Fatal(err)
				}
				c.Dispatch(c.Head())
			}
		})
	}
}
