package benchflag

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every old spelling of an engine-timing knob sets the one value, and -h
// shows only the new spellings.
func TestTimingAliases(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		prefill, decode time.Duration
	}{
		{nil, time.Millisecond, 2 * time.Millisecond},
		{[]string{"-prefill-time-per-token", "5us", "-decode-time-per-token", "7ms"}, 5 * time.Microsecond, 7 * time.Millisecond},
		{[]string{"-prefill-per-token", "5us", "-decode-per-token", "7ms"}, 5 * time.Microsecond, 7 * time.Millisecond},
		{[]string{"-inter-token-latency", "3ms"}, time.Millisecond, 3 * time.Millisecond},
		{[]string{"-decode-step", "4ms"}, time.Millisecond, 4 * time.Millisecond},
	} {
		fs := flag.NewFlagSet("kvbench x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		prefill, decode := time.Millisecond, 2*time.Millisecond
		Timing(fs, &prefill, &decode, "before -speedup")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if prefill != tc.prefill || decode != tc.decode {
			t.Errorf("%v: prefill %v decode %v, want %v %v", tc.args, prefill, decode, tc.prefill, tc.decode)
		}
	}
	fs := flag.NewFlagSet("kvbench x", flag.ContinueOnError)
	var help strings.Builder
	fs.SetOutput(&help)
	prefill, decode := time.Millisecond, 2*time.Millisecond
	Timing(fs, &prefill, &decode, "before -speedup")
	if err := fs.Parse([]string{"-h"}); err != flag.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	out := help.String()
	for _, want := range []string{"Usage of kvbench x:", "-prefill-time-per-token", "(default 1ms)", "-decode-time-per-token", "(before -speedup)"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	for _, hidden := range []string{"-prefill-per-token", "-decode-per-token", "-inter-token-latency", "-decode-step"} {
		if strings.Contains(out, hidden) {
			t.Errorf("usage shows the alias %s:\n%s", hidden, out)
		}
	}
}

func TestLists(t *testing.T) {
	if got := Split(" a, b,,c ,"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Split = %q", got)
	}
	if got, err := Ints("16384, 4096"); err != nil || !slices.Equal(got, []int{16384, 4096}) {
		t.Errorf("Ints = %v, %v", got, err)
	}
	if got, err := Floats("0,0.3", 1); err != nil || !slices.Equal(got, []float64{0, 0.3}) {
		t.Errorf("Floats = %v, %v", got, err)
	}
	if got, err := Durations("0,200ms"); err != nil || !slices.Equal(got, []time.Duration{0, 200 * time.Millisecond}) {
		t.Errorf("Durations = %v, %v", got, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := Ints("0"); return err },
		func() error { _, err := Ints("x"); return err },
		func() error { _, err := Floats("1.5", 1); return err },
		func() error { _, err := Floats("-1", 0); return err },
		func() error { _, err := Floats("x", 0); return err },
		func() error { _, err := Durations("-1s"); return err },
		func() error { _, err := Durations("soon"); return err },
	} {
		if bad() == nil {
			t.Error("a bad list was accepted")
		}
	}
}
