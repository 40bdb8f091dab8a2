package extproc

import "fmt"

// BookingEnd says what ends a booking whose stream ends before the picker
// saw its response end (--booking-end).
//
// A booking is made at the decision and should last as long as the request
// runs on its worker. Envoy keeps its ext_proc stream open for the whole
// HTTP stream and closes it only when that is destroyed (Filter::onDestroy
// in source/extensions/filters/http/ext_proc/ext_proc.cc), whatever the
// processing mode: the stream's end is the request's end, with or without
// a response phase. NGINX Gateway Fabric's endpoint picker shim
// (cmd/gateway/endpoint_picker.go in nginx/nginx-gateway-fabric) instead
// sends the request headers and body, half-closes and reads until the
// picker ends the stream, so the stream ends right after the decision while
// the engine is still working. Freeing then would leave the loads blind;
// such a booking is instead kept to its estimated end
// (selection.Service.EndByEstimate).
type BookingEnd uint8

// Booking end modes.
const (
	// BookingEndAuto keeps a booking to its estimated end when the stream
	// ended cleanly (the gateway half-closed it) after the decision,
	// without any response message, from a gateway that sent no
	// protocol_config and is not declared an older Envoy (AssumedModes)
	// (keepToEstimate); otherwise it frees at the stream's end as
	// BookingEndResponse does.
	BookingEndAuto BookingEnd = iota
	// BookingEndResponse frees at the response's end, else at the stream's
	// end, whatever the gateway.
	BookingEndResponse
	// BookingEndEstimate keeps every booking not freed at its response's
	// end to its estimated end once the decision was sent, however the
	// stream ended.
	BookingEndEstimate
)

var bookingEndNames = [...]string{BookingEndAuto: "auto", BookingEndResponse: "response", BookingEndEstimate: "estimate"}

func (b BookingEnd) String() string {
	if int(b) < len(bookingEndNames) {
		return bookingEndNames[b]
	}
	return fmt.Sprintf("BookingEnd(%d)", uint8(b))
}

// ParseBookingEnd reads auto, response or estimate.
func ParseBookingEnd(s string) (BookingEnd, error) {
	for i, n := range bookingEndNames {
		if s == n {
			return BookingEnd(i), nil
		}
	}
	return 0, fmt.Errorf("booking end %q: want auto, response or estimate", s)
}

// keepToEstimate says whether the stream's booking, still live at the
// stream's end, is kept to its estimated end rather than freed now.
//
// In auto mode, all of these must hold:
//   - the decision was sent: a stream reset or refused before it has no
//     request running anywhere;
//   - the stream ended cleanly, half-closed by the gateway: a reset without
//     a half-close is a gateway or connection failure;
//   - no response message came: a stream that saw the response phase ended
//     with the response, or early because the client or upstream went away;
//   - the first message carried no protocol_config. Every Envoy that sends
//     protocol_config holds the stream until the HTTP stream is destroyed,
//     so its clean end without response headers is the request's end
//     either way: the response ended unseen (response_header_mode SKIP) or
//     the client went away before the upstream answered, and Envoy then
//     resets the upstream request, which the engine aborts. Either way the
//     booking goes now, and auto needs no guess between the two. NGF's shim
//     sends no protocol_config.
//
// An Envoy too old to send protocol_config is declared by its operator with
// Options.AssumedModes (--extproc-assume-*-body-mode): its streams too are
// freed at their end. Left undeclared and configured to skip the response
// phase, it would have its bookings kept to their estimate after the
// response ended: an overcount bounded by the estimate, which
// --booking-end response avoids.
func (st *stream) keepToEstimate() bool {
	if !st.picked {
		return false
	}
	switch st.s.opts.BookingEnd {
	case BookingEndEstimate:
		return true
	case BookingEndResponse:
		return false
	}
	return st.cleanEnd && !st.responseSeen && !st.modesKnown && st.s.opts.AssumedModes == nil
}
