package mesh

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// The tests below run real selection.Services connected by real ZMQ sockets
// on 127.0.0.1; nothing is faked but the clock, which only the expiry test
// moves. Asynchronous conditions are polled with generous deadlines.

const deadline = 30 * time.Second

var bg = context.Background()

// clock is a settable time source shared by a test's replicas.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type replica struct {
	name string
	svc  *selection.Service
	mesh *Mesh
}

func (r *replica) endpoint() string { return "tcp://" + r.mesh.Addr().String() }

// newReplica builds a service (approximate index, workers 1..workers of model
// "model" with block size 4) and starts its mesh on a free loopback port.
func newReplica(t *testing.T, name string, seed uint64, clk *clock, workers int, edit func(*routerconfig.Config)) *replica {
	t.Helper()
	return newReplicaWith(t, name, seed, clk, workers, edit, nil)
}

// newReplicaWith is newReplica with the mesh options edited by opt.
func newReplicaWith(t *testing.T, name string, seed uint64, clk *clock, workers int, edit func(*routerconfig.Config), opt func(*Options)) *replica {
	t.Helper()
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	if edit != nil {
		edit(&rc)
	}
	svc, err := selection.New(selection.Config{Router: rc, Clock: clk.Now, Rand: rand.New(rand.NewPCG(seed, seed))})
	if err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= workers; id++ {
		ep, bs := fmt.Sprintf("http://worker-%d:8000", id), uint32(4)
		if _, err := svc.UpsertWorker(bg, catalog.Record{WorkerID: uint64(id), ModelName: "model", Endpoint: &ep, BlockSize: &bs}); err != nil {
			t.Fatal(err)
		}
	}
	_, affinityOn := rc.SessionAffinityTTL.Get()
	o := Options{Bind: "tcp://127.0.0.1:0", Affinity: affinityOn, ReconnectMax: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if opt != nil {
		opt(&o)
	}
	m, err := Start(bg, svc.Replica(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return &replica{name: name, svc: svc, mesh: m}
}

// connect makes every replica subscribe to every other one.
func connect(t *testing.T, rs ...*replica) {
	t.Helper()
	for _, a := range rs {
		for _, b := range rs {
			if a != b {
				if _, err := a.mesh.Register(b.endpoint()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", deadline, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// load sums a replica's load over all workers of the partition.
func load(r *replica) selection.PotentialLoad {
	var sum selection.PotentialLoad
	for _, ml := range r.svc.Inspect().Loads(nil, nil) {
		for _, l := range ml.Loads {
			sum.ActiveRequests += l.ActiveRequests
			sum.PotentialPrefillTokens += l.PotentialPrefillTokens
			sum.PotentialDecodeBlocks += l.PotentialDecodeBlocks
		}
	}
	return sum
}

var probes atomic.Int64

// waitMeshed books probes on from until every peer shows one, then frees
// them: a SUB subscription reaches the PUB side asynchronously, and events
// published before it arrives are lost (ZMQ's slow joiner), so tests wait for
// the mesh to carry traffic before they measure anything.
func waitMeshed(t *testing.T, from *replica, to ...*replica) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		id := fmt.Sprintf("probe-%d", probes.Add(1))
		if _, err := from.svc.Reserve(bg, &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
			SelectionID: &id, WorkerID: ptr(uint64(1)), PromptRequest: selection.PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(4))}}); err != nil {
			t.Fatal(err)
		}
		seen := time.Now().Add(300 * time.Millisecond)
		ok := false
		for !ok && time.Now().Before(seen) {
			ok = true
			for _, r := range to {
				ok = ok && load(r).ActiveRequests > 0
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := from.svc.Free(bg, id); err != nil {
			t.Fatal(err)
		}
		if ok {
			for _, r := range to {
				eventually(t, r.name+" frees the probe", func() bool { return load(r).ActiveRequests == 0 })
			}
			return
		}
		// Some peer missed it; its Free is dropped as unknown. Clear any
		// mirror that did arrive before trying again.
		for _, r := range to {
			eventually(t, r.name+" clears the probe", func() bool { return load(r).ActiveRequests == 0 })
		}
		if time.Now().After(end) {
			t.Fatalf("mesh from %s not carrying events within %v", from.name, deadline)
		}
	}
}

// Three replicas in a mesh: a booking on A shows in B's and C's loads with its
// prefill tokens and decode block; prefill-complete and free follow (the port
// of Dynamo's selector_replica_sync_propagates_request_lifecycle, over ZMQ).
func TestMeshPropagatesLifecycle(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	a, b, c := newReplica(t, "A", 1, clk, 2, nil), newReplica(t, "B", 2, clk, 2, nil), newReplica(t, "C", 3, clk, 2, nil)
	connect(t, a, b, c)
	waitMeshed(t, a, b, c)
	waitMeshed(t, b, a, c)
	waitMeshed(t, c, a, b)

	if _, err := a.svc.SelectAndReserve(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
		SelectionID: ptr("replicated"), PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}}); err != nil {
		t.Fatal(err)
	}
	want := selection.PotentialLoad{ActiveRequests: 1, PotentialDecodeBlocks: 1, PotentialPrefillTokens: 4}
	for _, r := range []*replica{b, c} {
		eventually(t, r.name+" mirrors the booking", func() bool { return load(r) == want })
	}
	// A mirrored booking conflicts with a local booking of the same id.
	if _, err := b.svc.SelectAndReserve(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
		SelectionID: ptr("replicated"), PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}}); selection.KindOf(err) != selection.KindConflict {
		t.Fatalf("local booking of a mirrored id: %v", err)
	}
	if err := a.svc.PrefillComplete(bg, "replicated"); err != nil {
		t.Fatal(err)
	}
	want.PotentialPrefillTokens = 0
	for _, r := range []*replica{b, c} {
		eventually(t, r.name+" sees prefill complete", func() bool { return load(r) == want })
	}
	// Freeing on C, where the booking is a mirror, frees it everywhere.
	if err := c.svc.Free(bg, "replicated"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*replica{a, b, c} {
		eventually(t, r.name+" frees", func() bool { return load(r) == selection.PotentialLoad{} })
	}
	if st := a.mesh.Stats(); st.BookingsPublished == 0 || st.Bookings["applied"] == 0 || st.BookingsDropped != 0 {
		t.Errorf("A stats: %+v", st)
	}
}

// A replica whose catalog lacks a worker, or whose partition has another block
// size, drops the events and counts them by reason.
func TestMeshDropsUnknownEventsAndCounts(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	a := newReplica(t, "A", 1, clk, 2, nil)
	b := newReplica(t, "B", 2, clk, 1, nil) // only worker 1
	connect(t, a, b)
	waitMeshed(t, a, b)
	if _, err := a.svc.Reserve(bg, &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
		SelectionID: ptr("on-2"), WorkerID: ptr(uint64(2)), PromptRequest: selection.PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(4))}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B counts the unknown worker", func() bool { return b.mesh.Stats().Bookings["unknown_worker"] >= 1 })
	// Garbage on the topic from a foreign publisher is counted as malformed.
	pub := zmq4.NewPub(bg)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + pub.Addr().String()
	if _, err := b.mesh.Register(ep); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B counts malformed messages", func() bool {
		_ = pub.Send(zmq4.NewMsgFrom([]byte(TopicSlotTracker), []byte{0x84, 0xff}))
		return b.mesh.Stats().Malformed >= 1
	})
	if load(b).ActiveRequests != 0 {
		t.Fatalf("B booked something: %+v", load(b))
	}
}

// A peer that dies mid-stream — bookings published, frees never sent — leaves
// no load behind once the active-request expiry passes (Maintain reclaims the
// mirrors like local bookings).
func TestDeadPeerLeavesNoLoadAfterExpiry(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	short := func(c *routerconfig.Config) { c.ActiveRequestExpiry = 30 * time.Second }
	a, b := newReplica(t, "A", 1, clk, 2, short), newReplica(t, "B", 2, clk, 2, short)
	connect(t, a, b)
	waitMeshed(t, a, b)
	for i := range 5 {
		if _, err := a.svc.SelectAndReserve(bg, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
			SelectionID: ptr(fmt.Sprint("r", i)), PromptRequest: selection.PromptRequest{TokenIDs: []uint32{uint32(i), 2, 3, 4}}}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "B mirrors five bookings", func() bool { return load(b).ActiveRequests == 5 })
	if err := a.mesh.Close(); err != nil { // A dies: its frees will never come
		t.Fatal(err)
	}
	clk.Add(20 * time.Second)
	b.svc.Maintain(bg)
	if n := load(b).ActiveRequests; n != 5 {
		t.Fatalf("mirrors reclaimed before expiry: %d left", n)
	}
	clk.Add(11 * time.Second)
	b.svc.Maintain(bg)
	if l := load(b); l != (selection.PotentialLoad{}) {
		t.Fatalf("phantom load after expiry: %+v", l)
	}
	// B keeps redialing the dead peer without effect.
	eventually(t, "B notices A is gone", func() bool { return !b.mesh.Stats().Peers[0].Connected })
}

// Dynamic peers (POST /replica_sync/register_peer and deregister_peer):
// register is created then present, deregister removes then reports not found,
// invalid endpoints are bad requests, and a closed mesh is unavailable.
func TestDynamicPeers(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	a, b := newReplica(t, "A", 1, clk, 1, nil), newReplica(t, "B", 2, clk, 1, nil)
	if p := a.mesh.Peers(); len(p) != 0 {
		t.Fatalf("initial peers %q", p)
	}
	created, err := a.mesh.Register(b.endpoint())
	if err != nil || !created {
		t.Fatalf("register: %v %v", created, err)
	}
	if created, err = a.mesh.Register(b.endpoint()); err != nil || created {
		t.Fatalf("register again: %v %v", created, err)
	}
	if _, err := a.mesh.Register("tcp://127.0.0.1:1"); err != nil { // unreachable: accepted, retried in the background
		t.Fatal(err)
	}
	if p := a.mesh.Peers(); !slices.Equal(p, slices.Sorted(slices.Values([]string{b.endpoint(), "tcp://127.0.0.1:1"}))) {
		t.Fatalf("peers %q", p)
	}
	for _, bad := range []string{"invalid", "tcp://127.0.0.1", "udp://h:1"} {
		if _, err := a.mesh.Register(bad); selection.KindOf(err) != selection.KindBadRequest {
			t.Errorf("register %q: %v", bad, err)
		}
	}
	connect(t, b) // no-op: a replica does not subscribe to itself
	if _, err := b.mesh.Register(a.endpoint()); err != nil {
		t.Fatal(err)
	}
	waitMeshed(t, b, a)
	if err := a.mesh.Deregister(b.endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := a.mesh.Deregister(b.endpoint()); selection.KindOf(err) != selection.KindNotFound || err.Error() != "peer not found" {
		t.Fatalf("second deregister: %v", err)
	}
	// A no longer hears B.
	id := "after-deregister"
	if _, err := b.svc.Reserve(bg, &selection.ReservationRequest{PartitionKey: selection.PartitionKey{ModelName: "model"},
		SelectionID: &id, WorkerID: ptr(uint64(1)), PromptRequest: selection.PromptRequest{SequenceHashes: []int64{1}, ISLTokens: ptr(uint64(4))}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // a negative: give a stray message time to arrive
	if load(a).ActiveRequests != 0 {
		t.Fatalf("A still applies B's events after deregister")
	}
	if err := a.mesh.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.mesh.Register(b.endpoint()); selection.KindOf(err) != selection.KindUnavailable {
		t.Fatalf("register after close: %v", err)
	}
	if err := a.mesh.Deregister("tcp://127.0.0.1:1"); selection.KindOf(err) != selection.KindUnavailable {
		t.Fatalf("deregister after close: %v", err)
	}
}

// Start fails on an invalid peer and releases the port.
func TestStartRejectsBadPeerAndFreesPort(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	a := newReplica(t, "A", 1, clk, 1, nil)
	addr := a.mesh.Addr().String()
	if err := a.mesh.Close(); err != nil {
		t.Fatal(err)
	}
	svc, err := selection.New(selection.Config{Router: routerconfig.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(bg, svc.Replica(), Options{Bind: "tcp://" + addr, Peers: []string{"not-an-endpoint"}}); err == nil {
		t.Fatal("bad peer accepted")
	}
	m, err := Start(bg, svc.Replica(), Options{Bind: "tcp://" + addr, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("port not free after a failed start: %v", err)
	}
	_ = m.Close()
	if _, err := Start(bg, svc.Replica(), Options{Bind: "tcp://*:0x"}); err == nil {
		t.Fatal("bad bind accepted")
	}
}

// Session bindings ride the mesh when affinity is on: a session bound on A is
// steered to the same worker by B.
func TestMeshReplicatesSessionAffinity(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	on := func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) }
	a, b := newReplica(t, "A", 1, clk, 4, on), newReplica(t, "B", 2, clk, 4, on)
	connect(t, a, b)
	waitMeshed(t, a, b)
	req := &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"}, SelectionID: ptr("s1"),
		SessionID: ptr("sess"), PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3, 4}}}
	resp, err := a.svc.SelectAndReserve(bg, req)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "B applies the binding", func() bool { return b.mesh.Stats().Bindings["applied"] >= 1 })
	for i := range 4 {
		q := &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "model"}, SessionID: ptr("sess"),
			PromptRequest: selection.PromptRequest{TokenIDs: []uint32{uint32(100 + i), 5, 6, 7}}}
		got, err := b.svc.Select(bg, q)
		if err != nil {
			t.Fatal(err)
		}
		if got.WorkerID != resp.WorkerID {
			t.Fatalf("B routed session to %d, bound to %d on A", got.WorkerID, resp.WorkerID)
		}
	}
}

// With ResolvePeers, a peer named by host name is subscribed at every address
// the name resolves to (a Kubernetes headless Service lists every replica),
// except this replica's own socket.
func TestResolvePeersExpandsNamesAndSkipsSelf(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	b := newReplica(t, "B", 2, clk, 1, nil)
	rc := routerconfig.Default()
	rc.UseKVEvents = false
	svc, err := selection.New(selection.Config{Router: rc, Clock: clk.Now, Rand: rand.New(rand.NewPCG(9, 9))})
	if err != nil {
		t.Fatal(err)
	}
	ep, bs := "http://worker-1:8000", uint32(4)
	if _, err := svc.UpsertWorker(bg, catalog.Record{WorkerID: 1, ModelName: "model", Endpoint: &ep, BlockSize: &bs}); err != nil {
		t.Fatal(err)
	}
	m, err := Start(bg, svc.Replica(), Options{Bind: "tcp://127.0.0.1:0", ResolvePeers: true, ResolveEvery: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	a := &replica{name: "A", svc: svc, mesh: m}
	_, bPort, _ := strings.Cut(b.mesh.Addr().String(), ":")
	_, aPort, _ := strings.Cut(m.Addr().String(), ":")
	named := "tcp://localhost:" + bPort
	self := "tcp://localhost:" + aPort
	for _, ep := range []string{named, self} {
		if _, err := m.Register(ep); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.mesh.Register(a.endpoint()); err != nil {
		t.Fatal(err)
	}
	waitMeshed(t, b, a)
	st := m.Stats()
	var viaName, viaSelf []PeerStatus
	for _, p := range st.Peers {
		switch p.Peer {
		case named:
			viaName = append(viaName, p)
		case self:
			viaSelf = append(viaSelf, p)
		}
	}
	if len(viaName) == 0 || !slices.ContainsFunc(viaName, func(p PeerStatus) bool { return p.Endpoint == "tcp://127.0.0.1:"+bPort }) {
		t.Fatalf("localhost not expanded to 127.0.0.1: %+v", viaName)
	}
	if len(viaSelf) != 1 || viaSelf[0].Endpoint != "" {
		t.Fatalf("own socket subscribed: %+v", viaSelf)
	}
	if p := m.Peers(); !slices.Equal(p, slices.Sorted(slices.Values([]string{named, self}))) {
		t.Fatalf("configured peers %q", p)
	}
}
