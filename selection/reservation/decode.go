package reservation

// Decode progress read in the engines' KV events. An engine with prefix
// caching caches every block that becomes full, output tokens included:
// vLLM's scheduler caches a running request's full blocks at each step
// (vllm/v1/core/kv_cache_manager.py, KVCacheManager.allocate_slots calls
// cache_blocks with every computed token), and each publishes a BlockStored
// whose parent is the request's previous block. So after its first token, a
// booking kept to an estimated end sees its decode advance a block at a
// time: the first block after the prompt's last full one once
// Row.FirstDecodeBlock output tokens exist, then one more every block size.
// Each such block measures the engine's actual pace on this request, and
// the end moves to the output left at that pace: the estimate's inter-token
// latency is a prediction made at the decision, before the batch the
// request joined was known.

import (
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/partition"
)

const (
	// maxDecodeBlocks is the most blocks one BlockStored may hold to count
	// as decode progress: a step adds at most a block or two of output
	// (more with speculative decoding). A longer chain under the same
	// parent is another prompt that extends this one, not this decode.
	maxDecodeBlocks = 4
	// minPaceTokens is the least output a measured pace must span to move
	// an end: the first token's own instant is known to a step (an engine
	// publishes a step's events when it schedules the step or once its
	// output is processed, depending on the version), so over fewer steps
	// that step is most of the measurement. The prediction is no fallback:
	// without a response path to fit it, it may be far off.
	minPaceTokens = 4
	// minPaceSpan is the least time a measured pace must span: an engine
	// that publishes its events on a timer (llm-d-inference-sim flushes
	// every second, pkg/kv-cache/kv_cache_sender.go) delivers a first
	// token and the blocks after it together, microseconds apart, which
	// would read as a decode that took no time. Any real engine's inter-
	// token latency puts minPaceTokens well past it.
	minPaceSpan = 10 * time.Millisecond
	// blockAwaitFactor and blockAwaitFloor bound how long past its
	// estimated end a booking waits for a block of output its engine
	// should store before that end: blockAwaitFactor times the time the
	// block should take, at least blockAwaitFloor. A response that stopped
	// early (an end-of-sequence token) stores no more blocks; its engine's
	// request counts free it sooner where they are scraped.
	blockAwaitFactor = 4
	blockAwaitFloor  = 250 * time.Millisecond
)

// Progress is a booking whose decode an engine reported (Decoded): Due is
// when its estimated end now comes, Generated the output tokens its stored
// blocks hold.
type Progress struct {
	ID        string
	Due       time.Time
	Generated int
}

// decodeFrom starts watching r's decode from its block whose engine hash is
// ext, the prompt's last full block once its first token was seen, and
// awaits the first block of output if it should come before the output's
// estimated end. Called with t.mu held.
func (t *Table) decodeFrom(id string, r *Row, ext uint64) {
	e := r.end
	if r.FirstDecodeBlock == 0 || e == nil {
		return
	}
	t.moveDecode(id, r, watchKey{watchRank{r.Part, r.Worker}, ext})
	e.awaitBlock(e.firstAt, 0, int(r.FirstDecodeBlock), e.ITL)
}

// BlockAwaited reports whether e waits past its estimated end for a block
// of output its engine should have stored.
func (e *End) BlockAwaited() bool { return !e.blockDue.IsZero() && e.blockDue.After(e.At) }

// awaitBlock awaits, from now, the next block of output, which completes
// once tokens more output tokens exist beyond the generated ones, at itl
// each: only when it should be stored before the assumed output ends (the
// step that completes it samples one more token), within the cap. Otherwise
// none is.
func (e *End) awaitBlock(now time.Time, generated, tokens int, itl time.Duration) {
	e.blockDue = time.Time{}
	if generated+tokens+1 > e.Tokens || itl <= 0 {
		return
	}
	expect := time.Duration(tokens) * itl
	e.blockDue = e.capped(now.Add(max(blockAwaitFactor*expect, expect+blockAwaitFloor)))
}

// moveDecode points r's decode watch at k. Called with t.mu held.
func (t *Table) moveDecode(id string, r *Row, k watchKey) {
	if r.decoding {
		t.undecode(id, r.decodeOn)
	}
	add(&t.decoding, id, k)
	r.decodeOn, r.decoding = k, true
	t.decodes.Add(1)
}

// undecode forgets id's decode watch on k. Called with t.mu held.
func (t *Table) undecode(id string, k watchKey) {
	if forget(t.decoding, id, k) {
		t.decodes.Add(-1)
	}
}

// Decoded records that ev's engine in part, whose blocks hold blockSize
// tokens, stored ev's blocks at now (a BlockStored event with a parent):
// the booking whose decode waits for a child of that parent advanced by
// them, and its estimated end moves to its output left at its pace so far. Of two bookings waiting on the same
// parent (the same prompt decoding twice on one rank), the older takes the
// first child.
func (t *Table) Decoded(part *partition.Partition, ev *index.Event, blockSize uint32, now time.Time) (Progress, bool) {
	blocks := ev.Blocks
	if t.decodes.Load() == 0 || !ev.HasParent || len(blocks) == 0 || len(blocks) > maxDecodeBlocks {
		return Progress{}, false
	}
	rank := watchRank{part, ev.Worker}
	k := watchKey{rank, ev.Parent}
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.decoding[k]
	if !ok {
		return Progress{}, false
	}
	id := w.first
	r, found := t.rows[id]
	if !found || r.end == nil || !r.decoding || r.decodeOn != k {
		t.undecode(id, k) // not reachable while Drop unwatches; kept safe
		return Progress{}, false
	}
	e := r.end
	tokens := int(r.FirstDecodeBlock)
	if e.generated > 0 {
		tokens = e.generated + int(blockSize)
	}
	tokens += (len(blocks) - 1) * int(blockSize)
	e.decoded(now, tokens, int(blockSize))
	pace, ok := e.pace(now)
	if !ok {
		pace = e.ITL
	}
	e.awaitBlock(now, tokens, int(blockSize), pace)
	t.moveDecode(id, r, watchKey{rank, blocks[len(blocks)-1].Ext})
	t.schedule(id, e)
	return Progress{ID: id, Due: e.due(), Generated: tokens}, true
}

// decoded moves e by its decode having computed the KV of generated output
// tokens at now (the step that did so sampled one more): the pace since
// the first token times the output left, once the pace spans
// minPaceTokens. The output left is the assumed length less what was
// sampled; once the output outran that assumption, one more block (never
// past Limit): the end comes unless another block is stored. Never before
// now, within the cap.
func (e *End) decoded(now time.Time, generated, blockSize int) {
	e.generated = generated
	itl, ok := e.pace(now)
	if !ok {
		return
	}
	sampled := generated + 1
	left := e.Tokens - sampled
	if left <= 0 {
		left = blockSize
	}
	if e.Limit > 0 {
		left = min(left, max(e.Limit-sampled, 0))
	}
	e.At = e.capped(now.Add(time.Duration(left) * itl))
}

// pace is the decode's time per output token since the first token, at
// now; ok is false until it spans minPaceTokens and minPaceSpan.
func (e *End) pace(now time.Time) (time.Duration, bool) {
	span := now.Sub(e.firstAt)
	if e.generated < minPaceTokens || span < minPaceSpan {
		return 0, false
	}
	return span / time.Duration(e.generated), true
}
