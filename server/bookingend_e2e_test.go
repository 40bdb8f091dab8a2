package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/mockworker"
)

// TestRESTBookingsFollowTheirEnginesFirstToken runs kvselect with
// --rest-booking-end estimate beside a mock engine that publishes its KV
// events over ZMQ. A REST caller books and never frees; the engine queues
// the request behind another for far longer than any estimate, then stores
// the prompt: kvselect reads that as the booking's first token (its error
// metric counts it), keeps the booking past the original estimate, and
// frees it on its own once the moved end has come.
func TestRESTBookingsFollowTheirEnginesFirstToken(t *testing.T) {
	srv := runInBackground(t, noEnv, []string{"--rest-booking-end", "estimate", "--engine-metrics-interval", "0"})
	rest := "http://" + srv.addrs.REST.String()
	ctx := t.Context()
	w, err := mockworker.New(mockworker.Config{Model: "m", WorkerID: 1, BlockSize: 4, MaxNumSeqs: 1,
		PrefillPerToken: 10 * time.Millisecond, DecodePerToken: time.Millisecond,
		KVEventsEndpoint: "tcp://127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := mockworker.Register(ctx, nil, rest, w.Registration("http://worker-1:8000", "", "")); err != nil {
		t.Fatal(err)
	}
	tokens := func(from, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(from + i)
		}
		return out
	}
	// The listener connects asynchronously: warm it until a prompt's
	// blocks show up in the index.
	proctest.Eventually(t, "the engine's KV events in kvselect's index", 30*time.Second, func() bool {
		warm := tokens(9000, 8)
		if _, err := w.Generate(ctx, mockworker.Request{Tokens: warm, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		var sel struct {
			Overlap struct {
				GPU uint64 `json:"gpu"`
			} `json:"overlap"`
		}
		postJSON(t, rest+"/select", `{"model_name":"m","token_ids":`+jsonList(warm)+`}`, &sel)
		return sel.Overlap.GPU > 0
	})

	// A long request holds the engine's one slot (60 tokens at 10 ms:
	// 0.6 s); ours queues behind it, then prefills for 0.16 s.
	blocker := make(chan error, 1)
	go func() {
		_, err := w.Generate(ctx, mockworker.Request{Tokens: tokens(5000, 60), MaxTokens: 1})
		blocker <- err
	}()
	prompt := tokens(100, 16)
	var booked struct {
		SelectionID string `json:"selection_id"`
	}
	postJSON(t, rest+"/select_and_reserve", `{"model_name":"m","token_ids":`+jsonList(prompt)+`,"expected_output_tokens":4}`, &booked)
	bookedAt := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := w.Generate(ctx, mockworker.Request{Tokens: prompt, MaxTokens: 4})
		done <- err
	}()
	// Well past the estimate, still queued: the booking is still held.
	estimated := metric(t, rest, "kvselect_booking_estimated_lifetime_seconds_sum", "end", "estimate", "model", "m")
	if estimated <= 0 || estimated > 0.2 {
		t.Fatalf("estimated lifetime %v s: want a short one (an idle prior), under the 0.4 s this test checks at", estimated)
	}
	time.Sleep(time.Until(bookedAt.Add(400 * time.Millisecond)))
	if n := activeRequests(t, rest); n != 1 {
		t.Fatalf("%d active requests 0.4 s after a booking estimated to last %.3f s, its request still queued on the engine: want it held", n, estimated)
	}
	if err := <-blocker; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, "the first token seen in the engine's KV events", 30*time.Second, func() bool {
		return metric(t, rest, "kvselect_booking_first_token_error_seconds_count", "model", "m") == 1
	})
	// The queue (0.6 s behind the blocker, then 0.16 s of prefill) was far
	// beyond the idle prior's estimate, so the estimate was early.
	if sum := metric(t, rest, "kvselect_booking_first_token_error_seconds_sum", "model", "m"); sum > -0.3 {
		t.Fatalf("first token error %v s, want the estimate early by more than 0.3 s", sum)
	}
	proctest.Eventually(t, "the booking freed at its moved end, without a free", 30*time.Second, func() bool {
		return metric(t, rest, "kvselect_bookings_ended_by_estimate_total", "how", "estimated_end", "model", "m") == 1 &&
			activeRequests(t, rest) == 0
	})
	if n := metric(t, rest, "kvselect_bookings_ended_by_estimate_total", "how", "first_token_unseen", "model", "m"); n != 0 {
		t.Fatalf("%v bookings gave up waiting for a first token the engine reported", n)
	}
}

func jsonList(ids []uint32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

// postOK POSTs a JSON body and returns the answer's, failing the test on
// anything but a 2xx.
func postOK(t *testing.T, url, body string) []byte {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		t.Fatalf("POST %s: %d %s", url, res.StatusCode, b)
	}
	return b
}

func postJSON(t *testing.T, url, body string, out any) {
	t.Helper()
	b := postOK(t, url, body)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("POST %s: %v in %s", url, err, b)
	}
}

// metric sums the series of kvselect's /metrics named name whose labels
// have the given values (label, value, label, value, ...).
func metric(t *testing.T, rest, name string, labels ...string) float64 {
	t.Helper()
	m, err := promtext.Scrape(t.Context(), http.DefaultClient, rest+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(labels); i += 2 {
		m = m.Where(labels[i], labels[i+1])
	}
	return m.Sum(name)
}
