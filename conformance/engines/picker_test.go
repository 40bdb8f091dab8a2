package engines

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/internal/proctest"
)

// TestPickerRoutesToTheHolder runs the ext_proc picker as Envoy would, over
// simulators fed through the collector: a prompt that extends a prefix one
// simulator holds goes to that simulator, its real streamed response flows
// back through the picker, the simulator confirms the hit with cached_tokens,
// and every booking is freed when the streams end.
func TestPickerRoutesToTheHolder(t *testing.T) {
	peerproc.SimBinary(t)
	k := startKvselect(t, kvselectOptions{collector: true})
	var sims []*peerproc.SimProcess
	for i := range 3 {
		s := startSim(t, k.collect, simOptions{})
		k.register(s, uint64(i+1))
		sims = append(sims, s)
	}
	cc, err := grpc.NewClient(k.extproc, append(envoysim.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := envoysim.New(cc)

	for round := range 2 {
		for i, s := range sims {
			// Warm one simulator directly with a prefix of 6 blocks.
			prefix := prompt(50+10*round+i, 6*blockSize)
			complete(t, s, prefix)
			id := uint64(i + 1)
			proctest.Eventually(t, fmt.Sprintf("worker %d's prefix indexed", id), settle, func() bool { return k.overlaps(prefix)[id] == 6 })

			req := append(append([]int(nil), prefix...), prompt(900+i, 20)...)
			body, _ := json.Marshal(map[string]any{"model": model, "prompt": req, "max_tokens": 8, "stream": true,
				"stream_options": map[string]any{"include_usage": true}})
			hostPort := strings.TrimPrefix(s.URL(), "http://")
			got, cached := viaPicker(t, client, body)
			if got != hostPort {
				t.Fatalf("round %d: a prompt extending worker %d's prefix went to %s, want %s", round, id, got, hostPort)
			}
			if cached != 6*blockSize {
				t.Fatalf("round %d: worker %d served %d cached tokens through the picker, want %d", round, id, cached, 6*blockSize)
			}
		}
	}
	proctest.Eventually(t, "every booking freed", 10*time.Second, func() bool { return activeRequests(t, k) == 0 })
}

// viaPicker sends one streamed completion through the picker, forwards it to
// the endpoint picked, streams the response back through the exchange, and
// returns the endpoint and the cached prompt tokens of the final usage chunk.
func viaPicker(t *testing.T, client *envoysim.Client, body []byte) (endpoint string, cached int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, d, err := client.Start(ctx, &envoysim.Request{Path: "/v1/completions", Body: body, Modes: envoysim.GIE,
		Headers: []envoysim.Header{{Key: "content-type", Value: "application/json"}}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Immediate != nil {
		t.Fatalf("picker answered %d: %s", d.Immediate.Status, d.Immediate.Body)
	}
	if d.Destination != d.MetadataDestination || d.Endpoint == "" {
		t.Fatalf("destination header %q, metadata %q", d.Destination, d.MetadataDestination)
	}
	defer x.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.Endpoint+"/v1/completions", bytes.NewReader(d.Body))
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	hs := []envoysim.Header{{Key: "content-type", Value: resp.Header.Get("content-type")}}
	if _, err := x.ResponseHeaders(envoysim.Response{Status: resp.StatusCode, Headers: hs, Served: d.Endpoint}, false); err != nil {
		t.Fatal(err)
	}
	var streamed bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			out, err := x.ResponseBody(buf[:n], false)
			if err != nil {
				t.Fatal(err)
			}
			streamed.Write(out)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			t.Fatal(rerr)
		}
	}
	out, err := x.ResponseBody(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	streamed.Write(out)
	if resp.StatusCode != http.StatusOK || !strings.Contains(streamed.String(), "data: [DONE]") {
		t.Fatalf("engine answered %d; what came back through the picker:\n%s", resp.StatusCode, streamed.String())
	}
	for _, line := range strings.Split(streamed.String(), "\n") {
		var chunk struct {
			Usage *struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil {
			cached = chunk.Usage.Details.Cached
		}
	}
	return d.Endpoint, cached
}

func activeRequests(t *testing.T, k *kvselect) uint64 {
	t.Helper()
	var loads []struct {
		Loads []struct {
			ActiveRequests uint64 `json:"active_requests"`
		} `json:"loads"`
	}
	if code := k.do(http.MethodGet, "/loads", nil, &loads); code != http.StatusOK {
		t.Fatalf("GET /loads: %d", code)
	}
	var n uint64
	for _, m := range loads {
		for _, l := range m.Loads {
			n += l.ActiveRequests
		}
	}
	return n
}
