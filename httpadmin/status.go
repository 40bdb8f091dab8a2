package httpadmin

import (
	"embed"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
)

// The status page: static assets embedded in the binary (no CDN, no build
// step) and one JSON document its script polls.
//
//go:embed ui
var uiFiles embed.FS

// uiPath is where the page lives; ServeHTTP lets its trailing slash through.
const uiPath = "/ui/"

// maxStatusDecisions bounds the decisions one status document carries.
const maxStatusDecisions = 100

// statusDoc is GET /ui/api/status: everything the page shows, in one read.
type statusDoc struct {
	Time      time.Time                  `json:"time"`
	Workers   []*catalog.Record          `json:"workers"`
	Loads     []selection.ModelLoad      `json:"loads"`
	Routing   []routingRow               `json:"routing"`
	Decisions []selection.DecisionRecord `json:"decisions"`
	// ReplicaSync says the replica mesh runs; Peers are its connected peers.
	ReplicaSync bool     `json:"replica_sync"`
	Peers       []string `json:"peers"`
	// Collector is the KV events collector socket's status, null when none
	// is bound.
	Collector any `json:"collector"`
}

// routingRow is one partition's routing-quality totals since start.
type routingRow struct {
	Model        string `json:"model"`
	RoutingGroup string `json:"routing_group"`
	Decisions    uint64 `json:"decisions"`
	PromptTokens uint64 `json:"prompt_tokens"`
	CachedTokens uint64 `json:"cached_tokens"`
	// BestCachedTokens is what the best-cached candidates had cached.
	BestCachedTokens uint64 `json:"best_cached_tokens"`
}

func (s *server) statusPage() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		// The page loads nothing from elsewhere; say so to the browser.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	})
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	n := maxStatusDecisions
	if v := r.URL.Query().Get("decisions"); v != "" {
		d, err := strconv.Atoi(v)
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, "decisions: want a count from 0", nil)
			return
		}
		n = min(d, maxStatusDecisions)
	}
	doc := statusDoc{
		Time: time.Now().UTC(), Workers: s.svc.Workers(nil, nil), Loads: s.svc.Inspect().Loads(nil, nil),
		Routing: []routingRow{}, Decisions: []selection.DecisionRecord{}, Peers: []string{},
	}
	if n > 0 {
		if d := s.svc.Inspect().RecentDecisions(n); d != nil {
			doc.Decisions = d
		}
	}
	for _, p := range s.svc.Inspect().RoutingStats() {
		doc.Routing = append(doc.Routing, routingRow{Model: p.Model, RoutingGroup: p.RoutingGroup,
			Decisions: p.Decisions, PromptTokens: p.PromptTokens, CachedTokens: p.CachedTokens, BestCachedTokens: p.BestCachedTokens})
	}
	if s.peers != nil {
		doc.ReplicaSync = true
		if p := s.peers.Peers(); p != nil {
			doc.Peers = p
		}
	}
	if st, ok := s.svc.Inspect().KVEventsCollector(); ok {
		doc.Collector = st
	}
	writeJSON(w, http.StatusOK, doc)
}
