package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/kvselect/kvselect/selection/scheduler"
	"github.com/kvselect/kvselect/server"
)

// newestWorker is a scorer written in Go: the worker with the highest id
// costs least. Host eligibility (allowed workers, taints, busy workers,
// pinned workers) still applies before it is asked.
type newestWorker struct{}

func (newestWorker) Score(_ *scheduler.Context, c *scheduler.Candidate) (float64, error) {
	return -float64(c.Worker.WorkerID), nil
}

// ExampleWithPolicy embeds kvselect in a Go program with a policy of its own
// and drives it over the REST API, as a Ray deployment would.
func ExampleWithPolicy() {
	ctx, stop := context.WithCancel(context.Background())
	listening := make(chan server.Listening, 1)
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, []string{"--host", "127.0.0.1", "--port", "0", "--extproc-port", "0"},
			server.WithPolicy(scheduler.Policy{Scorer: newestWorker{}, Picker: scheduler.SoftmaxPicker{}, ExclusiveAffinity: true}),
			server.WithLogger(slog.New(slog.DiscardHandler)),
			server.WithEnv(func(k string) (string, bool) {
				// No engines publish KV events here: the index learns from
				// bookings instead.
				if k == "DYN_ROUTER_USE_KV_EVENTS" {
					return "false", true
				}
				return "", false
			}),
			server.WithListening(func(l server.Listening) { listening <- l }))
	}()
	base := "http://" + (<-listening).REST.String()

	post := func(path, body string) map[string]any {
		res, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		defer res.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
			panic(err)
		}
		return out
	}
	for id := 1; id <= 3; id++ {
		post("/workers", fmt.Sprintf(`{"worker_id":%d,"model_name":"llama","endpoint":"http://10.0.0.%d:8000","block_size":4}`, id, id))
	}
	// Worker 3 is busy with a long prompt: Dynamo's cost would avoid it.
	post("/select_and_reserve", `{"model_name":"llama","pinned_worker":{"worker_id":3,"dp_rank":0},"token_ids":[`+
		strings.TrimSuffix(strings.Repeat("9,", 256), ",")+`]}`)
	sel := post("/select", `{"model_name":"llama","token_ids":[1,2,3,4,5,6,7,8]}`)
	fmt.Println("selected worker", sel["worker_id"], "at", sel["endpoint"])

	stop()
	fmt.Println("stopped:", <-done)
	// Output:
	// selected worker 3 at http://10.0.0.3:8000
	// stopped: <nil>
}
