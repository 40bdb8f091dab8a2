package extproc_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection/catalog"
)

// BenchmarkRequest is one whole request through the picker over loopback
// gRPC, as `kvbench extproc` drives it: headers + ~4 KB body
// (FULL_DUPLEX_STREAMED), the decision, response headers, 20 streamed chunks,
// Envoy's close. Parallel callers (-cpu, SetParallelism) share one
// connection; the envoysim client runs in the same process, so ns/op is the
// client's and the server's CPU together. KV events are on (production's
// default): token prompts are looked up, not recorded; text prompts are
// recorded in the text index, as always.
func BenchmarkRequest(b *testing.B) {
	for _, form := range []string{"tokens", "text"} {
		b.Run(form, func(b *testing.B) {
			ws := make([]catalog.Record, 64)
			for i := range ws {
				ws[i] = worker(uint64(i+1), fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250+1))
			}
			h := start(b, setup{workers: ws, kvEvents: true})
			bodies := make([][]byte, 64)
			for i := range bodies {
				if form == "tokens" {
					var sb strings.Builder
					fmt.Fprintf(&sb, `{"model":%q,"stream":true,"prompt":[`, model)
					for j := 0; sb.Len() < 4090; j++ {
						if j > 0 {
							sb.WriteByte(',')
						}
						fmt.Fprintf(&sb, "%d", (i%8)*100000+j)
					}
					sb.WriteString("]}")
					bodies[i] = []byte(sb.String())
				} else {
					bodies[i] = chatBody(fmt.Sprintf("system %d ", i%8)+strings.Repeat("word ", 800), true)
				}
			}
			chunks := sseChunks(19) // 19 tokens + [DONE] = 20 chunks
			var n atomic.Uint64
			b.SetParallelism(32) // 64 streams on 2 procs
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					x, d, err := h.client.Start(context.Background(), &envoysim.Request{Modes: envoysim.GIE, Body: bodies[i%64]})
					if err != nil || d.Immediate != nil {
						b.Fatal(err, d)
					}
					if _, err := x.ResponseHeaders(envoysim.Response{Served: d.Endpoint, Headers: sseHeaders()}, false); err != nil {
						b.Fatal(err)
					}
					for k, c := range chunks {
						if _, err := x.ResponseBody(c, k == len(chunks)-1); err != nil {
							b.Fatal(err)
						}
					}
					x.Close()
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
	_ = extproc.BodyChunkBytes
}
