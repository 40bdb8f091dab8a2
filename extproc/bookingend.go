package extproc

import (
	"fmt"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// BookingEnd says what ends a booking whose stream ends before the picker
// saw its response end (--booking-end).
//
// A booking is made at the decision and should last as long as the request
// runs on its worker. Two gateways end the ext_proc stream right after the
// decision while the engine is still working, and never show the response:
// NGINX Gateway Fabric's endpoint picker shim (cmd/gateway/endpoint_picker.go
// in nginx/nginx-gateway-fabric) sends the request headers and body,
// half-closes and reads until the picker ends the stream; and Envoy with a
// processing mode that leaves nothing of the response to process
// (response_header_mode SKIP, response_body_mode NONE, response trailers
// skipped), whose filter closes the stream once the request side's last
// response came (Filter::closeGrpcStreamIfLastRespReceived in
// source/extensions/filters/http/ext_proc/ext_proc.cc, runtime guard
// envoy.reloadable_features.ext_proc_stream_close_optimization). Freeing then
// would leave the loads blind; such a booking is instead kept to its
// estimated end (selection.Service.EndByEstimate).
type BookingEnd uint8

// Booking end modes.
const (
	// BookingEndAuto keeps a booking to its estimated end when the stream
	// ended cleanly (the gateway half-closed it) after the decision,
	// without any response message, from a gateway that will process no
	// response body (keepToEstimate); otherwise it frees at the stream's
	// end as BookingEndResponse does.
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
//   - the gateway processes no response body: its first message announced
//     response_body_mode NONE in protocol_config, or it sent no
//     protocol_config and either the operator declared an older Envoy's
//     modes (Options.AssumedModes) with a response body mode NONE, or
//     declared none (NGF's shim sends no protocol_config).
//
// Envoy ends its ext_proc stream when the HTTP stream is destroyed
// (Filter::onDestroy), so a clean end without response headers also means
// a client that went away before the upstream answered; Envoy then resets
// the upstream request, which the engine aborts. With a response body to
// process (GIE's FULL_DUPLEX_STREAMED) the stream would have stayed open
// for the response, so that is the only meaning left, and the booking goes
// now. With response_body_mode NONE the two cannot be told apart from the
// stream: response_header_mode SKIP closes it after the decision (the
// request runs on), while SEND closes it after the response headers, so a
// clean end without them is a client gone. auto keeps both to the estimate:
// the second is the rare case, and its overcount lasts only to the estimated
// end, while freeing every booking of the first leaves the loads blind.
// --booking-end response frees both at once.
//
// A clean end is a half-close the receive loop saw as end of stream. Envoy's
// non-graceful close (without the runtime guard
// envoy.reloadable_features.ext_proc_graceful_grpc_close) resets the stream
// right after half-closing it, and gRPC may report the reset first: such a
// stream counts as reset and its booking is freed at once, as before
// --booking-end existed. --booking-end estimate does not depend on the race.
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
	if !st.cleanEnd || st.responseSeen {
		return false
	}
	switch {
	case st.modesKnown:
		return st.modes.Response == filterv3.ProcessingMode_NONE
	case st.s.opts.AssumedModes != nil:
		return st.s.opts.AssumedModes.Response == filterv3.ProcessingMode_NONE
	}
	return true
}
