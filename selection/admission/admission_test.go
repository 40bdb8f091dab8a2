package admission

import (
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/scheduler"
)

var (
	key = index.Partition{Model: "m", RoutingGroup: "default"}
	t0  = time.Unix(1_700_000_000, 0)
)

func clockAt(t time.Time) func() time.Time { return func() time.Time { return t } }

func TestQueueOrdersByStrictPriority(t *testing.T) {
	q := New(key, "model=m routing_group=default", scheduler.FCFS, nil, t0)
	low, _, err := q.Enqueue(&Request{}, 10, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	high, _, err := q.Enqueue(&Request{StrictPriority: 2}, 10, 0, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !q.IsHead(high) || q.IsHead(low) {
		t.Fatal("the strict-priority waiter is not the head")
	}
	if n, isl := q.Pending(); n != 2 || isl != 20 {
		t.Fatalf("pending %d waiters, %d tokens", n, isl)
	}
	changed := q.Changed()
	high.Dispatch()
	if _, reported := q.Leave(high, clockAt(t0)); reported {
		t.Fatal("a waiter without flow control reported a flow event")
	}
	select {
	case <-changed:
	default:
		t.Fatal("leaving did not wake the others")
	}
	if !q.IsHead(low) || q.Len() != 1 {
		t.Fatal("the other waiter is not the head after the first left")
	}
}

func TestFlowControlShedsRejectsAndExpires(t *testing.T) {
	cfg := flow.Config{TTL: 10 * time.Second, MaxBytes: 100}.WithDefaults()
	q := New(key, "model=m routing_group=default", scheduler.FCFS, &cfg, t0)
	prio := -1
	sheddable := &Request{Priority: &prio, Tenant: "a"}
	if !q.Sheddable(sheddable) || q.Sheddable(&Request{}) {
		t.Fatal("only a negative priority is sheddable")
	}
	ev, err := q.ShedError(sheddable, 10)
	if apierr.KindOf(err) != apierr.Overloaded || !strings.Contains(err.Error(), "every worker of model=m routing_group=default is busy") ||
		ev.Outcome != Shed || ev.Tenant != "a" || ev.Model != "m" {
		t.Fatalf("shed: %v, %+v", err, ev)
	}

	w, _, err := q.Enqueue(&Request{Bytes: 60}, 10, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	_, rejected, err := q.Enqueue(&Request{Bytes: 60}, 10, 0, t0)
	if apierr.KindOf(err) != apierr.Overloaded || rejected == nil || rejected.Outcome != Rejected || rejected.Tenant != flow.DefaultTenant {
		t.Fatalf("over the byte limit: %v, %+v", err, rejected)
	}

	if err := q.CheckExpired(w, t0.Add(5*time.Second)); err != nil {
		t.Fatalf("expired before its TTL: %v", err)
	}
	err = q.CheckExpired(w, t0.Add(10*time.Second))
	if apierr.KindOf(err) != apierr.Overloaded || !strings.Contains(err.Error(), "queue TTL") {
		t.Fatalf("past its TTL: %v", err)
	}
	ev, reported := q.Leave(w, clockAt(t0.Add(10*time.Second)))
	if !reported || ev.Outcome != Expired || ev.Wait != 10*time.Second {
		t.Fatalf("leaving after the TTL: %+v (reported %v)", ev, reported)
	}
}

func TestCheckFields(t *testing.T) {
	big := flow.MaxPriority + 1
	for _, tc := range []struct {
		name     string
		priority *int
		tenant   string
		frag     string
	}{
		{"fine", nil, "team-a", ""},
		{"priority out of range", &big, "", "out of range"},
		{"tenant too long", nil, strings.Repeat("x", flow.MaxTenantLen+1), "bytes long"},
		{"tenant not UTF-8", nil, "\xff", "not valid UTF-8"},
		{"tenant with a control character", nil, "a\nb", "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckFields(tc.priority, tc.tenant)
			if tc.frag == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if apierr.KindOf(err) != apierr.BadRequest || !strings.Contains(err.Error(), tc.frag) {
				t.Fatalf("err %v, want a bad request containing %q", err, tc.frag)
			}
		})
	}
}
