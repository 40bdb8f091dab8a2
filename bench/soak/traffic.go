package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
)

// Outcomes of one client request. The picker's own answers are told apart
// from what the worker or the network did, so that availability counts only
// what kvselect answered.
const (
	outOK          = "ok"
	outCancelled   = "cancelled"    // the client gave up on purpose (a client fault)
	outRefused     = "picker_4xx"   // an immediate 4xx from the picker
	out503         = "picker_503"   // documented: no schedulable worker
	out5xx         = "picker_5xx"   // any other 5xx from the picker: a violation
	outUnreachable = "unreachable"  // no answer from the replica (down, paused)
	outWorker      = "worker_error" // the chosen worker failed or vanished
	outOverflow    = "overflow"     // the open-loop client had too many in flight to send it
)

// sessionHeader steers session affinity on the picker path.
const sessionHeader = "x-kvselect-session-id"

// result is one request as the client saw it.
type result struct {
	At      time.Duration `json:"at"` // since the phase began
	Front   string        `json:"front"`
	Replica string        `json:"replica"`
	Outcome string        `json:"outcome"`
	Status  int           `json:"status,omitempty"`
	Pick    time.Duration `json:"pick,omitempty"`
	Detail  string        `json:"detail,omitempty"`
}

// recorder collects results; a leaf lock.
type recorder struct {
	mu      sync.Mutex
	begin   time.Time
	results []result
}

func (r *recorder) add(res result) {
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]result(nil), r.results...)
}

// traffic drives both fronts at fixed open-loop rates. Request i of a front
// is the same in every phase with the same seed (prompt, session, client
// fault), so a fault-free run and a faulted one carry the same traffic.
type traffic struct {
	fl       *cluster
	seed     uint64
	nonce    string
	rec      *recorder
	inflight atomic.Int64
	wg       sync.WaitGroup
	docs     int
}

// maxInflight bounds the open-loop client: beyond it a request is counted
// as an overflow instead of piling goroutines onto a stalled system.
const maxInflight = 512

func (t *traffic) run(ctx context.Context, front string, rate float64, do func(context.Context, int)) {
	if rate <= 0 {
		return
	}
	gap := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := 0; ; i++ {
		next = next.Add(gap)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		if t.inflight.Load() >= maxInflight {
			t.rec.add(result{At: time.Since(t.rec.begin), Front: front, Outcome: outOverflow})
			continue
		}
		t.inflight.Add(1)
		t.wg.Go(func() {
			defer t.inflight.Add(-1)
			do(ctx, i)
		})
	}
}

// prompt is request i's token ids: one of the shared documents (popular ones
// more often), then a block and a bit of its own.
func (t *traffic) prompt(rng *rand.Rand) []uint32 {
	doc := rng.IntN(rng.IntN(t.docs) + 1)
	toks := make([]uint32, 0, 7*blockSize+5)
	for j := range 6 * blockSize {
		toks = append(toks, uint32(1+doc*6*blockSize+j))
	}
	for range blockSize + 5 {
		toks = append(toks, uint32(10000+rng.IntN(20000)))
	}
	return toks
}

func (t *traffic) body(rng *rand.Rand, toks []uint32) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": toks, "max_tokens": 4 + rng.IntN(9), "stream": true})
	return b
}

// extproc is one request through a picker, as Envoy runs it. A replica that
// does not answer is retried once on the next one, as Envoy's ext_proc
// cluster with several endpoints would; a client fault abandons the stream
// at one of four stages; a slow reader takes the response in small pieces.
func (t *traffic) extproc(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(t.seed, uint64(i)<<1))
	toks := t.prompt(rng)
	body := t.body(rng, toks)
	hs := []envoysim.Header{{Key: "x-request-id", Value: fmt.Sprintf("%s-x%d", t.nonce, i)}}
	if rng.Float64() < 0.3 {
		hs = append(hs, envoysim.Header{Key: sessionHeader, Value: "session-" + strconv.Itoa(rng.IntN(50))})
	}
	// The client gives up at one of four stages (a client fault), or reads
	// slowly, as Envoy would relay to a client on a bad link.
	rl := relay.Relay{HTTP: t.fl.hc, Envoy503: true}
	if rng.Float64() < 0.08 {
		rl.Abandon = relay.Stage(1 + rng.IntN(4))
	}
	if rng.Float64() < 0.03 {
		rl.ReadSize, rl.ReadDelay = 64, 20*time.Millisecond
	}
	at := time.Since(t.rec.begin)
	n := len(t.fl.replicas)
	first := i % n
	var res result
	for try := range 2 {
		r := t.fl.replicas[(first+try)%n]
		rl.Picker = r.picker
		res = extprocOnce(ctx, &rl, body, hs, rng)
		res.At, res.Front, res.Replica = at, "extproc", r.name
		if res.Outcome != outUnreachable {
			break
		}
	}
	t.rec.add(res)
}

// extprocOnce is one attempt through one replica's picker, its outcome told
// from where the relay stopped: the picker's own answer, the client giving
// up, the worker failing, or the exchange with the picker breaking.
func extprocOnce(ctx context.Context, rl *relay.Relay, body []byte, hs []envoysim.Header, rng *rand.Rand) result {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if rl.Abandon == relay.StageRequest {
		rl.AbandonAfter = time.Duration(rng.IntN(3000)) * time.Microsecond
	}
	res, err := rl.Do(ctx, "/v1/completions", body, hs...)
	var pe *relay.PickerError
	switch d := res.Decision; {
	case res.Abandoned != relay.StageNone:
		return result{Outcome: outCancelled, Pick: res.Pick, Detail: res.Abandoned.String()}
	case d != nil && d.Immediate != nil:
		st := int(d.Immediate.Status)
		out := outRefused
		switch {
		case st == http.StatusServiceUnavailable:
			out = out503
		case st >= 500:
			out = out5xx
		}
		return result{Outcome: out, Status: st, Pick: res.Pick, Detail: string(d.Immediate.Body)}
	case errors.As(err, &pe):
		return result{Outcome: outUnreachable, Pick: res.Pick, Detail: err.Error()}
	case err != nil || res.Status != http.StatusOK:
		r := result{Outcome: outWorker, Status: res.Status, Pick: res.Pick}
		if err != nil {
			r.Detail = err.Error()
		}
		return r
	}
	return result{Outcome: outOK, Status: 200, Pick: res.Pick}
}

// rest is one Ray-style booking cycle on one replica: /select then
// /reservations (or /select_and_reserve), prefill_complete, a short hold,
// DELETE. A few clients vanish mid-request instead (a client fault).
func (t *traffic) rest(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(t.seed, uint64(i)<<1|1))
	toks := t.prompt(rng)
	r := t.fl.replicas[i%len(t.fl.replicas)]
	id := fmt.Sprintf("%s-r%d", t.nonce, i)
	sel, _ := json.Marshal(map[string]any{"selection_id": id, "model_name": model, "token_ids": toks})
	res := result{At: time.Since(t.rec.begin), Front: "rest", Replica: r.name}
	if rng.Float64() < 0.03 {
		res.Outcome, res.Detail = outCancelled, vanish(r, sel, rng.IntN(2) == 0)
		t.rec.add(res)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	type step struct {
		method, path string
		body         []byte
	}
	steps := []step{{http.MethodPost, "/select_and_reserve", sel}}
	if rng.IntN(2) == 0 {
		steps = []step{{http.MethodPost, "/select", sel},
			{http.MethodPost, "/reservations", []byte(`{"selection_id":"` + id + `","model_name":"` + model + `"}`)}}
	}
	steps = append(steps, step{http.MethodPost, "/reservations/" + id + "/prefill_complete", nil})
	hold := time.Duration(20+rng.IntN(180)) * time.Millisecond
	for k, s := range steps {
		begin := time.Now()
		status, body, err := fleet.Call(ctx, t.fl.hc, s.method, r.kv.REST+s.path, s.body)
		if k == 0 {
			res.Pick = time.Since(begin)
		}
		if !t.restOutcome(&res, s.path, status, body, err) {
			t.rec.add(res)
			return
		}
	}
	time.Sleep(hold)
	status, body, err := fleet.Call(ctx, t.fl.hc, http.MethodDelete, r.kv.REST+"/reservations/"+id, nil)
	if t.restOutcome(&res, "DELETE", status, body, err) {
		res.Outcome, res.Status = outOK, status
	}
	t.rec.add(res)
}

// restOutcome classifies one call's answer into res; it reports whether the
// cycle may go on.
func (t *traffic) restOutcome(res *result, step string, status int, body []byte, err error) bool {
	switch {
	case err != nil:
		res.Outcome, res.Detail = outUnreachable, step+": "+err.Error()
	case status/100 == 2:
		return true
	case status == http.StatusServiceUnavailable:
		res.Outcome = out503
	case status >= 500:
		res.Outcome = out5xx
	default:
		res.Outcome = outRefused
	}
	res.Status = status
	if err == nil {
		res.Detail = fmt.Sprintf("%s: %.200s", step, body)
	}
	return false
}

// vanish is a REST client that goes away mid-request: with half a body sent,
// or with the whole request sent and the answer never read.
func vanish(r *replica, body []byte, half bool) string {
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(r.kv.REST, "http://"), time.Second)
	if err != nil {
		return "vanished before connecting: " + err.Error()
	}
	defer c.Close()
	head := fmt.Sprintf("POST /select_and_reserve HTTP/1.1\r\nHost: kvselect\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	if half {
		c.Write(append([]byte(head), body[:len(body)/2]...))
		return "vanished mid-body"
	}
	c.Write(append([]byte(head), body...))
	return "vanished before the answer"
}

// slowReader reads GET /dump from the replicas a few kilobytes a second, as a
// client on a bad link, until ctx ends.
func (t *traffic) slowReader(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		r := t.fl.replicas[i%len(t.fl.replicas)]
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, r.kv.REST+"/dump", nil)
		resp, err := http.DefaultTransport.RoundTrip(req)
		res := result{At: time.Since(t.rec.begin), Front: "slow_reader", Replica: r.name, Outcome: outOK}
		if err != nil {
			res.Outcome, res.Detail = outUnreachable, err.Error()
		} else {
			res.Status = resp.StatusCode
			buf := make([]byte, 512)
			for {
				_, err := resp.Body.Read(buf)
				if err != nil {
					if !errors.Is(err, io.EOF) && rctx.Err() == nil {
						res.Outcome, res.Detail = outUnreachable, err.Error()
					}
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				res.Outcome = out5xx
			}
		}
		cancel()
		t.rec.add(res)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
