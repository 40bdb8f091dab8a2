package httpadmin

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/kvselect/kvselect/selection/latency"
)

// policyView is GET /policy: the online latency model the predicted-latency
// policy ranks with (fitted whatever the policy in force, so switching to it
// starts calibrated).
type policyView struct {
	LatencyModel latencyModelView `json:"latency_model"`
}

type latencyModelView struct {
	Prior           coeffsView            `json:"prior"`
	Pooled          map[string]coeffsView `json:"pooled"`
	Workers         []workerCoeffsView    `json:"workers"`
	PredictionError predictionErrorView   `json:"prediction_error"`
}

type workerCoeffsView struct {
	ModelName string `json:"model_name"`
	WorkerID  uint64 `json:"worker_id"`
	DPRank    uint32 `json:"dp_rank"`
	// Concurrency is the requests its engine runs at once, as estimated
	// (the most seen decoding together; 0: not seen yet).
	Concurrency int `json:"estimated_concurrency"`
	coeffsView
}

// coeffsView names each coefficient by what it prices, in seconds.
type coeffsView struct {
	TTFT struct {
		Base                   float64 `json:"base_seconds"`
		PerUncachedKTokens     float64 `json:"per_uncached_ktokens_seconds"`
		PerPrefillAheadKTokens float64 `json:"per_prefill_ahead_ktokens_seconds"`
		PerQueuedRequest       float64 `json:"per_queued_request_seconds"`
		PerRunningRequest      float64 `json:"per_running_request_seconds"`
		PerPoolRequest         float64 `json:"per_pool_request_per_rank_seconds"`
		PerKVUsage             float64 `json:"per_kv_usage_seconds"`
	} `json:"ttft"`
	ITL struct {
		Base              float64 `json:"base_seconds"`
		PerRunningRequest float64 `json:"per_running_request_seconds"`
	} `json:"itl"`
	TTFTObservations int `json:"ttft_observations"`
	ITLObservations  int `json:"itl_observations"`
	// DriftResets counts the drifts the engines' histograms confirmed
	// (a pooled fit's; 0 elsewhere).
	DriftResets int    `json:"drift_resets"`
	Source      string `json:"source"`
}

type predictionErrorView struct {
	Observed    int64   `json:"observed"`
	Window      int     `json:"window"`
	RelativeP50 float64 `json:"relative_p50"`
	RelativeP90 float64 `json:"relative_p90"`
	RatioP50    float64 `json:"predicted_over_observed_p50"`
}

func viewCoeffs(c latency.Coeffs) coeffsView {
	var v coeffsView
	t := &v.TTFT
	t.Base, t.PerUncachedKTokens, t.PerPrefillAheadKTokens, t.PerQueuedRequest, t.PerRunningRequest, t.PerPoolRequest, t.PerKVUsage =
		c.TTFT[0], c.TTFT[1], c.TTFT[2], c.TTFT[3], c.TTFT[4], c.TTFT[5], c.TTFT[6]
	v.ITL.Base, v.ITL.PerRunningRequest = c.ITL[0], c.ITL[1]
	v.TTFTObservations, v.ITLObservations, v.DriftResets, v.Source = c.TTFTObservations, c.ITLObservations, c.DriftResets, c.Source
	return v
}

func (s *server) policy(w http.ResponseWriter, r *http.Request) {
	m := s.svc.Inspect().LatencyModel()
	out := latencyModelView{Prior: viewCoeffs(m.Prior), Pooled: make(map[string]coeffsView, len(m.Pooled)),
		Workers: make([]workerCoeffsView, 0, len(m.Workers))}
	for name, c := range m.Pooled {
		out.Pooled[name] = viewCoeffs(c)
	}
	for _, wv := range m.Workers {
		out.Workers = append(out.Workers, workerCoeffsView{ModelName: wv.Model, WorkerID: wv.Worker, DPRank: wv.Rank, Concurrency: wv.Concurrency,
			coeffsView: viewCoeffs(wv.Coeffs)})
	}
	slices.SortFunc(out.Workers, func(a, b workerCoeffsView) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
	})
	e := m.Errors
	out.PredictionError = predictionErrorView{Observed: e.Observed, Window: e.Window, RelativeP50: e.RelativeP50,
		RelativeP90: e.RelativeP90, RatioP50: e.Ratio}
	writeJSON(w, http.StatusOK, policyView{LatencyModel: out})
}
