package httpadmin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// ---- workers: POST, GET, PATCH and DELETE /workers ----

// workerBody is the POST /workers body: a catalog.Record whose server-computed
// fields are shadowed, because Dynamo's WorkerRequest has no lifecycle or
// not_schedulable_reasons and ignores them like any unknown field — so a client
// may send back a record it got from GET /workers, whatever those fields hold.
type workerBody struct {
	catalog.Record
	Lifecycle             json.RawMessage `json:"lifecycle"`
	NotSchedulableReasons json.RawMessage `json:"not_schedulable_reasons"`
	EngineMetrics         json.RawMessage `json:"engine_metrics"`
	Health                json.RawMessage `json:"health"`
}

type workerIDProbe struct {
	WorkerID json.RawMessage `json:"worker_id"`
}

func (s *server) upsertWorker(w http.ResponseWriter, r *http.Request) {
	var body workerBody
	ok := s.readJSON(w, r, &body, func(raw []byte) error {
		var p workerIDProbe
		_ = json.Unmarshal(raw, &p) // raw already decoded without error
		if err := required(p.WorkerID, "", "worker_id", "u64"); err != nil {
			return err
		}
		if err := oneOf(body.KVTransferEnforcement, "kv_transfer_enforcement", catalog.KVTransferEnforcements...); err != nil {
			return err
		}
		return oneOf(body.Engine, "engine", catalog.Engines...)
	})
	if !ok {
		return
	}
	rec, err := s.svc.UpsertWorker(r.Context(), body.Record)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, rec)
}

func (s *server) patchWorker(w http.ResponseWriter, r *http.Request) {
	id, ok := parseWorkerID(w, r)
	if !ok {
		return
	}
	var p catalog.Patch
	if !s.readJSON(w, r, &p, func([]byte) error {
		if err := oneOf(p.KVTransferEnforcement, "kv_transfer_enforcement", catalog.KVTransferEnforcements...); err != nil {
			return err
		}
		return oneOf(p.Engine, "engine", catalog.Engines...)
	}) {
		return
	}
	rec, err := s.svc.PatchWorker(r.Context(), id, p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// healthReport is POST /workers/{worker_id}/health_report's body.
type healthReport struct {
	OK     *bool  `json:"ok"`
	Detail string `json:"detail"`
}

// maxHealthDetail bounds the failure text a caller can make kvselect keep.
const maxHealthDetail = 256

// reportHealth records one request's outcome on a worker (kvselect's
// extension for callers that route themselves, such as Ray: the picker
// reports the responses it sees on its own).
func (s *server) reportHealth(w http.ResponseWriter, r *http.Request) {
	id, ok := parseWorkerID(w, r)
	if !ok {
		return
	}
	var body healthReport
	if !s.readJSON(w, r, &body, func(raw []byte) error {
		var p struct {
			OK json.RawMessage `json:"ok"`
		}
		_ = json.Unmarshal(raw, &p) // raw already decoded without error
		return required(p.OK, "", "ok", "a boolean")
	}) {
		return
	}
	detail := body.Detail
	if len(detail) > maxHealthDetail {
		detail = strings.ToValidUTF8(detail[:maxHealthDetail], "")
	}
	tr, err := s.svc.ReportOutcome(id, selection.Outcome{OK: *body.OK, Detail: detail, Source: "report"})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resp := healthReportResponse{WorkerID: id, Transition: transitionName(tr), Health: catalog.HealthView{State: selection.HealthHealthy}}
	if h := s.svc.Inspect().WorkerHealth(id); h != nil {
		resp.Health = *h
	}
	writeJSON(w, http.StatusOK, resp)
}

type healthReportResponse struct {
	WorkerID   uint64             `json:"worker_id"`
	Transition string             `json:"transition"`
	Health     catalog.HealthView `json:"health"`
}

func transitionName(t selection.HealthTransition) string {
	switch t {
	case selection.HealthEjection:
		return "ejected"
	case selection.HealthRestoration:
		return "restored"
	}
	return "none"
}

func (s *server) deleteWorker(w http.ResponseWriter, r *http.Request) {
	id, ok := parseWorkerID(w, r)
	if !ok {
		return
	}
	rec, err := s.svc.DeleteWorker(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

func (s *server) listWorkers(w http.ResponseWriter, r *http.Request) {
	model, group := filters(r)
	writeJSON(w, http.StatusOK, s.svc.Workers(model, group))
}

// parseWorkerID parses {worker_id} as axum's Path<u64> does (Rust's
// u64::from_str, which takes one leading '+'). Deliberate difference: a bad id
// gets axum's status (400) and axum's text, but inside the JSON envelope
// instead of axum's text/plain body. Every other non-2xx answer of this API is
// {"error": ...}, and a client that decodes error bodies as JSON would choke on
// the one plain-text exception; a client that only reads the status or the
// text loses nothing.
func parseWorkerID(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	raw := r.PathValue("worker_id")
	id, err := strconv.ParseUint(strings.TrimPrefix(raw, "+"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Invalid URL: Cannot parse `%s` to a `u64`", raw), nil)
		return 0, false
	}
	return id, true
}

// filters reads the model_name and routing_group query filters of GET /workers
// and GET /loads: independent, exact match, absent = any; other query
// parameters are ignored, as in Dynamo.
func filters(r *http.Request) (model, group *string) {
	q := r.URL.Query()
	if v, ok := q["model_name"]; ok {
		model = &v[0]
	}
	if v, ok := q["routing_group"]; ok {
		group = &v[0]
	}
	return model, group
}

// ---- liveness and readiness: GET /health, GET /ready ----

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if !s.svc.Health() {
		writeError(w, http.StatusServiceUnavailable, "unhealthy", nil)
		return
	}
	writeJSON(w, http.StatusOK, statusOK)
}

func (s *server) ready(w http.ResponseWriter, r *http.Request) {
	st := s.svc.Ready()
	code := http.StatusOK
	if !st.Ready {
		code = http.StatusServiceUnavailable // with the same body, as Dynamo answers
	}
	writeJSON(w, code, st)
}

// ---- selection: POST /select, POST /select_and_reserve ----

// selectProbe captures the required fields of the optional sub-objects of a
// select body, which encoding/json cannot tell absent from zero.
type selectProbe struct {
	SessionContext *struct {
		SessionID json.RawMessage `json:"session_id"`
	} `json:"session_context"`
	AffinityTarget *struct {
		WorkerID json.RawMessage `json:"worker_id"`
	} `json:"affinity_target"`
	PinnedWorker *struct {
		WorkerID json.RawMessage `json:"worker_id"`
		DPRank   json.RawMessage `json:"dp_rank"`
	} `json:"pinned_worker"`
}

// checkSelect holds the wire rules of SelectRequest that serde enforces while
// decoding (422): required fields of sub-objects, the input_trigger enum and
// router_config_override validation.
func checkSelect(req *selection.SelectRequest) func([]byte) error {
	return func(body []byte) error {
		req.RequestBytes = len(body) // flow control's queue byte limits
		if err := checkOverride(req.RouterConfigOverride); err != nil {
			return err
		}
		if req.SessionContext == nil && req.AffinityTarget == nil && req.PinnedWorker == nil {
			return nil // the common case: no second pass over the body
		}
		var p selectProbe
		_ = json.Unmarshal(body, &p)
		if p.SessionContext != nil {
			if err := required(p.SessionContext.SessionID, "session_context", "session_id", "a string"); err != nil {
				return err
			}
		}
		if p.AffinityTarget != nil {
			if err := required(p.AffinityTarget.WorkerID, "affinity_target", "worker_id", "u64"); err != nil {
				return err
			}
		}
		if p.PinnedWorker != nil {
			if err := required(p.PinnedWorker.WorkerID, "pinned_worker", "worker_id", "u64"); err != nil {
				return err
			}
			if err := required(p.PinnedWorker.DPRank, "pinned_worker", "dp_rank", "u32"); err != nil {
				return err
			}
		}
		if sc := req.SessionContext; sc != nil {
			// Enums are checked while decoding, as serde does (422), before the
			// Service sees them.
			return oneOf(sc.InputTrigger, "session_context.input_trigger", selection.InputTriggers...)
		}
		return nil
	}
}

// checkOverride runs router_config_override validation at decode time, where
// Dynamo runs it (invalid values fail serde decoding: 422, not the Service's
// 400).
func checkOverride(o *routerconfig.Override) error {
	if o == nil {
		return nil
	}
	if err := o.Validate(); err != nil {
		return shapef("router_config_override: %s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}

// readSelect reads a /select or /select_and_reserve body; with a Tokenizer,
// a prompt given as text is tokenized here (text.go).
func (s *server) readSelect(w http.ResponseWriter, r *http.Request) (*selection.SelectRequest, bool) {
	req := new(selection.SelectRequest)
	check := checkSelect(req)
	var treq *selection.TokenizeRequest
	if s.tokenizer != nil {
		check = func(body []byte) error {
			if err := checkSelect(req)(body); err != nil {
				return err
			}
			var err error
			treq, err = readText(req, body)
			return err
		}
	}
	if !s.readJSON(w, r, req, check) {
		return nil, false
	}
	if treq != nil {
		if ids, err := s.tokenizer.Tokenize(r.Context(), treq); err == nil {
			req.TokenIDs = ids
		}
	}
	return req, true
}

func (s *server) selectOnly(w http.ResponseWriter, r *http.Request) {
	_, parse := s.span(r.Context(), tracing.SpanParse)
	req, ok := s.readSelect(w, r)
	parse.End()
	if !ok {
		return
	}
	req.PolicyClass = policyClass(r)
	ctx, sel := s.span(r.Context(), tracing.SpanSelect)
	resp, err := s.svc.Select(ctx, req)
	selected(sel, resp, err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *server) selectAndReserve(w http.ResponseWriter, r *http.Request) {
	_, parse := s.span(r.Context(), tracing.SpanParse)
	req, ok := s.readSelect(w, r)
	parse.End()
	if !ok {
		return
	}
	req.Advisory = false // not a field of Dynamo's SelectAndReserveRequest: ignored
	req.PolicyClass = policyClass(r)
	// The request context goes in: a client that disconnects while queued or
	// before the reservation is installed gets its booking freed, as in Dynamo.
	ctx, sel := s.span(r.Context(), tracing.SpanSelect)
	resp, err := s.svc.SelectAndReserve(ctx, req)
	selected(sel, resp, err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if resp.SelectionID != nil {
		s.estimateEnd(r.Context(), *resp.SelectionID)
	}
	writeJSON(w, http.StatusOK, resp)
}

// estimateEnd keeps booking id to its estimated end (Options.EstimateEnds).
// The booking stands either way: a failure (the caller freed it already)
// is logged, not answered.
func (s *server) estimateEnd(ctx context.Context, id string) {
	if !s.opts.EstimateEnds {
		return
	}
	if _, err := s.svc.EndByEstimate(ctx, id, 0); err != nil {
		s.log.Debug("booking not kept to an estimated end", "selection_id", id, "err", err)
	}
}

// ---- reservations: POST /reservations and the booking lifecycle ----

type selectionIDProbe struct {
	SelectionID json.RawMessage `json:"selection_id"`
}

func (s *server) reserve(w http.ResponseWriter, r *http.Request) {
	req := new(selection.ReservationRequest)
	if !s.readJSON(w, r, req, func(body []byte) error {
		if req.SelectionID == nil { // absent or null: both 422 in serde, told apart
			var p selectionIDProbe
			_ = json.Unmarshal(body, &p)
			return required(p.SelectionID, "", "selection_id", "a string")
		}
		return checkOverride(req.RouterConfigOverride)
	}) {
		return
	}
	resp, err := s.svc.Reserve(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.estimateEnd(r.Context(), resp.SelectionID)
	writeJSON(w, http.StatusCreated, resp)
}

// prefillComplete reads no body (Dynamo's handler has no body extractor), so
// any body and Content-Type are accepted.
func (s *server) prefillComplete(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.PrefillComplete(r.Context(), r.PathValue("reservation_id")); err != nil {
		s.fail(w, r, err)
		return
	}
	lifecycle(r, tracing.EventPrefillComplete)
	writeJSON(w, http.StatusOK, statusOK)
}

type outputBlockBody struct {
	DecayFraction *float64 `json:"decay_fraction"`
}

// outputBlock requires a JSON body ({} is fine), as Dynamo's Json extractor does.
func (s *server) outputBlock(w http.ResponseWriter, r *http.Request) {
	var body outputBlockBody
	if !s.readJSON(w, r, &body, nil) {
		return
	}
	if err := s.svc.OutputBlock(r.Context(), r.PathValue("reservation_id"), body.DecayFraction); err != nil {
		s.fail(w, r, err)
		return
	}
	lifecycle(r, tracing.EventOutputBlocks, attribute.Int("kvselect.added_blocks", 1))
	writeJSON(w, http.StatusOK, statusOK)
}

func (s *server) free(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Free(r.Context(), r.PathValue("reservation_id")); err != nil {
		s.fail(w, r, err)
		return
	}
	lifecycle(r, tracing.EventFreed, attribute.String("kvselect.at", "client"))
	writeJSON(w, http.StatusOK, statusOK)
}

// ---- inspection: GET /loads, POST /potential_loads, POST /overlap_scores,
// GET /dump ----

func (s *server) loads(w http.ResponseWriter, r *http.Request) {
	model, group := filters(r)
	writeJSON(w, http.StatusOK, s.svc.Inspect().Loads(model, group))
}

func (s *server) potentialLoads(w http.ResponseWriter, r *http.Request) {
	q := new(selection.PromptQuery)
	if !s.readJSON(w, r, q, func([]byte) error { return checkOverride(q.RouterConfigOverride) }) {
		return
	}
	out, err := s.svc.Inspect().PotentialLoads(r.Context(), q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) overlapScores(w http.ResponseWriter, r *http.Request) {
	q := new(selection.PromptQuery)
	if !s.readJSON(w, r, q, func([]byte) error { return checkOverride(q.RouterConfigOverride) }) {
		return
	}
	out, err := s.svc.Inspect().OverlapScores(r.Context(), q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// flowStatus is GET /flow: flow control's configuration and waiting
// requests (docs/flow-control.md).
type flowStatus struct {
	Enabled      bool    `json:"enabled"`
	Fairness     string  `json:"fairness,omitempty"`
	TTLSeconds   float64 `json:"queue_ttl_seconds,omitempty"`
	MaxBytes     int64   `json:"max_bytes,omitempty"`
	MaxBandBytes int64   `json:"max_band_bytes,omitempty"`
	MaxTenants   int     `json:"max_tenants,omitempty"`
	// Objectives are the known objective names and their priorities (the
	// pool's InferenceObjectives and the config file's objectives).
	Objectives map[string]int            `json:"objectives,omitempty"`
	Partitions []selection.PartitionFlow `json:"partitions"`
}

func (s *server) flow(w http.ResponseWriter, r *http.Request) {
	out := flowStatus{Partitions: s.svc.Inspect().FlowState()}
	if s.objectives != nil {
		out.Objectives = s.objectives.All()
	}
	if c := s.svc.Inspect().FlowConfig(); c != nil {
		out.Enabled, out.Fairness, out.TTLSeconds = true, c.Fairness.String(), c.TTL.Seconds()
		out.MaxBytes, out.MaxBandBytes, out.MaxTenants = c.MaxBytes, c.MaxBandBytes, c.MaxTenants
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) dump(w http.ResponseWriter, r *http.Request) {
	d := s.svc.Inspect().Dump()
	if d == nil {
		writeJSON(w, http.StatusOK, struct{}{})
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// ---- replica peers: /replica_sync/* ----

type peerBody struct {
	Endpoint json.RawMessage `json:"endpoint"`
}

// readPeer decodes {"endpoint": "..."}; endpoint is a required string.
func (s *server) readPeer(w http.ResponseWriter, r *http.Request) (string, bool) {
	var body peerBody
	var ep string
	ok := s.readJSON(w, r, &body, func([]byte) error {
		if err := required(body.Endpoint, "", "endpoint", "a string"); err != nil {
			return err
		}
		if err := json.Unmarshal(body.Endpoint, &ep); err != nil {
			return shapef("endpoint: invalid type: %s, expected a string", jsonKind(body.Endpoint))
		}
		return nil
	})
	return ep, ok
}

// peerReady applies Dynamo's order (replica_sync_http.rs): body first, then the
// disabled check (409), then endpoint syntax (400), then the manager.
func (s *server) peerReady(w http.ResponseWriter, ep string) bool {
	if s.peers == nil {
		writeError(w, http.StatusConflict, "replica sync is disabled", nil)
		return false
	}
	if err := catalog.ValidateZMQEndpoint(ep); err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), nil)
		return false
	}
	return true
}

func (s *server) registerPeer(w http.ResponseWriter, r *http.Request) {
	ep, ok := s.readPeer(w, r)
	if !ok || !s.peerReady(w, ep) {
		return
	}
	created, err := s.peers.Register(ep)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	writeJSON(w, code, statusOK)
}

func (s *server) deregisterPeer(w http.ResponseWriter, r *http.Request) {
	ep, ok := s.readPeer(w, r)
	if !ok || !s.peerReady(w, ep) {
		return
	}
	if err := s.peers.Deregister(ep); err != nil {
		// Errors are mapped like the service's, by kind: an unknown peer is
		// KindNotFound, 404.
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, statusOK)
}

func (s *server) listPeers(w http.ResponseWriter, r *http.Request) {
	peers := []string{}
	if s.peers != nil {
		if p := s.peers.Peers(); p != nil {
			peers = p
		}
	}
	writeJSON(w, http.StatusOK, peers)
}

// ---- kvselect extension: GET /kv_events/collector ----

func (s *server) kvEventsCollector(w http.ResponseWriter, r *http.Request) {
	st, ok := s.svc.Inspect().KVEventsCollector()
	if !ok {
		writeError(w, http.StatusNotFound, "no kv events collector socket is bound (--kv-events-bind)", nil)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// jsonKind names the JSON value that starts raw, as serde's "invalid type".
func jsonKind(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "map"
	case '[':
		return "sequence"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
