package pdsim

import (
	"context"
	"math"
	"testing"
	"time"
)

var bg = context.Background()

// tiny is a small, fast configuration.
func tiny() Config {
	c := DefaultConfig()
	c.Sessions, c.Turns, c.FirstTokens, c.FollowUpTokens, c.OutputTokens = 12, 2, 1024, 64, 20
	c.Rate = 4
	c.ChunkTokens = 256
	return c
}

func run(t *testing.T, c Config, s Setup) Result {
	t.Helper()
	r, err := Run(bg, c, s) // fails when a booking is left behind
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != c.Sessions*c.Turns {
		t.Fatalf("%s: %d of %d requests finished", s.Name, r.Requests, c.Sessions*c.Turns)
	}
	return r
}

// Remote prefills put no prefill compute on decode workers and move blocks;
// aggregated workers prefill everything themselves and move nothing.
func TestRemotePrefillComputesNothingOnDecodeWorkers(t *testing.T) {
	c := tiny()
	setups := Setups(2, 4)
	agg, remote := run(t, c, setups[0]), run(t, c, setups[1])
	if remote.DecodePrefilled != 0 || remote.RemotePrefills != 24 || remote.LocalPrefills != 0 || remote.TransferBlocks == 0 {
		t.Fatalf("always-remote: %+v", remote)
	}
	if agg.DecodePrefilled == 0 || agg.RemotePrefills != 0 || agg.TransferBlocks != 0 {
		t.Fatalf("aggregated: %+v", agg)
	}
}

// One request on an idle fleet: its TTFT is exactly the prefill, the
// transfer of every block and one decode step, so doubling the per-block
// transfer time adds exactly blocks × the difference (the clock is virtual).
func TestTransferTimeScalesWithBlocksMoved(t *testing.T) {
	c := tiny()
	c.Sessions, c.Turns, c.FirstTokens, c.OutputTokens = 1, 1, 1024, 2
	s := Setups(1, 1)[1]
	ttft := func(per time.Duration) Result {
		c.TransferPerBlock = per
		return run(t, c, s)
	}
	a, b := ttft(time.Millisecond), ttft(2*time.Millisecond)
	blocks := 1024 / 16
	if a.TransferBlocks != blocks {
		t.Fatalf("moved %d blocks, want %d", a.TransferBlocks, blocks)
	}
	want := float64(1024)*0.05 + float64(blocks) + 10 // prefill + transfer + one step, ms
	if math.Abs(a.TTFTP50Ms-want) > 1e-9 || math.Abs(b.TTFTP50Ms-a.TTFTP50Ms-float64(blocks)) > 1e-9 {
		t.Fatalf("TTFT %v ms then %v ms, want %v then +%d", a.TTFTP50Ms, b.TTFTP50Ms, want, blocks)
	}
}

// A long prompt prefilled on a decoding worker stretches its streams' steps;
// prefilled elsewhere, every step is one decode step.
func TestPrefillOnADecodingWorkerRaisesITL(t *testing.T) {
	c := tiny()
	c.Sessions, c.Rate, c.FirstTokens, c.OutputTokens = 40, 20, 2048, 50 // overlapping requests
	setups := Setups(2, 4)
	agg, remote := run(t, c, setups[0]), run(t, c, setups[1])
	step := float64(c.DecodePerToken.Milliseconds())
	if remote.ITLP99Ms != step || agg.ITLP99Ms <= step {
		t.Fatalf("ITL p99: always-remote %v ms, aggregated %v ms; want %v and more", remote.ITLP99Ms, agg.ITLP99Ms, step)
	}
}

// Conditional disaggregation keeps cached follow-ups local: fewer remote
// prefills than always-remote, and only short local ones.
func TestConditionalKeepsFollowUpsLocal(t *testing.T) {
	c := tiny()
	r := run(t, c, Setups(2, 4)[2])
	if r.RemotePrefills < c.Sessions || r.LocalPrefills == 0 {
		t.Fatalf("conditional: %+v", r)
	}
	if perLocal := r.DecodePrefilled / r.LocalPrefills; perLocal > c.FollowUpTokens+c.OutputTokens+c.BlockSize {
		t.Fatalf("a local prefill computed %d tokens on average: more than a follow-up's uncached part", perLocal)
	}
}

func TestRunIsDeterministic(t *testing.T) {
	c := tiny()
	s := Setups(2, 4)[2]
	if a, b := run(t, c, s), run(t, c, s); a != b {
		t.Fatalf("two runs differ:\n%+v\n%+v", a, b)
	}
}

func TestBadConfig(t *testing.T) {
	c := tiny()
	c.Rate = 0
	if _, err := Run(bg, c, Setups(1, 1)[0]); err == nil {
		t.Fatal("a zero rate was accepted")
	}
	if _, err := Run(bg, tiny(), Setup{Name: "none"}); err == nil {
		t.Fatal("a fleet without decode workers was accepted")
	}
}
