package selection

import (
	"time"

	"github.com/kvselect/kvselect/selection/index"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/textindex"
)

// textPrompt normalizes a text-only prompt for partition p.
func (s *Service) textPrompt(p *partition, req *PromptRequest) prompt {
	p.text.Ensure(p.blockSize, s.router.RouterTTL)
	lora := deref(req.LoraName, "")
	locals, isl := textindex.BlockHashes(req.PromptText, p.blockSize, lora, deref(req.CacheSalt, ""))
	return prompt{
		locals:   locals,
		tracking: kvhash.SequenceHashes(locals),
		isl:      isl,
		hashed:   true,
		lora:     lora,
		text:     true,
	}
}

// textIndex returns the partition's text index; textPrompt built it before
// any text prompt reaches a lookup or a routing record.
func (p *partition) textIndex() *index.Index { return p.text.Index() }

// recordText teaches the text index that w now holds the prompt's chain.
func (p *partition) recordText(now time.Time, w index.WorkerKey, pr prompt) {
	p.text.Record(now, w, pr.locals, pr.tracking)
}
