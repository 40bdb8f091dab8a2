package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/bench/fleet/fleettest"
	"github.com/kvselect/kvselect/bench/mooncake"
	"github.com/kvselect/kvselect/bench/relay"
	"github.com/kvselect/kvselect/envoysim"
)

// TestSharedPrefixFollowsTheCache runs kvselect and two mock workers as real
// processes on loopback and drives them with the Envoy-faithful ext_proc
// client: the second request of a shared prefix lands on the worker that
// cached it (known to kvselect only through the worker's KV events), and
// every booking is freed once the responses end.
func TestSharedPrefixFollowsTheCache(t *testing.T) {
	ctx := context.Background()
	fl, err := fleet.Start(ctx, fleet.Config{Binaries: fleettest.Binaries(t), Family: fleet.FamilyMock, Workers: 2,
		Engine: fleet.Engine{BlockSize: 16, PoolBlocks: 1024, Speedup: 1000, PrefillPerToken: 50 * time.Microsecond,
			DecodePerToken: time.Millisecond, Extra: []string{"--prefill-slots", "1"}}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Stop()
	rl := fl.Relay()
	via := func(body []byte, i int) int {
		t.Helper()
		res, err := rl.Do(ctx, "/v1/completions", body, envoysim.Header{Key: "x-request-id", Value: fmt.Sprintf("shared-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		return fl.Worker(res.Decision.Endpoint)
	}

	prefix := mooncake.Tokens([]uint64{11, 12, 13, 14}, 64) // 256 tokens: 16 blocks
	body := func(tail uint64) []byte {
		b, _ := json.Marshal(relay.Completion{Model: fleet.MockModel, Prompt: append(append([]uint32(nil), prefix...), mooncake.Tokens([]uint64{tail}, 64)...),
			MaxTokens: 4, Stream: true})
		return b
	}
	first := via(body(100), 1)
	// kvselect learns the first worker's blocks from its KV events.
	var overlap struct {
		Workers []struct {
			WorkerID     uint64 `json:"worker_id"`
			DeviceBlocks uint32 `json:"device_blocks"`
		} `json:"workers"`
	}
	probe, _ := json.Marshal(map[string]any{"model_name": fleet.MockModel, "token_ids": prefix})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := fl.HTTP.Post(fl.KV.REST+"/overlap_scores", "application/json", bytes.NewReader(probe))
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&overlap)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		held := uint32(0)
		for _, w := range overlap.Workers {
			if w.WorkerID == uint64(first+1) {
				held = w.DeviceBlocks
			}
		}
		if held == 16 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvselect never indexed the first worker's 16 prefix blocks: %+v", overlap)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 5 {
		if second := via(body(uint64(200+i)), 2+i); second != first {
			t.Fatalf("request %d sharing the prefix went to worker %d, not %d which caches it", i, second+1, first+1)
		}
	}
	if n, err := fl.KV.ActiveRequests(ctx); err != nil || n != 0 {
		t.Fatalf("active requests after every response ended: %d (%v)", n, err)
	}
}
