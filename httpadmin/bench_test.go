package httpadmin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// BenchmarkHTTPSelectAndReserveFree: POST /select_and_reserve of a 128-block
// prompt and DELETE /reservations/{id}, over loopback HTTP/1.1 with a
// keep-alive client, 64 workers, set up as selection's
// BenchmarkSelectAndReserveFree is (event-driven index, block size 16, half of
// 256 prompts cached on some worker, restored here through a /dump snapshot),
// so the difference between the two is the cost of the REST front: two
// loopback round trips, JSON decoding of a 2,048-token (or 128+128-hash) body,
// JSON encoding of the answer.
//
//	go test -run '^$' -bench HTTPSelectAndReserveFree -benchmem ./httpadmin/
func BenchmarkHTTPSelectAndReserveFree(b *testing.B) {
	rc := routerconfig.Default()
	svc, err := selection.New(selection.Config{Router: rc, Clock: time.Now, Rand: rand.New(rand.NewPCG(7, 8))})
	if err != nil {
		b.Fatal(err)
	}
	for id := range uint64(64) {
		ep, bs, kv := fmt.Sprintf("http://w%d:8000", id), uint32(16), uint64(16384)
		kvep := fmt.Sprintf("tcp://127.0.0.1:%d", 20000+id)
		r := catalog.Record{WorkerID: id, ModelName: "m", Endpoint: &ep, BlockSize: &bs, TotalKVBlocks: &kv, KVEventsEndpoint: &kvep}
		if rec, err := svc.UpsertWorker(b.Context(), r); err != nil || rec.Lifecycle != catalog.Schedulable {
			b.Fatalf("upsert: %+v %v", rec, err)
		}
	}
	srv := httptest.NewServer(New(svc, Options{}))
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64

	rng := rand.New(rand.NewPCG(1, 1))
	const prompts = 256
	tokens := make([][]uint32, prompts)
	var events []index.RouterEvent
	for i := range tokens {
		t := make([]uint32, 128*16)
		for j := range t {
			if j < 32*16 {
				t[j] = uint32(i%16*100000 + j) // 16 shared 32-block system prompts
			} else {
				t[j] = rng.Uint32()
			}
		}
		tokens[i] = t
		if i%2 == 1 {
			continue
		}
		locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: 16})
		blocks := make([]index.StoredBlock, len(locals))
		for k, l := range locals {
			blocks[k] = index.StoredBlock{BlockHash: index.Hash(l ^ 0x5555), TokensHash: index.Hash(l)}
		}
		events = append(events, index.RouterEvent{WorkerID: uint64(i % 64), StorageTier: "device",
			Event: index.KvCacheEvent{EventID: uint64(i), Data: index.EventData{Stored: &index.StoredData{Blocks: blocks}}}})
	}
	for _, res := range svc.Replica().Restore(index.Dump{index.PartitionKey("m", "default"): {BlockSize: 16, Events: events}}) {
		if res.Err != nil {
			b.Fatalf("restore: %+v", res)
		}
	}
	bodies := func(hashes bool) [][]byte {
		out := make([][]byte, prompts)
		for i, t := range tokens {
			req := map[string]any{"model_name": "m", "token_ids": t}
			if hashes {
				locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: 16})
				bh, sh := make([]int64, len(locals)), make([]int64, len(locals))
				for k, h := range kvhash.SequenceHashes(locals) {
					bh[k], sh[k] = int64(locals[k]), int64(h)
				}
				req = map[string]any{"model_name": "m", "block_hashes": bh, "sequence_hashes": sh, "isl_tokens": len(t)}
			}
			raw, _ := json.Marshal(req)
			out[i] = raw
		}
		return out
	}
	for _, c := range []struct {
		name   string
		hashes bool
	}{{"tokens", false}, {"hashes", true}} {
		b.Run(c.name, func(b *testing.B) {
			reqs := bodies(c.hashes)
			b.ReportAllocs()
			b.SetBytes(int64(len(reqs[0])))
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				id := post(b, client, srv.URL+"/select_and_reserve", reqs[i%prompts])
				del(b, client, srv.URL+"/reservations/"+id)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/pair")
		})
	}
}

func post(b *testing.B, c *http.Client, url string, body []byte) string {
	res, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b.Fatalf("%d %s", res.StatusCode, raw)
	}
	var out struct {
		SelectionID string `json:"selection_id"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		b.Fatal(err)
	}
	return out.SelectionID
}

func del(b *testing.B, c *http.Client, url string) {
	req, _ := http.NewRequest("DELETE", url, nil)
	res, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b.Fatal("free: " + strconv.Itoa(res.StatusCode))
	}
}
