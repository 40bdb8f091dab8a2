package soak

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvselect/kvselect/bench/fleet"
)

// Every round of the deck deals every kind exactly its weight, and the same
// seed deals the same schedule.
func TestDeckDealsEveryKindEachRound(t *testing.T) {
	total := 0
	for _, k := range faultKinds {
		total += k.weight
	}
	deal := func(seed uint64) []string {
		d := deck{rng: rand.New(rand.NewPCG(seed, 1))}
		var out []string
		for range 2 * total {
			out = append(out, d.next().name)
		}
		return out
	}
	a := deal(7)
	for round := range 2 {
		counts := map[string]int{}
		for _, name := range a[round*total : (round+1)*total] {
			counts[name]++
		}
		for _, k := range faultKinds {
			if counts[k.name] != k.weight {
				t.Fatalf("round %d dealt %s %d times, want %d", round, k.name, counts[k.name], k.weight)
			}
		}
	}
	if !slices.Equal(a, deal(7)) {
		t.Fatal("the same seed dealt another schedule")
	}
	if slices.Equal(a, deal(8)) {
		t.Fatal("another seed dealt the same schedule")
	}
}

func TestSlope(t *testing.T) {
	for _, tc := range []struct {
		xs, ys []float64
		want   float64
	}{
		{[]float64{0, 1, 2, 3}, []float64{5, 7, 9, 11}, 2},
		{[]float64{0, 1, 2, 3}, []float64{4, 4, 4, 4}, 0},
		{[]float64{1, 2, 3}, []float64{3, 1, 2}, -0.5},
		{[]float64{1}, []float64{1}, math.NaN()},
		{[]float64{2, 2}, []float64{1, 3}, math.NaN()},
	} {
		got := slope(tc.xs, tc.ys)
		if !(got == tc.want || math.IsNaN(got) && math.IsNaN(tc.want)) && math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("slope(%v, %v) = %v, want %v", tc.xs, tc.ys, got, tc.want)
		}
	}
}

// The slopes are fitted on the last half, on the last incarnation only, and
// judged only when the window is long enough.
func TestResourceSlopes(t *testing.T) {
	cfg := Defaults()
	var samples []Sample
	for i := range 61 {
		at := time.Duration(i) * time.Minute
		a := ReplicaSample{PID: 1, RSSMiB: 100 + float64(i)*100/60, Goroutines: 300, FDs: 40}
		c := ReplicaSample{PID: 2, RSSMiB: 80, Goroutines: 300, FDs: 40}
		if i > 55 {
			c.PID = 3 // restarted five minutes before the end
		}
		samples = append(samples, Sample{At: at, Replicas: map[string]ReplicaSample{"a": a, "c": c}})
	}
	got := map[string]ResourceSlope{}
	for _, rs := range resourceSlopes(samples, time.Hour, &cfg) {
		got[rs.Replica+" "+rs.Resource] = rs
	}
	if rs := got["a RSS"]; !rs.Judged || rs.OK || math.Abs(rs.PerHour-100) > 1e-6 || rs.Samples != 31 {
		t.Errorf("a's RSS grows 100 MiB/h: %+v, want it judged and over the 64 MiB/h bound", rs)
	}
	if rs := got["a goroutines"]; !rs.Judged || !rs.OK || rs.PerHour != 0 {
		t.Errorf("a's goroutines are flat: %+v", rs)
	}
	if rs := got["c RSS"]; rs.Judged || !strings.Contains(rs.Note, "restarted") {
		t.Errorf("c restarted near the end: %+v, want reported only", rs)
	}
	short := Defaults()
	short.JudgeAfter = 2 * time.Hour
	for _, rs := range resourceSlopes(samples, time.Hour, &short) {
		if rs.Judged {
			t.Errorf("%+v judged on a window shorter than JudgeAfter", rs)
		}
	}
}

func TestLeftover(t *testing.T) {
	loads := []map[string]any{{"model_name": "m", "loads": []any{
		map[string]any{"worker_id": 1.0, "dp_rank": 0.0, "active_requests": 0.0, "active_prefill_tokens": 0.0},
		map[string]any{"worker_id": 2.0, "dp_rank": 0.0, "active_requests": 1.0, "active_decode_blocks": 3.0},
	}}}
	want := "worker 2 rank 0 active_decode_blocks=3, worker 2 rank 0 active_requests=1"
	if got := leftover(loads); got != want {
		t.Fatalf("leftover = %q, want %q", got, want)
	}
	if got := leftover(loads[:0]); got != "" {
		t.Fatalf("leftover of nothing = %q", got)
	}
}

// The lossy proxy, over real ZMQ sockets: batches pass in order, then one in
// three or so is dropped, each is sent twice, or neighbours swap places.
func TestKVProxyModes(t *testing.T) {
	ctx := t.Context()
	up := zmq4.NewPub(ctx)
	defer up.Close()
	if err := up.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p, err := newKVProxy("tcp://"+up.Addr().String(), false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	msgs := make(chan uint64, 1024)
	go func() {
		for m := range subscribe(t, p.pubEndpoint()) {
			msgs <- binary.BigEndian.Uint64(m.Frames[1])
		}
		close(msgs)
	}()
	seq := uint64(0)
	publish := func(n int) {
		for range n {
			up.Send(zmq4.NewMsgFrom([]byte("topic"), binary.BigEndian.AppendUint64(nil, seq), []byte("payload")))
			seq++
		}
	}
	// Until both subscriptions are up, batches vanish: publish until one
	// comes through.
	var first uint64
	for got := false; !got; {
		publish(1)
		select {
		case first = <-msgs:
			got = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	receive := func(n int) []uint64 {
		var out []uint64
		for len(out) < n {
			select {
			case s := <-msgs:
				out = append(out, s)
			case <-time.After(2 * time.Second):
				return out
			}
		}
		return out
	}
	drain := func() []uint64 { return receive(math.MaxInt) }
	publish(4)
	if got := receive(4); !slices.Equal(got, []uint64{first + 1, first + 2, first + 3, first + 4}) {
		t.Fatalf("pass: %v", got)
	}
	p.setMode(duplicate)
	base := seq
	publish(3)
	if got := receive(6); !slices.Equal(got, []uint64{base, base, base + 1, base + 1, base + 2, base + 2}) {
		t.Fatalf("duplicate: %v", got)
	}
	p.setMode(reorder)
	base = seq
	publish(4)
	if got := receive(4); !slices.Equal(got, []uint64{base + 1, base, base + 3, base + 2}) {
		t.Fatalf("reorder: %v", got)
	}
	p.setMode(dropSome)
	base = seq
	handled := func() uint64 { return p.forwarded.Load() + p.dropped.Load() }
	before := handled()
	publish(300)
	// The mode is read as each batch arrives: switch back only once all 300 did.
	for deadline := time.Now().Add(5 * time.Second); handled()-before < 300 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	p.setMode(passAll)
	publish(1)
	got := drain()
	if n := len(got) - 1; n < 150 || n > 260 || got[len(got)-1] != base+300 {
		t.Fatalf("drop: %d of 300 passed (want about 70 %%), last %d", n, got[len(got)-1])
	}
	if d := p.dropped.Load(); d+uint64(len(got)-1) != 300 {
		t.Fatalf("dropped counter %d, passed %d, want 300 in all", d, len(got)-1)
	}
}

// The replay proxy forwards while up and refuses every connection while down.
func TestTCPProxyDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { fmt.Fprintln(c, "hello"); c.Close() }()
		}
	}()
	p, err := newTCPProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	read := func() string {
		c, err := net.Dial("tcp", strings.TrimPrefix(p.endpoint(), "tcp://"))
		if err != nil {
			return err.Error()
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 16)
		n, _ := c.Read(b)
		return string(b[:n])
	}
	if got := read(); got != "hello\n" {
		t.Fatalf("up: %q", got)
	}
	p.setDown(true)
	if got := read(); got != "" {
		t.Fatalf("down: %q, want the connection closed at once", got)
	}
	p.setDown(false)
	if got := read(); got != "hello\n" {
		t.Fatalf("up again: %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Duration = 0 }, "duration"},
		{func(c *Config) { c.Replicas = 0 }, "replicas"},
		{func(c *Config) { c.ProxiedWorkers = 9 }, "proxied"},
		{func(c *Config) { c.ExtprocRate, c.RESTRate = 0, 0 }, "rates"},
		{func(c *Config) { c.Expiry = 1500 * time.Millisecond }, "whole seconds"},
		{func(c *Config) { c.Sims = 1 }, "simulator"},
	} {
		c := Defaults()
		tc.mod(&c)
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate = %v, want an error about %s", err, tc.want)
		}
	}
	c := Defaults()
	if err := c.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// A bound proxy (the collector a simulator dials) outlives its publisher: the
// next incarnation's batches still come through. (The first hour's run lost
// the simulator's stream at its first restart: the proxy stopped at the
// error its SUB socket returned when the old connection died.)
func TestKVProxyBoundOutlivesItsPublisher(t *testing.T) {
	ctx := t.Context()
	port, err := fleet.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	upstream := fmt.Sprintf("tcp://127.0.0.1:%d", port[0])
	p, err := newKVProxy(upstream, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	got := make(chan string, 64)
	go func() {
		for m := range subscribe(t, p.pubEndpoint()) {
			got <- string(m.Frames[0])
		}
	}()
	for _, name := range []string{"first", "second"} {
		pub := zmq4.NewPub(ctx)
		if err := pub.Dial(upstream); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for arrived := false; !arrived; {
			if time.Now().After(deadline) {
				t.Fatalf("nothing from the %s publisher came through", name)
			}
			pub.Send(zmq4.NewMsgFrom([]byte(name), binary.BigEndian.AppendUint64(nil, 1), []byte("payload")))
			select {
			case m := <-got:
				arrived = m == name
			case <-time.After(50 * time.Millisecond):
			}
		}
		pub.Close() // the engine dies; the next one dials the same socket
	}
}

// subscribe dials a SUB socket to endpoint, subscribed to everything, and
// hands on what it receives until the test ends.
func subscribe(t *testing.T, endpoint string) <-chan zmq4.Msg {
	t.Helper()
	sub := zmq4.NewSub(t.Context())
	t.Cleanup(func() { sub.Close() })
	if err := sub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	out := make(chan zmq4.Msg, 1024)
	go func() {
		defer close(out)
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			out <- m
		}
	}()
	return out
}
