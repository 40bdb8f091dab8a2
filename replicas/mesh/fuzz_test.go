package mesh

import (
	"errors"
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
