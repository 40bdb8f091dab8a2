package selection

import (
	"sync"

	"github.com/kvselect/kvselect/selection/apierr"
	"github.com/kvselect/kvselect/selection/kvhash"
)

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
	// and routing records use the partition's text index (textprompt.go).
	text bool
	// alsoText is the text chain of a prompt routed by its token ids that the
	// front also knew as text (a tokenized text prompt): the booking records
	// it in the text index too, so that a later request of the same text
	// that cannot be tokenized in time still finds the worker.
	alsoText *prompt
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

func (s *Service) normalize(p *partition, req *PromptRequest, reuse bool, use promptUse) (prompt, error) {
	out := prompt{lora: deref(req.LoraName, "")}
	tokens, mmInfos, hasTokens := req.TokenIDs, req.BlockMMInfos, req.TokenIDs != nil
	if r := req.MMRoutingInfo; r != nil && len(r.RoutingTokenIDs) > 0 {
		tokens, mmInfos, hasTokens = r.RoutingTokenIDs, r.BlockMMInfos, true
	}
	if hasTokens {
		eagle := p.isEagle
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
		opts := kvhash.BlockOptions{BlockSize: int(p.blockSize), Eagle: eagle, MM: mm}
		h := hasherPool.Get().(*kvhash.Hasher)
		n := opts.NumBlocks(len(tokens))
		out.locals = h.AppendBlockHashes(make([]uint64, 0, n), tokens, kvhash.Salt(out.lora, salt), opts)
		scope := kvhash.Scope{Model: p.key.Model, RoutingGroup: p.key.RoutingGroup, BlockSize: p.blockSize,
			CacheNamespace: salt, LoraName: out.lora, Eagle: eagle}
		if reuse && s.tracker.DerivesFromLocal() {
			out.tracking = kvhash.AppendSequenceHashes(make([]uint64, 0, n), out.locals, kvhash.Seed)
		} else {
			out.tracking = s.tracker.AppendTrackingHashes(h, make([]uint64, 0, n), tokens, scope, mm, reuse)
		}
		hasherPool.Put(h)
		out.isl, out.hashed = len(tokens), true
		if req.PromptText != "" {
			tp := s.textPrompt(p, req)
			out.alsoText = &tp
		}
		return out, nil
	}
	if req.PromptText != "" && req.BlockHashes == nil && req.SequenceHashes == nil && req.ISLTokens == nil {
		return s.textPrompt(p, req), nil
	}
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
