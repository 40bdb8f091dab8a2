package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvselect/kvselect/bench/promtext"
)

// WaitOK polls url until it answers 200, ctx ends or limit passes.
func WaitOK(ctx context.Context, hc *http.Client, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: timed out: %w", url, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Call sends one request with an optional JSON body and returns the status
// and the answer (at most 64 MiB).
func Call(ctx context.Context, hc *http.Client, method, url string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, b, err
}

// GetJSON decodes url's 200 answer into v.
func GetJSON(ctx context.Context, hc *http.Client, url string, v any) error {
	status, b, err := Call(ctx, hc, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET %s: %d %.200s", url, status, b)
	}
	return json.Unmarshal(b, v)
}

// Post sends v as JSON and wants a 2xx answer.
func Post(ctx context.Context, hc *http.Client, url string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	status, answer, err := Call(ctx, hc, http.MethodPost, url, b)
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return fmt.Errorf("POST %s: %d %.512s", url, status, answer)
	}
	return nil
}

// EngineRequests sums the requests the engines hold, running and waiting
// (vLLM's num_requests_running and num_requests_waiting gauges): what is in
// flight on them, as against the requests a client or gateway has open.
func EngineRequests(ctx context.Context, hc *http.Client, engines []string) (float64, error) {
	var n float64
	for _, e := range engines {
		m, err := promtext.Scrape(ctx, hc, "http://"+e+"/metrics")
		if err != nil {
			return 0, err
		}
		n += m.Sum("vllm:num_requests_running") + m.Sum("vllm:num_requests_waiting")
	}
	return n, nil
}

// CacheCounters sums the engines' vLLM prefix-cache counters (tokens queried
// and found) over engines, host:port each.
func CacheCounters(ctx context.Context, hc *http.Client, engines []string) (queries, hits float64, err error) {
	for _, e := range engines {
		m, err := promtext.Scrape(ctx, hc, "http://"+e+"/metrics")
		if err != nil {
			return 0, 0, err
		}
		queries += m.Sum("vllm:prefix_cache_queries_total")
		hits += m.Sum("vllm:prefix_cache_hits_total")
	}
	return queries, hits, nil
}
