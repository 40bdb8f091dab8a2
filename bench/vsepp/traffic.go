package vsepp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
)

// traffic calls one(i) for every request, open or closed loop.
func (c *Config) traffic(ctx context.Context, reqs []mooncake.Request, one func(int)) error {
	if c.Loop == "closed" {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range c.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					i := int(next.Add(1) - 1)
					if i >= len(reqs) {
						return
					}
					one(i)
				}
			}()
		}
		wg.Wait()
		return ctx.Err()
	}
	return relay.OpenLoop(ctx, time.Now(), len(reqs), mooncake.Arrivals(reqs, c.Compress, c.Rate), c.Concurrency, one)
}

// result is one request through a picker.
type result struct {
	decision, ttft time.Duration
	// itl is the mean time between the response's SSE events after the
	// first (0 with fewer than two).
	itl       time.Duration
	endpoint  string
	scores    bool
	rewritten bool // the body came back re-encoded, same JSON
	refused   []string
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// exchange is one request as Envoy runs it with the ext_proc filter in
// front of an InferencePool: the picker decides from the headers and the
// body, Envoy forwards the body the picker streamed back to the endpoint in
// the destination header, with the headers the picker set, and every chunk of
// the engine's SSE response goes through the picker on its way to the client
// — which must receive exactly what the engine sent (neither picker rewrites
// a response whose model name is the requested one).
func exchange(ctx context.Context, client *envoysim.Client, hc *http.Client, body []byte, id string) (result, error) {
	begin := time.Now()
	x, d, err := client.Start(ctx, &envoysim.Request{Path: "/v1/completions", Body: body, Modes: envoysim.GIE,
		Headers: []envoysim.Header{{Key: "content-type", Value: "application/json"}, {Key: "x-request-id", Value: id}}})
	if err != nil {
		return result{}, err
	}
	if d.Immediate != nil {
		return result{}, fmt.Errorf("picker answered %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
	res := result{decision: time.Since(begin), endpoint: d.Endpoint, scores: d.EndpointScores != nil, refused: d.RejectedHeaders}
	if d.Endpoint == "" {
		x.Abort()
		return res, errors.New("no destination endpoint in the picker's answer")
	}
	if d.MetadataDestination != "" && d.MetadataDestination != d.Destination {
		x.Abort()
		return res, fmt.Errorf("destination header %q and envoy.lb metadata %q differ", d.Destination, d.MetadataDestination)
	}
	if !bytes.Equal(d.Body, body) {
		// A processor may replace the body in FULL_DUPLEX_STREAMED; one
		// that re-encodes the same JSON (the EPP does, keys sorted) is
		// counted, anything else is an error.
		if !sameJSON(d.Body, body) {
			x.Abort()
			return res, fmt.Errorf("the picker changed the request body's content (%d bytes in, %d out)", len(body), len(d.Body))
		}
		res.rewritten = true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.Endpoint+"/v1/completions", bytes.NewReader(d.Body))
	if err != nil {
		x.Abort()
		return res, err
	}
	for k, v := range d.SetHeaders {
		if !strings.HasPrefix(k, ":") && k != "content-length" {
			req.Header.Set(k, v)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		x.Abort()
		return res, err
	}
	defer resp.Body.Close()
	hs := make([]envoysim.Header, 0, len(resp.Header))
	for k, vs := range resp.Header {
		hs = append(hs, envoysim.Header{Key: strings.ToLower(k), Value: vs[0]})
	}
	if _, err := x.ResponseHeaders(envoysim.Response{Status: resp.StatusCode, Headers: hs, Served: d.Endpoint}, false); err != nil {
		x.Abort()
		return res, fmt.Errorf("response headers: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		x.Abort()
		return res, fmt.Errorf("engine %s answered %s: %s", d.Endpoint, resp.Status, b)
	}
	var sent, got []byte
	buf := make([]byte, 4096)
	events := 0
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if res.ttft == 0 && bytes.Contains(buf[:n], []byte("data:")) {
				res.ttft = time.Since(begin)
			}
			events += bytes.Count(buf[:n], []byte("data:")) - bytes.Count(buf[:n], []byte("data: [DONE]"))
			sent = append(sent, buf[:n]...)
			fwd, err := x.ResponseBody(buf[:n], false)
			if err != nil {
				x.Abort()
				return res, fmt.Errorf("response body: %w", err)
			}
			got = append(got, fwd...)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			x.Abort()
			return res, rerr
		}
	}
	if events > 1 && res.ttft > 0 {
		res.itl = (time.Since(begin) - res.ttft) / time.Duration(events-1)
	}
	fwd, err := x.ResponseBody(nil, true)
	if err != nil {
		x.Abort()
		return res, fmt.Errorf("response end: %w", err)
	}
	got = append(got, fwd...)
	x.Close()
	if res.ttft == 0 {
		return res, fmt.Errorf("engine %s sent no data", d.Endpoint)
	}
	if !bytes.Equal(sent, got) {
		return res, fmt.Errorf("the client got %d bytes through the picker, the engine sent %d", len(got), len(sent))
	}
	return res, nil
}

// saturation is a closed loop of whole ext_proc exchanges with no engine
// behind them: the decision, then a synthesised SSE response (headers, one
// chunk, end) through the picker, as fast as the load generator goes. Its
// rate is the picker's maximum on one core when the picker's CPU is near
// 100 %; lower, the load generator on the other core was the limit.
func (c *Config) saturation(ctx context.Context, pk *picker, client *envoysim.Client, bodies [][]byte, run *PickerRun) error {
	chunk := []byte("data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\ndata: [DONE]\n\n")
	sse := []envoysim.Header{{Key: "content-type", Value: "text/event-stream"}}
	var (
		next, completed, failed atomic.Int64
		stop                    atomic.Bool
		wg                      sync.WaitGroup
		firstErr                atomic.Pointer[string]
	)
	// The window ends by not starting new requests: the ones in flight
	// finish normally, so that the end of the window cancels nothing (a
	// cancelled exchange would look like an error) and every booking is
	// freed the way a response end frees it.
	timer := time.AfterFunc(c.Saturate, func() { stop.Store(true) })
	defer timer.Stop()
	cpu0, err := fleet.ProcessCPU(pk.pid)
	if err != nil {
		return err
	}
	start := time.Now()
	for range c.SaturateStreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && ctx.Err() == nil {
				i := int(next.Add(1)-1) % len(bodies)
				err := func() error {
					// A picker that never answers fails the request instead
					// of holding the loop.
					rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					x, d, err := client.Start(rctx, &envoysim.Request{Path: "/v1/completions", Body: bodies[i], Modes: envoysim.GIE,
						Headers: []envoysim.Header{{Key: "content-type", Value: "application/json"}, {Key: "x-request-id", Value: "sat-" + strconv.Itoa(i)}}})
					if err != nil {
						return err
					}
					defer x.Close()
					if d.Immediate != nil {
						return fmt.Errorf("picker answered %d", d.Immediate.Status)
					}
					if _, err := x.ResponseHeaders(envoysim.Response{Headers: sse, Served: d.Endpoint}, false); err != nil {
						return err
					}
					_, err = x.ResponseBody(chunk, true)
					return err
				}()
				switch {
				case err == nil:
					completed.Add(1)
				case ctx.Err() == nil:
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, err := fleet.ProcessCPU(pk.pid)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	run.MaxRPS = float64(completed.Load()) / elapsed.Seconds()
	run.SaturationCPUPercent = 100 * float64(cpu1-cpu0) / float64(elapsed)
	if n := completed.Load(); n > 0 {
		run.SaturationCPUPerRequestUs = float64(cpu1-cpu0) / float64(n) / 1e3
	}
	run.SaturationErrors = int(failed.Load())
	if p := firstErr.Load(); p != nil {
		run.SaturationError = *p
	}
	return nil
}
