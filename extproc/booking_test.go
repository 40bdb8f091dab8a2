package extproc

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// freeRecorder is a real selection.Service whose Free calls are recorded and
// can be made to fail. The Service fails a Free only with not-found and does
// not look at the context, so a failure of another kind, and the context a
// free runs on, can only be seen here.
type freeRecorder struct {
	*selection.Service
	fail  error // returned instead of freeing, when set
	calls []freeCall
}

type freeCall struct {
	id          string
	ctxErr      error // the context's error when the free ran
	hasDeadline bool
}

func (r *freeRecorder) Free(ctx context.Context, id string) error {
	_, dl := ctx.Deadline()
	r.calls = append(r.calls, freeCall{id: id, ctxErr: ctx.Err(), hasDeadline: dl})
	if r.fail != nil {
		return r.fail
	}
	return r.Service.Free(ctx, id)
}

func (r *freeRecorder) freesOf(id string) int {
	n := 0
	for _, c := range r.calls {
		if c.id == id {
			n++
		}
	}
	return n
}

// bookingBed is one worker in a real selection.Service on a clock the test
// moves, and the metrics and log a booking reports to.
type bookingBed struct {
	core   *freeRecorder
	router routerconfig.Config
	now    time.Time
	m      *metrics
	logs   bytes.Buffer
}

var bookingWorker = catalog.Record{WorkerID: 1, ModelName: "llama", Endpoint: new("http://10.0.0.1:8000"), BlockSize: new(uint32(4))}

func newBookingBed(t *testing.T) *bookingBed {
	t.Helper()
	b := &bookingBed{router: routerconfig.Default(), now: time.Unix(1_700_000_000, 0), m: newMetrics()}
	b.router.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: b.router, Rand: rand.New(rand.NewPCG(1, 1)),
		Clock: func() time.Time { return b.now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.UpsertWorker(context.Background(), bookingWorker); err != nil {
		t.Fatal(err)
	}
	b.core = &freeRecorder{Service: svc}
	return b
}

// book reserves id on the worker, as a pick does.
func (b *bookingBed) book(t *testing.T, id string) {
	t.Helper()
	req := &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"}, SelectionID: &id}
	req.TokenIDs = []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	if _, err := b.core.SelectAndReserve(context.Background(), req); err != nil {
		t.Fatal(err)
	}
}

// booking is the stream side of a reservation the bed made under id.
func (b *bookingBed) booking(t *testing.T, id string) *booking {
	t.Helper()
	b.book(t, id)
	bk := &booking{core: b.core, m: b.m, log: slog.New(slog.NewTextHandler(&b.logs, nil))}
	bk.booked(id, int(*bookingWorker.BlockSize))
	return bk
}

// active is the number of bookings the core holds.
func (b *bookingBed) active() int {
	n := 0
	for _, ml := range b.core.Inspect().Loads(nil, nil) {
		for _, l := range ml.Loads {
			n += int(l.ActiveRequests)
		}
	}
	return n
}

// expire moves the clock past the active-request expiry and runs the core's
// upkeep, which reclaims every booking made before.
func (b *bookingBed) expire(t *testing.T) {
	t.Helper()
	b.now = b.now.Add(b.router.ActiveRequestExpiry + time.Second)
	b.core.Maintain(context.Background())
}

// A booking is freed exactly once, whatever happened to it: at the response
// end or else at the stream end, never both; not at all once the core has
// dropped it (counted lost instead); and a free that fails is logged, not
// retried. A second booking on the same worker (the neighbour) shows that
// nothing else is ever freed.
func TestBookingIsFreedExactlyOnce(t *testing.T) {
	errReplica := &selection.Error{Kind: selection.KindInternal, Message: "replica link down"}
	cases := []struct {
		name string
		// gone runs after the pick: what the core did to the booking meanwhile.
		gone         func(t *testing.T, b *bookingBed, bk *booking)
		failFree     error
		responseEnds bool

		wantFrees                        int
		wantAtEnd, wantAtStreamEnd, lost uint64
		wantLive                         bool // the booking is still in the core at the end
		wantLog                          string
	}{
		{name: "freed at the response end and not again at the stream end", responseEnds: true,
			wantFrees: 1, wantAtEnd: 1},
		{name: "freed at the stream end when the response never ended",
			wantFrees: 1, wantAtStreamEnd: 1},
		{name: "expired in the core: the stream end counts it lost and frees nothing",
			gone:      func(t *testing.T, b *bookingBed, _ *booking) { b.expire(t) },
			wantFrees: 1, lost: 1},
		{name: "its worker removed: the stream end counts it lost and frees nothing",
			gone: func(t *testing.T, b *bookingBed, _ *booking) {
				if _, err := b.core.DeleteWorker(context.Background(), bookingWorker.WorkerID); err != nil {
					t.Fatal(err)
				}
				if _, err := b.core.UpsertWorker(context.Background(), bookingWorker); err != nil {
					t.Fatal(err)
				}
			},
			wantFrees: 1, lost: 1},
		{name: "found gone by the prefill update: lost once, no free at the response end or the stream end",
			gone: func(t *testing.T, b *bookingBed, bk *booking) {
				b.expire(t)
				bk.prefillComplete(context.Background(), true)
			},
			responseEnds: true, wantFrees: 0, lost: 1},
		{name: "found gone by an output update: lost once, no free",
			gone: func(t *testing.T, b *bookingBed, bk *booking) {
				b.expire(t)
				bk.outputTokens(context.Background(), 8)
			},
			wantFrees: 0, lost: 1},
		{name: "a free failing otherwise is logged and not retried at the stream end",
			failFree: errReplica, responseEnds: true,
			wantFrees: 1, wantLive: true, wantLog: "extproc: free failed"},
		{name: "a free failing at the stream end is logged",
			failFree:  errReplica,
			wantFrees: 1, wantLive: true, wantLog: "extproc: free failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBookingBed(t)
			bk := b.booking(t, "req")
			if tc.gone != nil {
				tc.gone(t, b, bk)
			}
			b.book(t, "neighbour")
			b.core.fail = tc.failFree

			stream, cancel := context.WithCancel(context.Background())
			if tc.responseEnds {
				bk.responseEnd(stream)
			}
			cancel() // Envoy resets every stream it ends
			bk.streamEnd(stream)
			bk.streamEnd(stream) // a second end changes nothing

			if got := b.core.freesOf("req"); got != tc.wantFrees {
				t.Errorf("Free called %d times, want %d", got, tc.wantFrees)
			}
			if b.core.freesOf("neighbour") != 0 {
				t.Error("the neighbour booking was freed")
			}
			if at, se, l := b.m.freedAtEnd.Load(), b.m.freedAtStreamEnd.Load(), b.m.lost.Load(); at != tc.wantAtEnd || se != tc.wantAtStreamEnd || l != tc.lost {
				t.Errorf("freed at response end %d, at stream end %d, lost %d; want %d, %d, %d",
					at, se, l, tc.wantAtEnd, tc.wantAtStreamEnd, tc.lost)
			}
			wantActive := 1 // the neighbour
			if tc.wantLive {
				wantActive++
			}
			if got := b.active(); got != wantActive {
				t.Errorf("%d bookings left in the core, want %d", got, wantActive)
			}
			logs := b.logs.String()
			if tc.wantLog == "" && logs != "" {
				t.Errorf("unexpected log output: %s", logs)
			}
			if tc.wantLog != "" && (!strings.Contains(logs, tc.wantLog) || !strings.Contains(logs, "selection_id=req")) {
				t.Errorf("log %q does not report %q for the booking", logs, tc.wantLog)
			}
			for _, c := range b.core.calls {
				if c.ctxErr != nil {
					t.Errorf("Free of %s ran on a done context (%v)", c.id, c.ctxErr)
				}
			}
		})
	}
}

// The stream end's free runs on a context detached from the stream's, which
// is cancelled by then, and bounded by its own deadline.
func TestBookingFreeAtStreamEndIsDetachedFromTheStream(t *testing.T) {
	b := newBookingBed(t)
	bk := b.booking(t, "req")
	stream, cancel := context.WithCancel(context.Background())
	cancel()
	bk.streamEnd(stream)

	if len(b.core.calls) != 1 {
		t.Fatalf("%d frees, want 1", len(b.core.calls))
	}
	if c := b.core.calls[0]; c.ctxErr != nil || !c.hasDeadline {
		t.Fatalf("free ran on a context with error %v, deadline %v; want a live context with a deadline", c.ctxErr, c.hasDeadline)
	}
	if b.active() != 0 || b.m.freedAtStreamEnd.Load() != 1 {
		t.Fatalf("%d bookings left, %d freed at stream end; want 0 and 1", b.active(), b.m.freedAtStreamEnd.Load())
	}
}
