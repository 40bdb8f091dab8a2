package mesh

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"testing"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/index"
)

// FuzzDecode feeds arbitrary payloads to both topic decoders: they must never
// panic, must fail only with ErrMalformed, and whatever they accept must survive
// an encode/decode round trip unchanged.
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 60s ./replicas/mesh
func FuzzDecode(f *testing.F) {
	add := selection.BookingEvent{Kind: selection.BookingAdded, Partition: index.Partition{Model: "m", RoutingGroup: "g"},
		BlockSize: 16, RequestID: "r", Worker: index.WorkerKey{WorkerID: 3, DPRank: 1}, Origin: 1 << 63, LoraName: "l",
		TrackingHashes: []uint64{1, 2, 3}, TrackPrefill: true, ExpectedOutputTokens: ptr(uint32(7)), PrefillTokens: ptr(uint64(9))}
	f.Add(AppendBooking(nil, &add))
	for _, k := range []selection.BookingEventKind{selection.BookingFreed, selection.BookingPrefillCompleted} {
		ev := add
		ev.Kind, ev.TrackingHashes, ev.ExpectedOutputTokens, ev.PrefillTokens, ev.TrackPrefill = k, nil, nil, nil, false
		f.Add(AppendBooking(nil, &ev))
	}
	f.Add(AppendBinding(nil, &selection.SessionBinding{Partition: index.Partition{Model: "m", RoutingGroup: "g"},
		BindingEvent: affinity.BindingEvent{SessionID: "s", WorkerID: 1, DPRank: ptr(uint32(2)), Sequence: 5, WriterID: 6}}))
	f.Add([]byte{0x81, 0xa4, 'F', 'r', 'e', 'e', 0xc0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		if ev, err := DecodeBooking(p); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("booking error without ErrMalformed: %v", err)
			}
		} else {
			if ev.Kind != selection.BookingAdded {
				// Only AddRequest carries these; the encoder writes nothing else.
				ev.TrackingHashes, ev.TrackPrefill, ev.ExpectedOutputTokens, ev.PrefillTokens = nil, false, nil, nil
			}
			back, err := DecodeBooking(AppendBooking(nil, &ev))
			if err != nil || !reflect.DeepEqual(back, ev) {
				t.Fatalf("booking round trip: %+v -> %+v, %v", ev, back, err)
			}
		}
		if sb, err := DecodeBinding(p); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("binding error without ErrMalformed: %v", err)
			}
		} else {
			back, err := DecodeBinding(AppendBinding(nil, &sb))
			if err != nil || !reflect.DeepEqual(back, sb) {
				t.Fatalf("binding round trip: %+v -> %+v, %v", sb, back, err)
			}
		}
	})
}

// fuzzKey is drawn once per process: nothing in the corpus was made with it,
// so no fuzz input can carry a valid tag.
var fuzzKey = func() []byte {
	k := make([]byte, MinKeyBytes)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return k
}()

// countingReplica counts what reaches the service.
type countingReplica struct{ bookings, bindings int }

func (*countingReplica) ReplicaID() uint64                         { return 1 }
func (*countingReplica) ObserveReplicas(selection.ReplicaObserver) {}
func (c *countingReplica) ApplyRemoteBooking(selection.BookingEvent) selection.RemoteOutcome {
	c.bookings++
	return selection.RemoteApplied
}
func (c *countingReplica) ApplyRemoteBinding(selection.SessionBinding) (selection.RemoteOutcome, affinity.ApplyOutcome) {
	c.bindings++
	return selection.RemoteApplied, 0
}

// FuzzAuthenticate feeds arbitrary (topic, payload, auth frame) triples to a
// keyed mesh: nothing panics, nothing verifies, nothing reaches the service —
// as three frames, as two (no tag) or with an extra frame. The same topic and
// payload sealed with the key do verify, and any single flipped bit of that
// frame does not.
//
//	go test -run '^$' -fuzz FuzzAuthenticate -fuzztime 60s ./replicas/mesh
func FuzzAuthenticate(f *testing.F) {
	other, err := newAuthenticator([][]byte{bytes.Repeat([]byte{7}, MinKeyBytes)}, 9)
	if err != nil {
		f.Fatal(err)
	}
	add := selection.BookingEvent{Kind: selection.BookingAdded, Partition: index.Partition{Model: "m", RoutingGroup: "g"},
		BlockSize: 16, RequestID: "r", Worker: index.WorkerKey{WorkerID: 3}, Origin: 5, TrackPrefill: true}
	payload := AppendBooking(nil, &add)
	f.Add([]byte(TopicSlotTracker), payload, other.seal(nil, 1, []byte(TopicSlotTracker), payload), uint16(0))
	f.Add([]byte(TopicSessionAffinity), payload, other.seal(nil, 2, []byte(TopicSlotTracker), payload), uint16(300))
	f.Add([]byte(TopicSlotTracker), payload, make([]byte, authFrameLen), uint16(455))
	f.Add([]byte{}, []byte{}, []byte{authVersion}, uint16(1))
	f.Fuzz(func(t *testing.T, topic, payload, frame []byte, flip uint16) {
		a, err := newAuthenticator([][]byte{fuzzKey}, 2)
		if err != nil {
			t.Fatal(err)
		}
		if h, r := a.verify(topic, payload, frame); r == accepted {
			t.Fatalf("verified without the key: %+v", h)
		}
		rep := &countingReplica{}
		m := &Mesh{r: rep, log: slog.New(slog.NewTextHandler(io.Discard, nil)), opts: Options{Affinity: true}, auth: a}
		m.handle("fuzz", [][]byte{topic, payload, frame})
		m.handle("fuzz", [][]byte{topic, payload})
		m.handle("fuzz", [][]byte{topic, payload, frame, frame})
		if rep.bookings+rep.bindings != 0 {
			t.Fatalf("applied %d bookings, %d bindings without the key", rep.bookings, rep.bindings)
		}
		if n := m.c.rejected[rejectUnauthenticated].Load() + m.c.rejected[rejectMalformed].Load(); n != 3 || m.c.received.Load() != 3 {
			t.Fatalf("%d of 3 messages rejected", n)
		}
		sealed := a.seal(nil, 1, topic, payload)
		if _, r := a.verify(topic, payload, sealed); r != accepted {
			t.Fatalf("own seal rejected: %v", r)
		}
		sealed[int(flip)/8%len(sealed)] ^= 1 << (flip % 8)
		if _, r := a.verify(topic, payload, sealed); r == accepted {
			t.Fatalf("bit %d flipped and still verified", flip)
		}
	})
}
