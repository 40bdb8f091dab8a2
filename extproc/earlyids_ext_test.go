package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// TestLongPromptReadAsItArrives: a long prompt of ids streamed in chunks
// of any size (its ids read as they arrive) goes where its cached prefix
// is, as the same body sent whole (BUFFERED: read at the end) does; a
// fault late in its ids gets the same 400, with the same message.
func TestLongPromptReadAsItArrives(t *testing.T) {
	const workers, cachedOn = 8, 5
	ls := &captureListeners{ix: map[index.WorkerKey]*index.Index{}}
	ws := make([]catalog.Record, workers)
	for i := range ws {
		ws[i] = catalog.Record{WorkerID: uint64(i + 1), ModelName: model, Endpoint: ptr(fmt.Sprintf("http://10.3.0.%d:8000", i+1)),
			BlockSize: ptr(uint32(longBlockSize))}
	}
	h := start(t, setup{workers: ws, kvEvents: true, listeners: ls})
	rng := rand.New(rand.NewPCG(11, 12))
	prefix := longTokens(rng, 20_000)
	locals := kvhash.LocalBlockHashes(prefix, "", "", kvhash.BlockOptions{BlockSize: longBlockSize})
	blocks := make([]index.Block, len(locals))
	for i, l := range locals {
		blocks[i] = index.Block{Ext: uint64(i + 1), Local: l}
	}
	w := index.WorkerKey{WorkerID: cachedOn}
	if err := ls.index(w).Apply(&index.Event{Worker: w, Kind: index.EventStored, Blocks: blocks}); err != nil {
		t.Fatal(err)
	}
	body := longTokenBody(append(prefix[:len(prefix):len(prefix)], longTokens(rng, 2_000)...))
	late := len(body) - 100 // inside the last ids, after most chunks
	for k := late; body[k] != ','; k++ {
		late = k + 1
	}
	for _, c := range []struct {
		name  string
		fault string // replaces the comma at late; "" for none
		bad   bool   // the body is refused
	}{{"whole", "", false}, {"negative", ",-5,", true}, {"float", ",1.5,", true}, {"too large", ",4294967296,", true},
		{"leading zero", ",05,", true}, {"empty", ",,", true}, {"nine digits", ",123456789,", false}} {
		b := body
		if c.fault != "" {
			b = append(append(append([]byte{}, body[:late]...), c.fault...), body[late+1:]...)
		}
		whole := pickLong(t, h, b, envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.FullDuplexStreamed}, 0)
		if bad := strings.HasPrefix(whole, "400 "); bad != c.bad || (!bad && whole != "10.3.0.5:8000") {
			t.Fatalf("%s: whole body: %s", c.name, whole)
		}
		for _, chunk := range []int{envoysim.DefaultChunkSize, 1000, 333, 70_000} {
			if got := pickLong(t, h, b, envoysim.GIE, chunk); got != whole {
				t.Fatalf("%s in chunks of %d: %s; whole: %s", c.name, chunk, got, whole)
			}
		}
	}
}

// pickLong sends body and returns where it went, or the local reply.
func pickLong(t *testing.T, h *harness, body []byte, modes envoysim.Modes, chunk int) string {
	t.Helper()
	x, d, err := h.client.Start(context.Background(), &envoysim.Request{Modes: modes, Body: body, ChunkSize: chunk})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if d.Immediate != nil {
		return fmt.Sprintf("%d %s", d.Immediate.Status, d.Immediate.Body)
	}
	return d.Endpoint
}
