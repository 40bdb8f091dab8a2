package inferencepool

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// BenchmarkWorkers1000Pods is one sync pass's mapping: every pod event
// recomputes the whole pool, so this bounds the cost of an event.
func BenchmarkWorkers1000Pods(b *testing.B) {
	pods := make([]corev1.Pod, 1000)
	for i := range pods {
		pods[i] = pod(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250), model(AnnotationDPSize, "2"))
	}
	p := pool(8000, 8001)
	b.ReportAllocs()
	for b.Loop() {
		if len(Workers(p, pods)) != 2000 {
			b.Fatal("wrong count")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/pod")
}
