package mockworker

import (
	"context"
	"testing"
)

// BenchmarkGenerate measures the engine's own cost per request with the
// timing model off (zero times): what a simulation driving many in-process
// workers pays. Prompts share a 512-token prefix and add 64 tokens of their
// own; 16 output tokens; pools of 1024 blocks, so eviction runs too.
func BenchmarkGenerate(b *testing.B) {
	w, err := New(Config{BlockSize: 16, NumBlocks: 1024, Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	prefix := toks(1000, 512)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		prompt := append(append(make([]uint32, 0, 576), prefix...), toks(2000+64*(i%400), 64)...)
		i++
		if _, err := w.Generate(ctx, Request{Tokens: prompt, MaxTokens: 16}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
}
