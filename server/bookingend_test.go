package server

import (
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/metricstest"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/bookingend"
)

func TestBookingEndFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := o.bookEnd; f.mode != extproc.BookingEndAuto || f.max != bookingend.DefaultMax || f.outputTokens != bookingend.DefaultOutputTokens {
		t.Fatalf("defaults %+v", f)
	}
	if o.bookEnd.rest != restEndFree || !o.bookEnd.keepsEnds() {
		t.Fatalf("defaults %+v: want REST bookings freed by their callers, ext_proc ones kept", o.bookEnd)
	}
	o, err = parseFlags([]string{"--booking-end", "estimate", "--booking-estimate-max", "1m", "--booking-estimate-output-tokens", "64", "--rest-booking-end", "estimate"})
	if err != nil {
		t.Fatal(err)
	}
	if f := o.bookEnd; f.mode != extproc.BookingEndEstimate || f.rest != restEndEstimate || f.max != time.Minute || f.outputTokens != 64 {
		t.Fatalf("parsed %+v", f)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--booking-end", "never"}, `booking end "never": want auto, response or estimate`},
		{[]string{"--rest-booking-end", "response"}, `REST booking end "response": want free or estimate`},
		{[]string{"--booking-estimate-max", "0s"}, "--booking-estimate-max must be positive"},
		{[]string{"--booking-estimate-output-tokens", "0"}, "--booking-estimate-output-tokens must be at least 1"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestBookingEndMetrics(t *testing.T) {
	m := newBookingEndMetrics()
	m.observe(selection.BookingEndEvent{Kind: selection.BookingEndSet, Model: "m", Estimated: 3})
	m.observe(selection.BookingEndEvent{Kind: selection.BookingEndedByEstimate, Model: "m", Estimated: 3})
	m.observe(selection.BookingEndEvent{Kind: selection.BookingEndSeen, Model: "m", Estimated: 2, Actual: 4})
	m.observe(selection.BookingEndEvent{Kind: selection.BookingEndedByEngine, Model: "m", Estimated: 3, Actual: 1})
	m.observe(selection.BookingEndEvent{Kind: selection.BookingFirstTokenSeen, Model: "m", Estimated: 0.1, Actual: 0.3})
	got := metricstest.Series(t, m)
	for name, want := range map[string]float64{
		"kvselect_booking_estimated_lifetime_seconds_count{end=estimate,model=m}": 1,
		"kvselect_booking_estimated_lifetime_seconds_count{end=seen,model=m}":     1,
		"kvselect_booking_lifetime_seconds_count{model=m}":                        1,
		"kvselect_booking_lifetime_relative_error_count{model=m}":                 1,
		"kvselect_booking_first_token_error_seconds_count{model=m}":               1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], want, got)
		}
	}
}
