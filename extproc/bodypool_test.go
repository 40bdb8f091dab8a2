package extproc_test

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
)

// Long bodies' buffers are handed from one request to the next: concurrent
// streams with long bodies of different lengths, many rounds, must each
// forward exactly their own body, in both modes that hold it. A buffer
// given back before its echo was encoded, or handed to two streams at once,
// shows as another request's bytes in a forwarded body.
func TestLongBodiesForwardIntactWhileBuffersAreReused(t *testing.T) {
	for _, modes := range []envoysim.Modes{envoysim.GIE, {Request: envoysim.Buffered, Response: envoysim.Buffered}} {
		t.Run(modes.Request.String(), func(t *testing.T) {
			h := start(t, setup{})
			const streams, rounds = 4, 6
			var wg sync.WaitGroup
			for s := range streams {
				wg.Go(func() {
					for r := range rounds {
						// 40k–60k ids: 200–400 KB bodies, over the pooling threshold,
						// each a different length and content.
						n := 40_000 + 5_000*s + 1_000*r
						body := idsBody(n, s*rounds+r)
						x, d := h.start(t, &envoysim.Request{Modes: modes, Body: body})
						if d.Immediate != nil {
							t.Errorf("stream %d round %d: immediate %d %s", s, r, d.Immediate.Status, d.Immediate.Body)
							return
						}
						if modes == envoysim.GIE && !bytes.Equal(d.Body, body) {
							t.Errorf("stream %d round %d: forwarded %d bytes that differ from its %d-byte body (first difference at %d)", s, r, len(d.Body), len(body), firstDiff(d.Body, body))
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

// idsBody is a completions body of n token ids, seeded so no two are alike.
func idsBody(n, seed int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"prompt":[`, model)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa((i*7919 + seed*104729) % 151_000))
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
