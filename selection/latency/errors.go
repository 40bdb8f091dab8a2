package latency

import (
	"math"
	"slices"
)

// errorWindowSize bounds the recent predictions the error summary reads:
// memory independent of how many requests were served.
const errorWindowSize = 1024

// errorWindow keeps the last predictions and what was observed for them.
type errorWindow struct {
	pred, obs [errorWindowSize]float64
	n, next   int
	total     int64
}

func (w *errorWindow) add(predicted, observed float64) {
	w.pred[w.next], w.obs[w.next] = predicted, observed
	w.next = (w.next + 1) % errorWindowSize
	w.n = min(w.n+1, errorWindowSize)
	w.total++
}

// ErrorSummary describes how far the recent TTFT predictions were from what
// was observed.
type ErrorSummary struct {
	// Observed is how many predictions were checked in all; Window how many
	// of the latest the figures below cover.
	Observed int64
	Window   int
	// RelativeP50 and RelativeP90 are quantiles of |predicted − observed| /
	// observed (observed floored at 1 ms).
	RelativeP50, RelativeP90 float64
	// Ratio is the median of predicted / observed: above 1 the model
	// predicts slower than the engines are, below 1 faster.
	Ratio float64
}

// RelativeError is |predicted − observed| / observed, with observed floored
// at 1 ms so a near-zero observation does not make the error infinite.
func RelativeError(predicted, observed float64) float64 {
	return math.Abs(predicted-observed) / math.Max(observed, 0.001)
}

func (w *errorWindow) summary() ErrorSummary {
	s := ErrorSummary{Observed: w.total, Window: w.n}
	if w.n == 0 {
		return s
	}
	rel := make([]float64, w.n)
	ratio := make([]float64, w.n)
	for i := range w.n {
		rel[i] = RelativeError(w.pred[i], w.obs[i])
		ratio[i] = w.pred[i] / math.Max(w.obs[i], 0.001)
	}
	slices.Sort(rel)
	slices.Sort(ratio)
	q := func(v []float64, p float64) float64 { return v[min(int(p*float64(len(v))), len(v)-1)] }
	s.RelativeP50, s.RelativeP90, s.Ratio = q(rel, 0.5), q(rel, 0.9), q(ratio, 0.5)
	return s
}
