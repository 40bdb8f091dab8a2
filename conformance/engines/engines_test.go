package engines

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/peerproc"
	"github.com/kvselect/kvselect/internal/proctest"
)

// TestOverlapEqualsEngineCache is the core interop check, in both of the
// simulator's event encodings (positional arrays, where a chain's first block
// names parent 0, and vLLM's tagged maps): kvselect binds a collector, three
// simulators dial it, two are registered over REST and one through
// --workers-file; token-id prompts go straight to the simulators; then the
// overlap kvselect reports for an extension of each prompt, on the worker
// that served it, equals the cached_tokens that simulator reports when it
// serves that extension — block for block — and no other worker claims it.
func TestOverlapEqualsEngineCache(t *testing.T) {
	for _, enc := range []struct {
		name      string
		mapEvents bool
	}{{"array", false}, {"map", true}} {
		t.Run(enc.name, func(t *testing.T) {
			peerproc.SimBinary(t)
			collectorEP := "tcp://127.0.0.1:" + fmt.Sprint(proctest.FreePort(t))
			// The third simulator comes from a workers file; its ports are
			// fixed before anything starts.
			third := peerproc.Sim{Port: proctest.FreePort(t), ReplayPort: proctest.FreePort(t), Model: model}
			wf := filepath.Join(t.TempDir(), "workers.yaml")
			rec, _ := json.Marshal(map[string]any{"workers": []any{map[string]any{
				"worker_id": 3, "model_name": model, "block_size": blockSize,
				"endpoint":        fmt.Sprintf("http://127.0.0.1:%d", third.Port),
				"replay_endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", third.ReplayPort),
			}}})
			if err := os.WriteFile(wf, rec, 0o600); err != nil {
				t.Fatal(err)
			}
			k := startKvselect(t, kvselectOptions{collector: true, collectorEP: collectorEP, workersFile: wf})
			sims := []*peerproc.SimProcess{
				startSim(t, collectorEP, simOptions{mapEvents: enc.mapEvents}),
				startSim(t, collectorEP, simOptions{mapEvents: enc.mapEvents}),
			}
			third.Binary, third.ZMQEndpoint, third.BlockSize, third.MapEvents = peerproc.SimBinary(t), collectorEP, blockSize, enc.mapEvents
			sims = append(sims, startSimWith(t, third))
			k.register(sims[0], 1)
			k.register(sims[1], 2)

			// Prompts of 4, 6 and 5 whole blocks plus a partial one.
			lengths := []int{4*blockSize + 3, 6 * blockSize, 5*blockSize + 9}
			for i, s := range sims {
				if cached := complete(t, s, prompt(i, lengths[i])); cached != 0 {
					t.Fatalf("worker %d: a fresh simulator served %d cached tokens", i+1, cached)
				}
			}
			for i, s := range sims {
				id := uint64(i + 1)
				ext := prompt(i, lengths[i]+2*blockSize) // the prompt and two more blocks
				want := lengths[i] / blockSize
				var got map[uint64]int
				proctest.Eventually(t, fmt.Sprintf("worker %d's blocks indexed", id), settle, func() bool {
					got = k.overlaps(ext)
					return got[id] == want
				})
				for other, n := range got {
					if other != id && n != 0 {
						t.Fatalf("worker %d claims %d blocks of worker %d's prompt", other, n, id)
					}
				}
				if cached := complete(t, s, ext); cached != want*blockSize {
					t.Fatalf("worker %d: kvselect's overlap is %d blocks (%d tokens); the simulator served %d cached tokens",
						id, want, want*blockSize, cached)
				}
			}
			for _, m := range []string{"kvselect_kv_events_rejected_total", "kvselect_kv_events_lost_batches_total",
				"kvselect_kv_events_decode_errors_total", "kvselect_kv_events_stale_batches_total"} {
				if v := k.metric(m, ""); v != 0 {
					t.Errorf("%s = %v, want 0", m, v)
				}
			}
			if st := k.collector(); st.Delivered == 0 {
				t.Errorf("collector delivered nothing: %+v", st)
			}
		})
	}
}

// TestKvselectRestartRecoversByReplay: kvselect dies while the simulators go
// on serving (and publishing into the void); a restarted kvselect catches up
// from each simulator's replay ring as the workers file registers them, and
// its index then equals that of a fresh kvselect that learned everything by
// replay alone: nothing lost, nothing phantom.
func TestKvselectRestartRecoversByReplay(t *testing.T) {
	peerproc.SimBinary(t)
	collectorEP := "tcp://127.0.0.1:" + fmt.Sprint(proctest.FreePort(t))
	cfgs := []peerproc.Sim{}
	var workers []any
	for i := range 3 {
		c := peerproc.Sim{Binary: peerproc.SimBinary(t), Model: model, Port: proctest.FreePort(t), ReplayPort: proctest.FreePort(t),
			ZMQEndpoint: collectorEP, BlockSize: blockSize}
		cfgs = append(cfgs, c)
		workers = append(workers, map[string]any{"worker_id": i + 1, "model_name": model, "block_size": blockSize,
			"endpoint":        fmt.Sprintf("http://127.0.0.1:%d", c.Port),
			"replay_endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", c.ReplayPort)})
	}
	wf := filepath.Join(t.TempDir(), "workers.json")
	raw, _ := json.Marshal(map[string]any{"workers": workers})
	if err := os.WriteFile(wf, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKvselect(t, kvselectOptions{collector: true, collectorEP: collectorEP, workersFile: wf})
	var sims []*peerproc.SimProcess
	for _, c := range cfgs {
		sims = append(sims, startSimWith(t, c))
	}
	var prompts [][]int
	send := func(round int) {
		for i, s := range sims {
			p := prompt(10*round+i, (3+round+i)*blockSize)
			complete(t, s, p)
			prompts = append(prompts, p)
		}
	}
	send(0)
	proctest.Eventually(t, "round 0 indexed", settle, func() bool { return k.overlaps(prompts[0])[1] == 3 })
	k.kill()
	send(1) // published while no collector listens: lost live, kept in the rings
	send(2)
	time.Sleep(1500 * time.Millisecond) // the simulators' flush timer
	restarted := startKvselect(t, kvselectOptions{collector: true, collectorEP: collectorEP, workersFile: wf})
	// A fresh kvselect on another collector port: it learns by replay only.
	fresh := startKvselect(t, kvselectOptions{collector: true, workersFile: wf})
	for pi, p := range prompts {
		owner := uint64(pi%3 + 1)
		want := len(p) / blockSize
		proctest.Eventually(t, fmt.Sprintf("prompt %d on worker %d in both", pi, owner), settle, func() bool {
			return restarted.overlaps(p)[owner] == want && fresh.overlaps(p)[owner] == want
		})
	}
	for pi, p := range prompts {
		a, b := restarted.overlaps(p), fresh.overlaps(p)
		for w := range uint64(3) {
			if a[w+1] != b[w+1] {
				t.Fatalf("prompt %d worker %d: restarted kvselect holds %d blocks, a fresh replay %d", pi, w+1, a[w+1], b[w+1])
			}
		}
	}
	for _, kv := range []*kvselect{restarted, fresh} {
		if v := kv.metric("kvselect_kv_events_lost_batches_total", ""); v != 0 {
			t.Errorf("lost batches %v, want 0", v)
		}
		if v := kv.metric("kvselect_kv_events_rejected_total", ""); v != 0 {
			t.Errorf("rejected events %v, want 0", v)
		}
	}
}

// TestSimulatorRestartSamePort: a simulator restarted on the same ports
// starts its sequence again at 1 with an empty cache, behind the same
// collector connection kvselect keeps bound. kvselect recognizes the restart
// from the run of batches below its watermark, drops the old engine's blocks
// and catches up on the new stream: the index then holds exactly the new
// engine's blocks, with no re-registration. Dynamo's documented remedy
// (DELETE, then POST) still gives the same index.
func TestSimulatorRestartSamePort(t *testing.T) {
	peerproc.SimBinary(t)
	k := startKvselect(t, kvselectOptions{collector: true})
	s := startSim(t, k.collect, simOptions{})
	k.register(s, 1)
	old := prompt(1, 5*blockSize)
	// Enough batches that the old watermark is above the new engine's first ones.
	for i := range 6 {
		complete(t, s, prompt(100+i, 2*blockSize))
		time.Sleep(1100 * time.Millisecond)
	}
	complete(t, s, old)
	proctest.Eventually(t, "the old prompt indexed", settle, func() bool { return k.overlaps(old)[1] == 5 })
	cfg := s.Config()
	s.Stop()
	restarted := startSimWith(t, cfg)
	fresh := prompt(2, 3*blockSize)
	complete(t, restarted, fresh)
	// The simulator flushes a batch a second: keep it publishing until three
	// of them have shown the restart.
	n := 0
	proctest.Eventually(t, "the restart recognized and the new engine's blocks indexed", settle, func() bool {
		if k.metric("kvselect_kv_events_publisher_restarts_total", "") < 1 {
			n++
			complete(t, restarted, prompt(300+n, blockSize))
			return false
		}
		return k.overlaps(fresh)[1] == 3
	})
	if got := k.overlaps(old)[1]; got != 0 {
		t.Fatalf("the old engine's blocks survived its restart: %d", got)
	}
	if lost := k.metric("kvselect_kv_events_lost_batches_total", ""); lost != 0 {
		t.Fatalf("%v batches lost catching up on the restarted engine", lost)
	}
	// The documented remedy gives the same index.
	if code := k.do(http.MethodDelete, "/workers/1", nil, nil); code != http.StatusOK {
		t.Fatalf("DELETE: %d", code)
	}
	k.register(restarted, 1)
	proctest.Eventually(t, "the new engine's blocks after re-registration", settle, func() bool {
		return k.overlaps(fresh)[1] == 3
	})
	if got := k.overlaps(old)[1]; got != 0 {
		t.Fatalf("the old engine's blocks came back with the re-registration: %d", got)
	}
	if cached := complete(t, restarted, old); cached != 0 {
		t.Fatalf("the restarted simulator still had the old prompt (%d cached tokens)", cached)
	}
}

// TestSmallCacheEviction: with a KV cache of 20 blocks the simulator evicts
// constantly, across requests and inside concurrent ones (and, at some
// sizes, its eviction has been seen to leave holes in a chain and send a
// BlockStored with a parent it no longer holds; kvselect counts such events
// as rejected, as engines/kvlisten's tests show with crafted ones). kvselect
// survives it and never claims more of a prompt than the simulator then
// serves from its cache.
func TestSmallCacheEviction(t *testing.T) {
	peerproc.SimBinary(t)
	k := startKvselect(t, kvselectOptions{collector: true})
	s := startSim(t, k.collect, simOptions{kvCacheSize: 20})
	k.register(s, 1)
	// Rounds of three concurrent prompts of 5 to 7 blocks with shared
	// prefixes, then a sequential run of 15-block ones: together they need
	// more than the cache, so storing them evicts blocks of other chains,
	// and of chains still being stored. The simulator refuses a request its
	// cache cannot hold at all (500, "insufficient capacity"); that is its
	// answer, not a failure here.
	for round := range 4 {
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				if _, err := tryComplete(s, prompt((round+i)%5, (5+i)*blockSize)); err != nil && !strings.Contains(err.Error(), "capacity") {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	for i := range 5 {
		complete(t, s, prompt(10+i%3, 15*blockSize))
	}
	time.Sleep(1500 * time.Millisecond)
	claimsAbove, hits := 0, 0
	for i := range 8 {
		p := prompt(i%4+9*(i%2), (3+i%12)*blockSize+5)
		// Settle: what the last request stored or evicted reaches the index.
		time.Sleep(1200 * time.Millisecond)
		claim := k.overlaps(p)[1]
		cached := complete(t, s, p)
		if cached > 0 {
			hits++
		}
		if claim*blockSize > cached {
			claimsAbove++
			t.Logf("prompt %d: kvselect claims %d blocks, the simulator served %d cached tokens", i, claim, cached)
		}
	}
	if hits == 0 {
		t.Fatal("no prompt found a cached prefix: the check above says nothing")
	}
	if claimsAbove > 0 {
		t.Fatalf("%d of 8 prompts: kvselect claimed blocks the simulator no longer had", claimsAbove)
	}
	resp, err := http.Get(k.rest + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("kvselect unhealthy after the eviction storm: %v", err)
	}
	resp.Body.Close()
	t.Logf("rejected events (the simulator's broken chains): %v", k.metric("kvselect_kv_events_rejected_total", ""))
}
