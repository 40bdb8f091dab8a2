package health

import (
	"testing"
	"time"
)

func TestReportEjectsAfterConsecutiveFailuresInTheWindow(t *testing.T) {
	cfg := DefaultConfig()
	t0 := time.Unix(1_700_000_000, 0)
	fail := Outcome{Detail: "status 503"}
	for _, tc := range []struct {
		name  string
		steps []time.Duration // failure times after t0; a negative one is a success at -d
		want  Transition      // the last step's transition
	}{
		{"four failures", []time.Duration{0, 1, 2, 3}, Unchanged},
		{"five failures", []time.Duration{0, 1, 2, 3, 4}, Ejection},
		{"a success between", []time.Duration{0, 1, 2, -3, 4, 5, 6, 7}, Unchanged},
		{"the first failure left the window", []time.Duration{0, 1, 2, 3, 31 * time.Second}, Unchanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tab Table
			var got Transition
			for _, d := range tc.steps {
				o := fail
				if d < 0 {
					o, d = Outcome{OK: true}, -d
				}
				got = tab.Report(7, o, t0.Add(d), &cfg)
			}
			if got != tc.want {
				t.Fatalf("transition %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEjectionProbationTrialAndRestoration(t *testing.T) {
	cfg := DefaultConfig()
	var tab Table
	now := time.Unix(1_700_000_000, 0)
	for range 5 {
		tab.Report(1, Outcome{Detail: "reset"}, now, &cfg)
	}
	if ex, any := tab.Excluded(now, cfg.Base); !any || !ex[1] {
		t.Fatalf("ejected worker not excluded: %v %v", ex, any)
	}
	if v, reason := tab.View(1, now); v.State != Ejected || reason != "ejected: 5 consecutive failures" || !v.EjectedUntil.Equal(now.Add(5*time.Second)) {
		t.Fatalf("view %+v, reason %q", v, reason)
	}
	// Probation: a candidate again until a selection chooses it for its trial.
	now = now.Add(5 * time.Second)
	if ex, _ := tab.Excluded(now, cfg.Base); ex[1] {
		t.Fatal("a probation worker without a trial is excluded")
	}
	tab.Chosen(1, now)
	if ex, _ := tab.Excluded(now, cfg.Base); !ex[1] {
		t.Fatal("a probation worker with its trial in flight is a candidate")
	}
	// The trial fails: ejected for twice as long.
	if tr := tab.Report(1, Outcome{Detail: "status 500"}, now, &cfg); tr != Ejection {
		t.Fatalf("failed trial: %v", tr)
	}
	if v, _ := tab.View(1, now); v.Ejections != 2 || !v.EjectedUntil.Equal(now.Add(10*time.Second)) {
		t.Fatalf("second ejection %+v", v)
	}
	now = now.Add(10 * time.Second)
	if tr := tab.Report(1, Outcome{OK: true}, now, &cfg); tr != Restoration {
		t.Fatalf("successful trial: %v", tr)
	}
	if v, _ := tab.View(1, now); v != nil {
		t.Fatalf("restored worker still has a view: %+v", v)
	}
	st := tab.Stats(now)
	if st != (Stats{Ejections: 2, Restorations: 1, Failures: 6, Successes: 1}) {
		t.Fatalf("stats %+v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"off", func(c *Config) { *c = Config{} }, true},
		{"negative eject-after", func(c *Config) { c.EjectAfter = -1 }, false},
		{"max below base", func(c *Config) { c.Max = c.Base / 2 }, false},
		{"no window", func(c *Config) { c.Window = 0 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			if err := c.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
