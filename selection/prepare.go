package selection

// What every prompt-carrying call resolves first: the request's own checks,
// the ready partition, the policy and effective router configuration, and the
// prompt normalized for the partition.

import (
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection/admission"
	"github.com/kvselect/kvselect/selection/affinity"
	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/partition"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
	"github.com/kvselect/kvselect/selection/textindex"
)

// InputTriggers are the values session_context.input_trigger accepts.
var InputTriggers = []string{"user_message", "tool_result", "other"}

// maxSessionIDBytes bounds session ids, as Dynamo's affinity table does.
const maxSessionIDBytes = 256

// checkRequest refuses what no partition could serve: a disaggregated
// request aimed at the prefill group itself (the request names the decode
// side), and flow control fields out of bounds.
func (s *Service) checkRequest(req *SelectRequest) error {
	if req.Disaggregated && partitionOf(req.PartitionKey).RoutingGroup == s.set.prefillGroup {
		return apierr.New(KindBadRequest, "a disaggregated request names the decode routing group, not the prefill routing group %q", s.set.prefillGroup)
	}
	var err error
	if req.sloTTFT, err = sloSeconds("slo_ttft_ms", req.SLOTTFTMs); err != nil {
		return err
	}
	if req.sloTPOT, err = sloSeconds("slo_tpot_ms", req.SLOTPOTMs); err != nil {
		return err
	}
	return admission.CheckFields(req.Priority, req.Tenant)
}

// readyPartition is the admission check of every selection-like call: a
// service shutting down, no schedulable worker anywhere, or none in the
// partition are each a 503 with its own message.
func (s *Service) readyPartition(key index.Partition) (*partition.Partition, error) {
	if err := s.gate.Admit(); err != nil {
		return nil, err
	}
	p := s.parts.Get(key)
	if p == nil || len(p.Workers().Ranks) == 0 {
		if !s.parts.AnySchedulable() {
			return nil, apierr.New(KindNotReady, "no schedulable workers are available")
		}
		return nil, apierr.New(KindNotReady, "no schedulable workers for %s", partition.Name(key))
	}
	return p, nil
}

// prepared is what every prompt-carrying call resolves first.
type prepared struct {
	part *partition.Partition
	// policy is the selection policy this request runs with, loaded once so
	// that a concurrent SetPolicy cannot give it the weights of one policy
	// and the Select of another.
	policy *scheduler.Policy
	// eff is the effective router configuration: the service's, then the
	// policy's cost weights, then router_config_override. Everything the
	// request computes from weights reads them here.
	eff    routerconfig.Config
	prompt prompt
	// overlaps, when set, is the prompt's index lookup from an earlier pass
	// of the same request (a disaggregated request's peek), reused by choose.
	overlaps []index.Overlap
}

// prepare resolves the ready partition, the policy (the picker front's when
// picker is set and it has its own), the effective router configuration and
// the normalized prompt.
func (s *Service) prepare(key index.Partition, o *routerconfig.Override, req *PromptRequest, use promptUse, picker bool) (prepared, error) {
	s.prepared.Add(1)
	p, err := s.readyPartition(key)
	if err != nil {
		return prepared{}, err
	}
	pol := s.policy.Load()
	if pp := s.pickerPolicy.Load(); picker && pp != nil {
		pol = pp
	}
	eff, err := effective(s.router, pol, o)
	if err != nil {
		return prepared{}, err
	}
	pr, err := s.prompts.normalize(p, req, eff.AssumeKVReuse, use)
	if err != nil {
		return prepared{}, err
	}
	return prepared{part: p, policy: pol, eff: eff, prompt: pr}, nil
}

// session is what a request says of its session: its id, the parent
// session a subagent's conversation was started from, and whether this is the
// session's last request (Dynamo's session_context fields).
type session struct {
	id, parent string
	final      bool
}

// sessionOf reads the request's session: session_context when present (the
// flat session_id is then ignored, as in Dynamo), else session_id. A parent
// equal to the session itself is no parent, as Dynamo's frontend drops it
// (lib/llm/src/protocols/agents.rs).
func sessionOf(req *SelectRequest) (session, error) {
	var ss session
	switch {
	case req.SessionContext != nil:
		sc := req.SessionContext
		ss.id = sc.SessionID
		if t := sc.InputTrigger; t != nil && !slices.Contains(InputTriggers, *t) {
			return session{}, apierr.New(KindBadRequest, "invalid input_trigger %q (want user_message, tool_result or other)", *t)
		}
		if sc.ParentSessionID != nil && *sc.ParentSessionID != ss.id {
			ss.parent = *sc.ParentSessionID
		}
		ss.final = sc.SessionFinal != nil && *sc.SessionFinal
	case req.SessionID != nil:
		ss.id = *req.SessionID
	}
	return ss, nil
}

// checkSession applies the affinity table's id limit to the session and its
// parent. Without session affinity a session id is only policy input and any
// length is accepted.
func checkSession(p *partition.Partition, ss session) error {
	if err := checkSessionID(p, ss.id); err != nil {
		return err
	}
	if p.Affinity() != nil && len(ss.parent) > maxSessionIDBytes {
		return apierr.New(KindBadRequest, "parent session ID must not exceed %d bytes", maxSessionIDBytes)
	}
	return nil
}

// parentTarget is where a child session without a live binding of its own
// starts: its parent's bound worker, when that binding is live — the
// parent's prefix, which the child's conversation shares, is cached there.
// Like any affinity target it only steers: a parent worker that is gone,
// overloaded or filtered out leaves the child routed normally.
func (s *Service) parentTarget(p *partition.Partition, ss session) *affinity.Target {
	if ss.parent == "" || ss.id == "" || p.Affinity() == nil {
		return nil
	}
	t, ok, err := p.Affinity().Query(s.clock(), ss.parent)
	if err != nil || !ok {
		return nil
	}
	return &t
}

// checkSessionID applies the affinity table's id limit. Without session
// affinity a session id is only policy input and any length is accepted.
func checkSessionID(p *partition.Partition, sid string) error {
	if p.Affinity() != nil && len(sid) > maxSessionIDBytes {
		return apierr.New(KindBadRequest, "session affinity ID must not exceed %d bytes", maxSessionIDBytes)
	}
	return nil
}

func explicitTarget(req *SelectRequest) *affinity.Target {
	a := req.AffinityTarget
	if a == nil {
		return nil
	}
	t := affinity.WorkerTarget(a.WorkerID)
	if a.DPRank != nil {
		t.DPRank, t.HasDPRank = *a.DPRank, true
	}
	return &t
}

// effective is the router configuration one request runs with: the
// service's, with the cost weights of the request's policy when it sets
// them, and the request's router_config_override on top of both.
func effective(router routerconfig.Config, pol *scheduler.Policy, o *routerconfig.Override) (routerconfig.Config, error) {
	base := router
	if c := pol.Costs; c != nil {
		base = withCosts(base, *c)
	}
	if o == nil {
		return base, nil
	}
	if err := o.Validate(); err != nil {
		return base, apierr.Wrap(KindBadRequest, err)
	}
	return base.Apply(*o), nil
}

// withCosts is c with its seven cost-weight fields replaced by w: the
// inverse of CostWeightsOf.
func withCosts(c routerconfig.Config, w scheduler.CostWeights) routerconfig.Config {
	c.OverlapScoreCredit = w.OverlapScoreCredit
	c.OverlapScoreCreditDecay = w.OverlapScoreCreditDecay
	c.PrefillLoadScale = w.PrefillLoadScale
	c.DecodeActiveRequestWeight = w.DecodeActiveRequestWeight
	c.HostCacheHitWeight = w.HostCacheHitWeight
	c.DiskCacheHitWeight = w.DiskCacheHitWeight
	c.RouterTemperature = w.Temperature
	return c
}

// prompt is a request's prompt normalized for one partition: token ids hashed
// here, or the client's precomputed hashes and input length.
type prompt struct {
	locals   []uint64 // public LocalBlockHashes: index lookups and routing records
	tracking []uint64 // tracking (sequence) hashes: active-load identities
	isl      int
	// hashed says the public block hashes are known (token ids or block_hashes
	// were sent), so a booking may be recorded into an approximate index.
	hashed bool
	lora   string
	// text says locals are character-block hashes of a prompt text: lookups
	// and routing records use the partition's text index (package textindex).
	text bool
	// alsoText is the text chain of a prompt routed by its token ids that the
	// front also knew as text (a tokenized text prompt): the booking records
	// it in the text index too, so that a later request of the same text
	// that cannot be tokenized in time still finds the worker.
	alsoText *prompt
}

// lastBlock is the public hash of the prompt's last full block when an
// engine's KV events carry the same hash: a prompt hashed from its token
// ids (or given its block hashes), not a text's character blocks.
func (pr *prompt) lastBlock() (hash uint64, ok bool) {
	if !pr.hashed || pr.text || len(pr.locals) == 0 {
		return 0, false
	}
	return pr.locals[len(pr.locals)-1], true
}

// firstDecodeBlock is how many output tokens complete the block after the
// prompt's last full one: the block size less the prompt's tokens past
// that block. 0 when the engine's events cannot name the prompt's blocks
// (lastBlock) or the input length does not fit its block hashes (a client
// that sent fewer hashes than full blocks).
func (pr *prompt) firstDecodeBlock(blockSize uint32) uint32 {
	if _, ok := pr.lastBlock(); !ok || blockSize == 0 {
		return 0
	}
	past := pr.isl - len(pr.locals)*int(blockSize)
	if past < 0 || past >= int(blockSize) {
		return 0
	}
	return blockSize - uint32(past)
}

// promptUse selects the validation rules: selection-like calls need all three
// hash-path fields, the explicit reservation only sequence hashes and length.
type promptUse uint8

const (
	forSelection promptUse = iota
	forReservation
)

// maxISLTokens bounds a precomputed input length: far beyond any model's
// context, and small enough that token arithmetic never overflows an int.
const maxISLTokens = 1 << 31

var hasherPool = sync.Pool{New: func() any { return new(kvhash.Hasher) }}

// normalizer turns a request's prompt into the hashes a partition works with,
// handed the tracking-hash algorithm and the text index's retention.
type normalizer struct {
	tracker *kvhash.Tracker
	textTTL time.Duration // router_ttl_secs
}

// normalize hashes or checks the request's prompt for partition p: token ids
// are hashed here (Dynamo-exact block hashes, tracking hashes by the
// configured algorithm), a text prompt is cut into character blocks, and
// precomputed hashes are checked and taken as sent.
func (n *normalizer) normalize(p *partition.Partition, req *PromptRequest, reuse bool, use promptUse) (prompt, error) {
	out := prompt{lora: deref(req.LoraName, "")}
	tokens, mmInfos, hasTokens := req.TokenIDs, req.BlockMMInfos, req.TokenIDs != nil
	if r := req.MMRoutingInfo; r != nil && len(r.RoutingTokenIDs) > 0 {
		tokens, mmInfos, hasTokens = r.RoutingTokenIDs, r.BlockMMInfos, true
	}
	if hasTokens {
		n.hashTokens(&out, p, req, tokens, mmInfos, reuse)
		if req.PromptText != "" {
			tp := n.textPrompt(p, req)
			out.alsoText = &tp
		}
		return out, nil
	}
	if req.PromptText != "" && req.BlockHashes == nil && req.SequenceHashes == nil && req.ISLTokens == nil {
		return n.textPrompt(p, req), nil
	}
	return precomputed(out, req, use)
}

// precomputed checks a prompt sent as block hashes, sequence hashes and input
// length, and takes them as sent.
func precomputed(out prompt, req *PromptRequest, use promptUse) (prompt, error) {
	if use == forSelection && req.BlockHashes == nil {
		return out, apierr.New(KindBadRequest, "block_hashes is required without token_ids")
	}
	if req.SequenceHashes == nil {
		return out, apierr.New(KindBadRequest, "sequence_hashes is required without token_ids")
	}
	if req.ISLTokens == nil {
		return out, apierr.New(KindBadRequest, "isl_tokens is required without token_ids")
	}
	if *req.ISLTokens > maxISLTokens {
		return out, apierr.New(KindBadRequest, "isl_tokens %d exceeds the supported maximum of %d", *req.ISLTokens, uint64(maxISLTokens))
	}
	if use == forSelection && *req.ISLTokens == 0 {
		return out, apierr.New(KindBadRequest, "isl_tokens must be greater than 0")
	}
	if req.BlockHashes != nil && len(req.BlockHashes) != len(req.SequenceHashes) && use == forSelection {
		return out, apierr.New(KindBadRequest, "block_hashes length %d must match sequence_hashes length %d", len(req.BlockHashes), len(req.SequenceHashes))
	}
	// Precomputed identities are trusted as sent, bit-cast from the wire's
	// i64, as Dynamo does.
	out.locals = bitcast(req.BlockHashes)
	out.tracking = bitcast(req.SequenceHashes)
	out.isl = int(*req.ISLTokens)
	out.hashed = req.BlockHashes != nil
	return out, nil
}

// hashTokens hashes the prompt's token ids into out: the public block hashes
// and the tracking hashes.
func (n *normalizer) hashTokens(out *prompt, p *partition.Partition, req *PromptRequest, tokens []uint32, mmInfos []*BlockExtraInfo, reuse bool) {
	eagle := p.Eagle()
	if req.IsEagle != nil {
		eagle = *req.IsEagle
	}
	salt := deref(req.CacheSalt, "")
	var mm [][]uint64
	if len(mmInfos) > 0 {
		mm = make([][]uint64, len(mmInfos))
		for i, info := range mmInfos {
			if info == nil {
				continue
			}
			for _, o := range info.MMObjects {
				mm[i] = append(mm[i], o.MMHash)
			}
		}
	}
	opts := kvhash.BlockOptions{BlockSize: int(p.BlockSize()), Eagle: eagle, MM: mm}
	h := hasherPool.Get().(*kvhash.Hasher)
	blocks := opts.NumBlocks(len(tokens))
	out.locals = h.AppendBlockHashes(make([]uint64, 0, blocks), tokens, kvhash.Salt(out.lora, salt), opts)
	key := p.Key()
	scope := kvhash.Scope{Model: key.Model, RoutingGroup: key.RoutingGroup, BlockSize: p.BlockSize(),
		CacheNamespace: salt, LoraName: out.lora, Eagle: eagle}
	if reuse && n.tracker.DerivesFromLocal() {
		out.tracking = kvhash.AppendSequenceHashes(make([]uint64, 0, blocks), out.locals, kvhash.Seed)
	} else {
		out.tracking = n.tracker.AppendTrackingHashes(h, make([]uint64, 0, blocks), tokens, scope, mm, reuse)
	}
	hasherPool.Put(h)
	out.isl, out.hashed = len(tokens), true
}

// textPrompt normalizes a text-only prompt for partition p.
func (n *normalizer) textPrompt(p *partition.Partition, req *PromptRequest) prompt {
	p.Text().Ensure(p.BlockSize(), n.textTTL)
	lora := deref(req.LoraName, "")
	locals, isl := textindex.BlockHashes(req.PromptText, p.BlockSize(), lora, deref(req.CacheSalt, ""))
	return prompt{
		locals:   locals,
		tracking: kvhash.SequenceHashes(locals),
		isl:      isl,
		hashed:   true,
		lora:     lora,
		text:     true,
	}
}

func bitcast(in []int64) []uint64 {
	if in == nil {
		return nil
	}
	out := make([]uint64, len(in))
	for i, v := range in {
		out[i] = uint64(v)
	}
	return out
}

func toI64(in []uint64) []int64 {
	out := make([]int64, len(in))
	for i, v := range in {
		out[i] = int64(v)
	}
	return out
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// partitionOf is the partition a request names; both fields default to
// "default".
func partitionOf(k PartitionKey) index.Partition {
	p := index.Partition{Model: k.ModelName, RoutingGroup: k.RoutingGroup}
	if p.Model == "" {
		p.Model = catalog.DefaultPartitionName
	}
	if p.RoutingGroup == "" {
		p.RoutingGroup = catalog.DefaultPartitionName
	}
	return p
}
