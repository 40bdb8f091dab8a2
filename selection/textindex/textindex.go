// Package textindex routes prompts known only as text. A request that
// carries neither token ids nor precomputed hashes is known only by its
// prompt text. kvselect does not tokenize; it cuts the text into fixed
// character blocks and learns, from its own routing decisions, which
// rank holds which block chain — the approach of GIE's approximate prefix
// plugin (pkg/epp/scheduling/framework/plugins/multi/prefix in
// kubernetes-sigs/gateway-api-inference-extension), with Dynamo's structures:
//
//   - a block is CharsPerToken × block_size bytes of the text (the
//     partition's block size, so one text block stands for about one KV
//     block); a short tail is not hashed, as a partial token block is not;
//   - block i's "local hash" is xxh3-64 of its bytes seeded with the
//     LoRA / cache-salt seed XOR textDomain, so text hashes never collide by
//     construction with token LocalBlockHashes of the same salt;
//   - the chain is kvhash's public sequence-hash chain over those locals, and
//     serves as the booking's tracking hashes (active-load de-duplication);
//   - the input length is estimated as ceil(bytes / CharsPerToken).
//
// The text hashes live in a per-partition index of their own (approximate,
// TTL retention of router_ttl_secs), never in the KV-event index: they are
// not Dynamo's block hashes and engines never report them. Lookups of a text
// prompt read only that index; every booking of a text prompt records its
// chain there for the chosen rank (learned from routing decisions). The text
// index is local to this process: it is not part of /dump.
package textindex

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/zeebo/xxh3"
)

// CharsPerToken is the characters-per-token estimate of text prompts (GIE
// uses the same 4).
const CharsPerToken = 4

// textDomain separates text block hashes from token block hashes.
var textDomain = xxh3.HashString("kvselect/text-blocks/v1")

// BlockHashes returns the block hashes and the estimated input length that a
// text prompt gets in a partition of the given block size with the given
// LoRA name and cache salt.
func BlockHashes(text string, blockSize uint32, loraName, cacheSalt string) (locals []uint64, islTokens int) {
	if blockSize == 0 {
		return nil, textISL(len(text))
	}
	n := int(blockSize) * CharsPerToken
	seed := kvhash.Salt(loraName, cacheSalt) ^ textDomain
	locals = make([]uint64, 0, len(text)/n)
	for i := 0; i+n <= len(text); i += n {
		locals = append(locals, xxh3.HashStringSeed(text[i:i+n], seed))
	}
	return locals, textISL(len(text))
}

func textISL(bytes int) int { return max(1, (bytes+CharsPerToken-1)/CharsPerToken) }

// Index is a partition's index of text prompts, built by the first text
// prompt (Ensure) so that partitions that never see text pay nothing. The
// zero value is an index not built yet; it is safe for concurrent use.
type Index struct {
	mu sync.Mutex // a leaf: held only while building
	ix atomic.Pointer[index.Index]
}

// Ensure builds the index, approximate with the given TTL, unless it is
// built already.
func (t *Index) Ensure(blockSize uint32, ttl time.Duration) {
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

// Index returns the built index; Ensure built it before any text prompt
// reaches a lookup or a routing record.
func (t *Index) Index() *index.Index { return t.ix.Load() }

// Record teaches the index that w now holds the chain locals (whose
// sequence hashes are tracking).
func (t *Index) Record(now time.Time, w index.WorkerKey, locals, tracking []uint64) {
	_, _ = t.Index().RecordRouting(now, w, locals, tracking)
}

// Expire drops the entries past their TTL at now.
func (t *Index) Expire(now time.Time) {
	if ix := t.ix.Load(); ix != nil {
		ix.Expire(now)
	}
}

// RemoveRank drops everything w held.
func (t *Index) RemoveRank(w index.WorkerKey) {
	if ix := t.ix.Load(); ix != nil {
		ix.RemoveRank(w)
	}
}
