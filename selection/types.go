package selection

import (
	"encoding/json"
	"time"

	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/routerconfig"
)

// The request and response types below are the wire bodies of Dynamo's
// selection API (lib/kv-router/src/services/selection/types.rs), shared by the
// REST and ext_proc fronts so that
// the same request gets the same answer through both. JSON names are exact.

// PartitionKey names a partition; both fields default to "default".
type PartitionKey struct {
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
}

// PromptRequest identifies a prompt: token ids (hashed here, bit-exact with
// Dynamo), or precomputed block hashes, sequence hashes and input length
// (trusted as sent).
type PromptRequest struct {
	TokenIDs       []uint32          `json:"token_ids"`
	MMRoutingInfo  *MMRoutingInfo    `json:"mm_routing_info"`
	BlockMMInfos   []*BlockExtraInfo `json:"block_mm_infos"`
	BlockHashes    []int64           `json:"block_hashes"`
	SequenceHashes []int64           `json:"sequence_hashes"`
	ISLTokens      *uint64           `json:"isl_tokens"`
	LoraName       *string           `json:"lora_name"`
	CacheSalt      *string           `json:"cache_salt"`
	IsEagle        *bool             `json:"is_eagle"`
	// PromptText is the prompt's text as a front flattened it (not a wire
	// field). Alone — none of the fields above set — it identifies the
	// prompt in the partition's text index (package textindex). Beside token ids
	// (a text prompt a Tokenizer turned into ids) the ids route, and a booking
	// also records the text's chain in the text index.
	PromptText string `json:"-"`
}

// MMRoutingInfo replaces token_ids for hashing when its tokens are non-empty.
type MMRoutingInfo struct {
	RoutingTokenIDs []uint32          `json:"routing_token_ids"`
	BlockMMInfos    []*BlockExtraInfo `json:"block_mm_infos"`
}

// BlockExtraInfo is one block's multimodal objects.
type BlockExtraInfo struct {
	MMObjects []MMObject `json:"mm_objects"`
}

// MMObject is one multimodal object in a block.
type MMObject struct {
	MMHash  uint64      `json:"mm_hash"`
	Offsets [][2]uint64 `json:"offsets"`
}

// WorkerRank names a (worker, dp rank) in requests.
type WorkerRank struct {
	WorkerID uint64 `json:"worker_id"`
	DPRank   uint32 `json:"dp_rank"`
}

// AffinityTarget steers selection to a worker, optionally a rank.
type AffinityTarget struct {
	WorkerID uint64  `json:"worker_id"`
	DPRank   *uint32 `json:"dp_rank"`
}

// RoutingConstraints filter and weight candidates by taint.
type RoutingConstraints struct {
	RequiredTaints  []string           `json:"required_taints"`
	PreferredTaints map[string]float64 `json:"preferred_taints"`
}

// SessionContext is the full session metadata a frontend hands to selection.
type SessionContext struct {
	SessionID       string              `json:"session_id"`
	ParentSessionID *string             `json:"parent_session_id,omitempty"`
	SessionFinal    *bool               `json:"session_final,omitempty"`
	InputTrigger    *string             `json:"input_trigger,omitempty"` // user_message, tool_result or other
	AgentHeaders    map[string][]string `json:"agent_headers,omitempty"`
}

// SelectRequest is the body of /select and /select_and_reserve.
type SelectRequest struct {
	PartitionKey
	SelectionID *string `json:"selection_id"`
	PromptRequest
	RouterConfigOverride *routerconfig.Override `json:"router_config_override"`
	ExpectedOutputTokens *uint32                `json:"expected_output_tokens"`
	PriorityJump         float64                `json:"priority_jump"`
	StrictPriority       uint32                 `json:"strict_priority"`
	SessionID            *string                `json:"session_id"`
	SessionContext       *SessionContext        `json:"session_context"`
	AffinityTarget       *AffinityTarget        `json:"affinity_target"`
	PinnedWorker         *WorkerRank            `json:"pinned_worker"`
	AllowedWorkerIDs     []uint64               `json:"allowed_worker_ids"`
	RoutingConstraints   *RoutingConstraints    `json:"routing_constraints"`
	Advisory             bool                   `json:"advisory"`
	// PolicyClass is the x-dynamo-meta-policy-class header (not a body field).
	PolicyClass string `json:"-"`
	// Fallbacks asks for up to this many ordered alternatives to the chosen
	// rank in SelectResponse.Fallbacks (ext_proc's fallback endpoints; not a
	// wire field).
	Fallbacks int `json:"-"`
	// Disaggregated asks for a prefill/decode decision (not a Dynamo field):
	// the selection is the decode worker, and the response says whether the
	// prompt is prefilled remotely on a worker of the model's prefill routing
	// group (SelectResponse.Prefill) or locally on the decode worker, and why
	// (disagg.go). Without it a request is answered exactly as Dynamo's
	// service answers it, whatever groups the model has.
	Disaggregated bool `json:"disaggregated,omitempty"`
	// Priority is the request's flow control band (not a Dynamo field; GIE's
	// InferenceObjective priority): higher waits less, negative is sheddable.
	// Unset, strict_priority is the band.
	Priority *int `json:"priority,omitempty"`
	// Tenant shares a band fairly with the other tenants under flow control
	// (not a Dynamo field; GIE's x-gateway-inference-fairness-id); empty is
	// flow.DefaultTenant.
	Tenant string `json:"tenant,omitempty"`
	// RequestBytes is the request's size, counted against flow control's
	// queue byte limits (not a wire field).
	RequestBytes int `json:"-"`
	// FromPicker marks a request of the ext_proc picker front: it runs
	// with the picker's policy when the service has one
	// (Config.PickerPolicy; not a wire field).
	FromPicker bool `json:"-"`
	// SLOTTFTMs and SLOTPOTMs are the request's latency objectives in
	// milliseconds, time to first token and time per output token (not
	// Dynamo fields; llm-d's x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms).
	// The predicted-latency policy places the request where they are
	// predicted to be met, and refuses a sheddable one (negative priority)
	// that would miss them everywhere; other policies ignore them.
	SLOTTFTMs *float64 `json:"slo_ttft_ms,omitempty"`
	SLOTPOTMs *float64 `json:"slo_tpot_ms,omitempty"`

	sloTTFT, sloTPOT float64 // seconds, validated by checkRequest
}

// OverlapSummary is the chosen worker's cached prefix in tokens: per tier the
// best of its ranks (cumulative: cpu includes gpu, disk includes both), and per
// rank its device prefix.
type OverlapSummary struct {
	LongestMatched uint64            `json:"longest_matched"`
	GPU            uint64            `json:"gpu"`
	DP             map[string]uint64 `json:"dp"`
	CPU            uint64            `json:"cpu"`
	Disk           uint64            `json:"disk"`
}

// WorkerLoadView is the advisory selection's load probe.
type WorkerLoadView struct {
	ActivePrefillTokens  uint64  `json:"active_prefill_tokens"`
	PrefillTokenCapacity *uint64 `json:"prefill_token_capacity"`
	TotalKVBlocks        *uint64 `json:"total_kv_blocks,omitempty"`
	PrefillBusy          *bool   `json:"prefill_busy,omitempty"`
}

// SelectResponse answers /select and /select_and_reserve.
type SelectResponse struct {
	SelectionID            *string         `json:"selection_id,omitempty"`
	SequenceHashes         []int64         `json:"sequence_hashes,omitempty"`
	ISLTokens              *uint64         `json:"isl_tokens,omitempty"`
	TrackPrefillTokens     *bool           `json:"track_prefill_tokens,omitempty"`
	ModelName              string          `json:"model_name"`
	RoutingGroup           string          `json:"routing_group"`
	WorkerID               uint64          `json:"worker_id"`
	DPRank                 uint32          `json:"dp_rank"`
	Endpoint               string          `json:"endpoint"`
	BlockSize              uint32          `json:"block_size"`
	Overlap                OverlapSummary  `json:"overlap"`
	EffectivePrefillTokens uint64          `json:"effective_prefill_tokens"`
	PotentialDecodeBlocks  uint64          `json:"potential_decode_blocks"`
	DecodeBusy             *bool           `json:"decode_busy,omitempty"`
	WorkerLoad             *WorkerLoadView `json:"worker_load,omitempty"`
	KVHint                 *KVHint         `json:"kv_hint,omitempty"`
	// Fallbacks are the next-cheapest eligible ranks in cost order when the
	// request asked for them (not a wire field; see RankEndpoint).
	Fallbacks []RankEndpoint `json:"-"`
	// Prefill and PrefillDecision answer a disaggregated request (not Dynamo
	// fields; absent from every other response): the prefill worker, or
	// null when the decode worker prefills locally, and why.
	Prefill         PrefillField     `json:"prefill,omitzero"`
	PrefillDecision *PrefillDecision `json:"prefill_decision,omitempty"`
	// Decision is what the pick weighed (not a wire field): the fronts put
	// it on their trace spans.
	Decision DecisionDetail `json:"-"`
}

// DecisionDetail is what a selection weighed beyond its response fields.
type DecisionDetail struct {
	// Candidates is how many ranks were scored.
	Candidates int
	// Cost is the chosen rank's cost (lower is better); RunnerUp the
	// cheapest other rank, nil when the chosen one was the only candidate.
	Cost     float64
	RunnerUp *RankCost
	// ISLTokens is the prompt's length and CachedTokens the chosen rank's
	// cached-prefix credit in tokens (device blocks, plus host and disk
	// blocks at their cache-hit weights), as the cost counted them.
	ISLTokens, CachedTokens int
	// BestCachedTokens is the most any scored rank had cached, counted the
	// same way: above CachedTokens when the policy chose a less-cached rank
	// for its load.
	BestCachedTokens int
	// QueueWait is the time the selection spent queued (0 without queueing).
	QueueWait time.Duration
}

// PrefillSelection is the prefill worker of a remote-prefill decision.
type PrefillSelection struct {
	// SelectionID is the prefill booking's own reservation id
	// (select_and_reserve: "<selection_id>.prefill", freed with the decode
	// booking or at its prefill_complete), or the id its pending selection
	// is cached under in the prefill routing group (select with a
	// selection_id); omitted otherwise.
	SelectionID            *string        `json:"selection_id,omitempty"`
	RoutingGroup           string         `json:"routing_group"`
	WorkerID               uint64         `json:"worker_id"`
	DPRank                 uint32         `json:"dp_rank"`
	Endpoint               string         `json:"endpoint"`
	Overlap                OverlapSummary `json:"overlap"`
	EffectivePrefillTokens uint64         `json:"effective_prefill_tokens"`
}

// PrefillField is SelectResponse.prefill: absent when Set is false, null when
// Set and Selection is nil (local prefill), else the prefill worker.
type PrefillField struct {
	Set       bool
	Selection *PrefillSelection
}

// IsZero reports an absent field (json omitzero).
func (f PrefillField) IsZero() bool { return !f.Set }

// MarshalJSON writes the selection, or null.
func (f PrefillField) MarshalJSON() ([]byte, error) { return json.Marshal(f.Selection) }

// UnmarshalJSON reads the selection, or null.
func (f *PrefillField) UnmarshalJSON(b []byte) error {
	f.Set, f.Selection = true, nil
	return json.Unmarshal(b, &f.Selection)
}

// PrefillDecision says where a disaggregated request's prompt is prefilled
// and why; Reason is one of the Reason* constants (disagg.go).
type PrefillDecision struct {
	Remote bool   `json:"remote"`
	Reason string `json:"reason"`
}

// KVHint is the versioned action envelope telling the chosen worker to pull a
// cached prefix from another worker (Dynamo's kv_hints.rs).
type KVHint struct {
	ProtocolVersion string         `json:"protocol_version"`
	MessageID       string         `json:"message_id"`
	Actions         []KVHintAction `json:"actions"`
}

// KVHintAction is one action of a KVHint.
type KVHintAction struct {
	ActionID      string        `json:"action_id"`
	ActionType    string        `json:"action_type"`
	ActionVersion string        `json:"action_version"`
	Payload       KVHintPayload `json:"payload"`
}

// KVHintPayload fields serialize alphabetically, as Dynamo's do.
type KVHintPayload struct {
	BlockHashes           []uint64 `json:"block_hashes"`
	SourceControlEndpoint string   `json:"source_control_endpoint"`
}

// ReservationRequest is the body of POST /reservations: the replay form (only
// selection_id and the partition) or the explicit form (worker_id present).
type ReservationRequest struct {
	PartitionKey
	SelectionID *string `json:"selection_id"`
	WorkerID    *uint64 `json:"worker_id"`
	DPRank      *uint32 `json:"dp_rank"`
	PromptRequest
	RouterConfigOverride   *routerconfig.Override `json:"router_config_override"`
	ExpectedOutputTokens   *uint32                `json:"expected_output_tokens"`
	EffectivePrefillTokens *uint64                `json:"effective_prefill_tokens"`
	TrackPrefillTokens     *bool                  `json:"track_prefill_tokens"`
}

// ReservationResponse answers POST /reservations (201).
type ReservationResponse struct {
	SelectionID  string `json:"selection_id"`
	ModelName    string `json:"model_name"`
	RoutingGroup string `json:"routing_group"`
	WorkerID     uint64 `json:"worker_id"`
	DPRank       uint32 `json:"dp_rank"`
	Endpoint     string `json:"endpoint"`
}

// ReadyStatus answers /ready.
type ReadyStatus struct {
	Ready              bool              `json:"ready"`
	SchedulableWorkers int               `json:"schedulable_workers"`
	Workers            []*catalog.Record `json:"workers"`
	// IndexRecovery is the startup index recovery state ("pending",
	// "recovered" or "failed") when --indexer-peers is set; omitted otherwise.
	// Not a Dynamo field: Dynamo serves nothing until recovery is over.
	IndexRecovery string `json:"index_recovery,omitempty"`
	// Conditions are the external readiness inputs (discovery sources); any
	// that is not ready keeps Ready false. Omitted when there are none. Not a
	// Dynamo field.
	Conditions []Condition `json:"conditions,omitempty"`
}

// PotentialLoad is one rank's load in /loads and /potential_loads.
type PotentialLoad struct {
	WorkerID               uint64 `json:"worker_id"`
	DPRank                 uint32 `json:"dp_rank"`
	PotentialPrefillTokens uint64 `json:"potential_prefill_tokens"`
	PotentialDecodeBlocks  uint64 `json:"potential_decode_blocks"`
	ActiveRequests         uint64 `json:"active_requests"`
}

// ModelLoad is one partition's row of /loads.
type ModelLoad struct {
	ModelName        string          `json:"model_name"`
	RoutingGroup     string          `json:"routing_group"`
	Loads            []PotentialLoad `json:"loads"`
	PendingCount     uint64          `json:"pending_count"`
	PendingISLTokens uint64          `json:"pending_isl_tokens"`
}

// PromptQuery is the body of /potential_loads and /overlap_scores.
type PromptQuery struct {
	PartitionKey
	PromptRequest
	RouterConfigOverride *routerconfig.Override `json:"router_config_override"`
}

// OverlapScoresResponse answers /overlap_scores (counts in blocks).
type OverlapScoresResponse struct {
	BlockSize   uint32            `json:"block_size"`
	NumBlocks   int               `json:"num_blocks"`
	Workers     []OverlapScoreRow `json:"workers"`
	SharedCache SharedCacheView   `json:"shared_cache"`
}

// OverlapScoreRow is one (worker, rank) row of /overlap_scores.
type OverlapScoreRow struct {
	WorkerID                  uint64  `json:"worker_id"`
	DPRank                    uint32  `json:"dp_rank"`
	DeviceBlocks              uint32  `json:"device_blocks"`
	HostPinnedBlocks          uint32  `json:"host_pinned_blocks"`
	DiskBlocks                uint32  `json:"disk_blocks"`
	HostPinnedExtensionBlocks uint32  `json:"host_pinned_extension_blocks"`
	DiskExtensionBlocks       uint32  `json:"disk_extension_blocks"`
	SharedBeyondDeviceBlocks  *uint32 `json:"shared_beyond_device_blocks"`
	RouterCreditBlocks        float64 `json:"router_credit_blocks"`
}

// SharedCacheView reports the cluster-shared cache tier; kvselect has none.
type SharedCacheView struct {
	Enabled        bool     `json:"enabled"`
	TotalHitBlocks uint64   `json:"total_hit_blocks"`
	Ranges         []string `json:"ranges"`
	Error          *string  `json:"error"`
}
