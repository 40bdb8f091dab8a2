package kvlisten

import "cmp"

// The sequence cursor of one rank, kept apart from sockets, goroutines and
// clocks so that every decision about sequence numbers can be tested on its
// own. It follows the consumer side of Dynamo's standalone indexer
// (lib/kv-router/src/services/indexer/listener.rs in ai-dynamo/dynamo, commit
// 0c496f29): a publisher numbers its batches 0, 1, 2, … and the cursor keeps
// the watermark, the last sequence number accepted.

// verdict is what the cursor says about one live batch.
type verdict uint8

const (
	// verdictAccept: apply the batch now.
	verdictAccept verdict = iota
	// verdictStale: the batch is at or below the watermark (a duplicate, or a
	// publisher that restarted with a fresh sequence); skip it.
	verdictStale
	// verdictReplay: replay [from, to) first, then apply the batch.
	verdictReplay
)

// observation is the cursor's answer for one live sequence number.
type observation struct {
	verdict verdict
	// from and to bound the range to replay first, [from, to); set only for
	// verdictReplay, where to is the live sequence number itself.
	from, to uint64
	// gap tells a live gap (batches missed after the cursor was synced) from
	// the initial catch-up of a cursor that has not accepted anything yet.
	gap bool
}

// cursor is one rank's position in its publisher's sequence. The zero value
// has accepted nothing.
type cursor struct {
	synced bool
	last   uint64 // the watermark; meaningful only when synced
	// The run of stale batches seen since the last accepted one: how many
	// different ones, and the last one.
	staleRun  int
	staleLast uint64
}

// restartRun is how many different live batches in a row, all at or below
// the watermark with none accepted between them, show that the publisher
// restarted with a fresh sequence. A duplicate or a batch a relay held back
// is one stale batch between accepted ones (a duplicate of a held-back one,
// two) and never makes such a run; a new publisher counting up from 0 under
// the old watermark makes one within three batches, in whatever order a
// relay passes them on. (Counting only batches each one above the one
// before, as this once did, missed a restart behind a reordering relay for
// as long as it reordered: by then the new sequence could pass the old
// watermark and be taken for the old one.)
const restartRun = 3

// restarted records the stale live batch seq and reports whether the
// publisher has restarted: the batch is the first of a new subscriber
// session (an old publisher, reconnected, never sends below its watermark),
// or it completes a run of restartRun stale batches (the only sign when a
// proxy or a collector socket keeps the connection up while the engine
// behind it restarts). A batch equal to the one before it is a duplicate and
// does not lengthen the run.
func (c *cursor) restarted(seq uint64, firstOfSession bool) bool {
	if c.staleRun == 0 || seq != c.staleLast {
		c.staleRun++
	}
	c.staleLast = seq
	return firstOfSession || c.staleRun >= restartRun
}

// watermark returns the last accepted sequence number and whether there is one.
func (c cursor) watermark() (last uint64, synced bool) { return c.last, c.synced }

// observe classifies the live sequence number seq. It does not move the
// cursor: the caller advances it for every batch it accepts, replayed or live.
//
// A cursor that has accepted nothing takes seq 0 as the start of the stream
// and asks for [0, seq) otherwise: the publisher was already running when the
// subscription began, and its earlier batches are in its replay ring. That
// initial catch-up is the only range that starts at 0; replayRange reads it
// knowing that some publishers number from 1 (below).
func (c cursor) observe(seq uint64) observation {
	switch {
	case !c.synced:
		if seq > 0 {
			return observation{verdict: verdictReplay, from: 0, to: seq}
		}
	case seq <= c.last:
		return observation{verdict: verdictStale}
	case seq > c.last+1:
		return observation{verdict: verdictReplay, from: c.last + 1, to: seq, gap: true}
	}
	return observation{verdict: verdictAccept}
}

// advance moves the watermark to seq, an accepted batch. Callers accept only
// what observe or a replayRange let through, which is always above the
// watermark.
func (c *cursor) advance(seq uint64) {
	c.synced, c.last, c.staleRun = true, seq, 0
}

// replayRange classifies the answer to one replay request for [start,
// target): fed the replayed sequence numbers in arrival order, it says which
// ones to apply and, at the end, whether the range came back whole.
//
// The engine answers with every batch still in its ring from start on, so a
// range can come back short in known ways, each with its Reason* constant: the
// ring had nothing (ReasonEmpty), had already dropped the start of the range
// (ReasonStartedAfterRequested), skipped batches inside it
// (ReasonNonContiguous), or stopped before target (ReasonEndedBeforeTarget).
// The first anomaly seen is the one reported.
//
// vLLM numbers its batches from 0; llm-d-inference-sim numbers them from 1. So
// in the initial catch-up (a range starting at 0) a publisher is taken to
// number from 1 when its first live batch is 1, or when the replay answer
// starts at 1: batch 0 then never existed, and its absence is neither a gap
// nor a loss. Otherwise the range counts from 0, as vLLM's does. The one case
// this misreads, a vLLM ring that dropped exactly batch 0 and kept batch 1,
// cannot happen while the ring is longer than one batch (vLLM keeps 10,000).
type replayRange struct {
	start, target uint64
	next          uint64 // the lowest sequence number still acceptable
	got           uint64 // batches taken
	first         uint64 // the first batch taken, when got > 0
	skipped       uint64 // sequence numbers passed over between taken batches (and before the first)
	reason        string // the first anomaly seen, if any
}

func newReplayRange(start, target uint64) replayRange {
	return replayRange{start: start, target: target, next: start}
}

// take reports whether the replayed batch seq is to be applied: it must lie
// in the range and above every batch taken before it. Batches before the
// range, duplicates, batches arriving out of order and those at or after
// target (the live batch that caused the replay, and anything newer, which
// arrives live) are ignored.
func (r *replayRange) take(seq uint64) bool {
	if r.got == 0 && r.start == 0 && seq == 1 {
		r.start, r.next = 1, 1 // a publisher numbering from 1
	}
	if seq < r.next || seq >= r.target {
		return false
	}
	if seq > r.next {
		r.skipped += seq - r.next
		if r.got == 0 {
			r.reason = cmp.Or(r.reason, ReasonStartedAfterRequested)
		} else {
			r.reason = cmp.Or(r.reason, ReasonNonContiguous)
		}
	}
	if r.got == 0 {
		r.first = seq
	}
	r.got++
	r.next = seq + 1
	return true
}

// past reports whether the replayed batch seq, just given to take, ends the
// range: the range is in, or, an engine answering oldest first, seq is
// beyond it and no batch of the range can follow.
func (r *replayRange) past(seq uint64) bool {
	return r.next >= r.target || seq >= r.target
}

// missing returns how many sequence numbers the answer passed over, for an
// open-ended catch-up whose end is not known: the batches before the first one
// taken (none when the publisher numbers from 1 and the answer starts at 1)
// and the holes between taken ones. An empty answer misses nothing: the
// publisher may have published nothing yet.
func (r replayRange) missing() uint64 { return r.skipped }

// result returns how many batches were taken, how many of the range are
// known lost, and why the range is incomplete, "" when it came back whole.
func (r replayRange) result() (got, lost uint64, reason string) {
	if r.start == 0 && (r.target == 1 || r.got > 0 && r.first == 1) {
		r.start = 1 // a publisher numbering from 1: batch 0 never existed
	}
	if r.target > r.start {
		lost = r.target - r.start - r.got
	}
	switch {
	case r.start >= r.target: // nothing was asked for
	case r.reason != "":
		reason = r.reason
	case r.got == 0:
		reason = ReasonEmpty
	case r.next < r.target:
		reason = ReasonEndedBeforeTarget
	}
	return r.got, lost, reason
}
