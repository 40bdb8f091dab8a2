package selection

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/zeebo/xxh3"
)

// Text prompts.
//
// A request that carries neither token ids nor precomputed hashes is known
// only by its prompt text. kvselect does not tokenize; it cuts the text into
// fixed character blocks and learns, from its own routing decisions, which
// rank holds which block chain — the approach of GIE's approximate prefix
// plugin (pkg/epp/scheduling/framework/plugins/multi/prefix in
// kubernetes-sigs/gateway-api-inference-extension), with Dynamo's structures:
//
//   - a block is TextCharsPerToken × block_size bytes of the text (the
//     partition's block size, so one text block stands for about one KV
//     block); a short tail is not hashed, as a partial token block is not;
//   - block i's "local hash" is xxh3-64 of its bytes seeded with the
//     LoRA / cache-salt seed XOR textDomain, so text hashes never collide by
//     construction with token LocalBlockHashes of the same salt;
//   - the chain is kvhash's public sequence-hash chain over those locals, and
//     serves as the booking's tracking hashes (active-load de-duplication);
//   - the input length is estimated as ceil(bytes / TextCharsPerToken).
//
// The text hashes live in a per-partition index of their own (approximate,
// TTL retention of router_ttl_secs), never in the KV-event index: they are
// not Dynamo's block hashes and engines never report them. Lookups of a text
// prompt read only that index; every booking of a text prompt records its
// chain there for the chosen rank (learned from routing decisions). The text
// index is local to this process: it is not part of /dump.

// TextCharsPerToken is the characters-per-token estimate of text prompts
// (GIE uses the same 4).
const TextCharsPerToken = 4

// textDomain separates text block hashes from token block hashes.
var textDomain = xxh3.HashString("kvselect/text-blocks/v1")

// TextBlockHashes returns the block hashes and the estimated input length
// that a text prompt gets in a partition of the given block size with the
// given LoRA name and cache salt. The ext_proc docs and tests use it; the
// service computes the same values internally.
func TextBlockHashes(text string, blockSize uint32, loraName, cacheSalt string) (locals []uint64, islTokens int) {
	if blockSize == 0 {
		return nil, textISL(len(text))
	}
	n := int(blockSize) * TextCharsPerToken
	seed := kvhash.Salt(loraName, cacheSalt) ^ textDomain
	locals = make([]uint64, 0, len(text)/n)
	for i := 0; i+n <= len(text); i += n {
		locals = append(locals, xxh3.HashStringSeed(text[i:i+n], seed))
	}
	return locals, textISL(len(text))
}

func textISL(bytes int) int { return max(1, (bytes+TextCharsPerToken-1)/TextCharsPerToken) }

// textPrompt normalizes a text-only prompt for partition p.
func (s *Service) textPrompt(p *partition, req *PromptRequest) prompt {
	p.text.ensure(p.blockSize, s.router.RouterTTL)
	lora := deref(req.LoraName, "")
	locals, isl := TextBlockHashes(req.PromptText, p.blockSize, lora, deref(req.CacheSalt, ""))
	return prompt{
		locals:   locals,
		tracking: kvhash.SequenceHashes(locals),
		isl:      isl,
		hashed:   true,
		lora:     lora,
		text:     true,
	}
}

// textIndex is a partition's index of text prompts, built by the first text
// prompt so that partitions that never see text pay nothing.
type textIndex struct {
	mu sync.Mutex
	ix atomic.Pointer[index.Index]
}

func (t *textIndex) ensure(blockSize uint32, ttl time.Duration) {
	if t.ix.Load() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ix.Load() != nil {
		return
	}
	ix, err := index.New(index.Config{BlockSize: blockSize, Approximate: true, TTL: ttl})
	if err != nil {
		// Partitions never have a zero block size and the TTL was validated
		// with the router configuration.
		panic("selection: text index: " + err.Error())
	}
	t.ix.Store(ix)
}

// textIndex returns the partition's text index; textPrompt built it before
// any text prompt reaches a lookup or a routing record.
func (p *partition) textIndex() *index.Index { return p.text.ix.Load() }

// recordText teaches the text index that w now holds the prompt's chain.
func (p *partition) recordText(now time.Time, w index.WorkerKey, pr prompt) {
	_, _ = p.textIndex().RecordRouting(now, w, pr.locals, pr.tracking)
}

func (t *textIndex) expire(now time.Time) {
	if ix := t.ix.Load(); ix != nil {
		ix.Expire(now)
	}
}

func (t *textIndex) removeRank(w index.WorkerKey) {
	if ix := t.ix.Load(); ix != nil {
		ix.RemoveRank(w)
	}
}
