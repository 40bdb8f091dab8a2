package extproc_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/selection"
)

// Long bodies' buffers and their token id arrays are handed from one request
// to the next: concurrent streams with long bodies of different lengths,
// many rounds, must each forward exactly their own body, in both modes that
// hold it, and be booked under their own prompt. A buffer given back before
// its echo was encoded, or handed to two streams at once, shows as another
// request's bytes in a forwarded body; an id array given back before it was
// hashed, as a prompt the index does not hold where the request was routed
// (the index learns each routed prompt's blocks, there being no engines).
func TestLongBodiesForwardIntactWhileBuffersAreReused(t *testing.T) {
	for _, modes := range []envoysim.Modes{envoysim.GIE, {Request: envoysim.Buffered, Response: envoysim.Buffered}} {
		t.Run(modes.Request.String(), func(t *testing.T) {
			h := start(t, setup{})
			const streams, rounds = 8, 6
			var wg sync.WaitGroup
			for s := range streams {
				wg.Go(func() {
					for r := range rounds {
						// 40k–60k ids: 200–400 KB bodies, over the pooling threshold,
						// each a different length and content.
						n := 40_000 + 5_000*s + 1_000*r
						ids := promptIDs(n, s*rounds+r)
						body := idsBody(ids)
						x, d := h.start(t, &envoysim.Request{Modes: modes, Body: body})
						if d.Immediate != nil {
							t.Errorf("stream %d round %d: immediate %d %s", s, r, d.Immediate.Status, d.Immediate.Body)
							return
						}
						if modes == envoysim.GIE && !bytes.Equal(d.Body, body) {
							t.Errorf("stream %d round %d: forwarded %d bytes that differ from its %d-byte body (first difference at %d)", s, r, len(d.Body), len(body), firstDiff(d.Body, body))
						}
						if held := heldBlocks(t, h, ids, workerIDOf(d)); held != n/blockSize {
							t.Errorf("stream %d round %d: the worker it was routed to holds %d of its %d blocks", s, r, held, n/blockSize)
						}
						x.Close()
					}
				})
			}
			wg.Wait()
			h.idle(t)
		})
	}
}

// promptIDs is a prompt of n token ids, seeded so no two are alike.
func promptIDs(n, seed int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32((i*7919 + seed*104729) % 151_000)
	}
	return ids
}

// idsBody is a completions body of the ids.
func idsBody(ids []uint32) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"prompt":[`, model)
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(id), 10))
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// heldBlocks is how many of the prompt's blocks the index says the worker
// (its id as the decision's header gives it) holds.
func heldBlocks(t *testing.T, h *harness, ids []uint32, worker string) int {
	t.Helper()
	scores, err := h.svc.Inspect().OverlapScores(context.Background(), &selection.PromptQuery{
		PartitionKey: selection.PartitionKey{ModelName: model}, PromptRequest: selection.PromptRequest{TokenIDs: ids}})
	if err != nil {
		t.Fatalf("overlap scores: %v", err)
	}
	for _, row := range scores.Workers {
		if strconv.FormatUint(row.WorkerID, 10) == worker {
			return int(row.DeviceBlocks)
		}
	}
	return 0
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
