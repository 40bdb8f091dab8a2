package extproc

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvselect/kvselect/internal/tracing"
	"github.com/kvselect/kvselect/selection"
)

// freeTimeout bounds the free at the stream's end; it runs on a context
// detached from the (usually cancelled) stream context.
const freeTimeout = 5 * time.Second

// bookingCore is what a booking asks of the selection service;
// *selection.Service is the one implementation the picker runs with.
type bookingCore interface {
	ResponseBegan(ctx context.Context, id string, firstToken bool) error
	OutputTokens(ctx context.Context, id string, generated int) (added int, err error)
	Free(ctx context.Context, id string) error
	EndByEstimate(ctx context.Context, id string, limit int) (time.Time, error)
}

// booking is the stream's view of its reservation in the selection service,
// from the pick to its single free. The rule it keeps: a booking is freed
// exactly once however the stream ends — at the response's end
// (responseEnd), else when the stream ends (streamEnd), or handed to the
// core to be freed at its estimated end when the stream ends without the
// response the gateway will never show (endByEstimate) — and not at all
// once the core has dropped it (expired, or its worker removed): that is
// counted as lost. A booking is owned by its stream goroutine.
type booking struct {
	core bookingCore
	m    *metrics
	log  *slog.Logger

	id   string
	live bool // booked, and neither freed nor lost
	// limit is the request's output limit (max_tokens; 0 none), a bound
	// of its estimated end.
	limit       int
	prefillDone bool
	// blockSize is the partition's, from the pick; blocks is the whole
	// blocks of output tokens last reported. Together they keep the per-chunk
	// path off the core's locks until another block may be due.
	blockSize, blocks int
	// added counts the output blocks the core added, reported once on the
	// span with the free: an event per block would grow a long answer's
	// span by hundreds of events.
	added int
	// generated is the output tokens the response has streamed, reported
	// the last time the core was told.
	generated, reported int
	// span is the request's span; its lifecycle events go there. Nil in
	// tests that drive a booking alone.
	span trace.Span
}

// event adds a lifecycle event to the request's span when it records.
func (b *booking) event(name string, attrs ...attribute.KeyValue) {
	if b.span != nil && b.span.IsRecording() {
		b.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// booked records the reservation made under id by the pick, in a partition
// of blockSize-token blocks.
func (b *booking) booked(id string, blockSize int) { b.id, b.live, b.blockSize = id, true, blockSize }

// prefillComplete tells the core, once, that the response has begun: the
// prompt's prefill is done and its load goes. streamed says the first byte
// is the first token (an SSE stream), so its time is the request's TTFT.
func (b *booking) prefillComplete(ctx context.Context, streamed bool) {
	if !b.live || b.prefillDone {
		return
	}
	b.prefillDone = true
	if err := b.core.ResponseBegan(ctx, b.id, streamed); err != nil {
		b.updateFailed(err)
		return
	}
	b.event(tracing.EventPrefillComplete)
}

// outputTokens tells the core how many output tokens the response has
// streamed so far; it adds the output blocks they complete.
func (b *booking) outputTokens(ctx context.Context, generated int) {
	if !b.live {
		return
	}
	b.generated = generated
	if b.blockSize > 0 {
		// No whole block more than last time: nothing for the core to add.
		if generated/b.blockSize <= b.blocks {
			return
		}
		b.blocks = generated / b.blockSize
	}
	b.reported = generated
	n, err := b.core.OutputTokens(ctx, b.id, generated)
	if err != nil {
		b.updateFailed(err)
		return
	}
	b.m.outputBlocks.Add(uint64(n))
	b.added += n
}

// responseEnd frees the booking when the response has ended. The free must
// happen even if the stream context is cancelled meanwhile, so it runs on a
// context detached from it.
func (b *booking) responseEnd(ctx context.Context) {
	if !b.live {
		return
	}
	if b.generated > b.reported {
		// The tokens since the last whole block: the response's length, for
		// the latency model's inter-token latency at the free.
		b.reported = b.generated
		if _, err := b.core.OutputTokens(ctx, b.id, b.generated); err != nil {
			b.updateFailed(err)
			if !b.live {
				return
			}
		}
	}
	b.live = false
	b.freed(b.core.Free(context.WithoutCancel(ctx), b.id), &b.m.freedAtEnd, "response_end")
}

// streamEnd runs when the stream ends, however it ends: a booking whose
// response never completed is freed here. By then the stream context is
// usually cancelled (Envoy resets every stream it closes), so the free runs
// on a detached context with its own bound.
func (b *booking) streamEnd(ctx context.Context) {
	if !b.live {
		return
	}
	b.live = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), freeTimeout)
	defer cancel()
	b.freed(b.core.Free(ctx, b.id), &b.m.freedAtStreamEnd, "stream_end")
}

// endByEstimate runs instead of streamEnd when the stream ended without a
// response phase the gateway would ever send (stream.keepToEstimate): the
// response is still running on the worker, unseen, so the core keeps the
// booking to its estimated end. Should the core refuse for another reason
// than the booking being gone, it is freed as at any stream end.
func (b *booking) endByEstimate(ctx context.Context) {
	if !b.live {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), freeTimeout)
	defer cancel()
	end, err := b.core.EndByEstimate(ctx, b.id, b.limit)
	switch {
	case err == nil:
		b.live = false
		b.m.keptToEstimate.Add(1)
		b.event(tracing.EventFreed, attribute.String("kvselect.at", "estimate"), attribute.String("kvselect.estimated_end", end.UTC().Format(time.RFC3339Nano)))
	case selection.KindOf(err) == selection.KindNotFound:
		b.live = false
		b.m.lost.Add(1)
		b.event(tracing.EventFreed, attribute.String("kvselect.at", "lost"))
	default:
		b.log.Warn("extproc: estimated end refused, freeing now", "selection_id", b.id, "err", err)
		b.streamEnd(ctx)
	}
}

// updateFailed handles a failed update. Not found means the core already
// dropped the booking (expired, or its worker removed): nothing is left to
// update or free. Any other failure leaves the booking live, to be freed at
// the end as usual.
func (b *booking) updateFailed(err error) {
	if selection.KindOf(err) == selection.KindNotFound {
		b.live = false
		b.m.lost.Add(1)
		b.event(tracing.EventFreed, attribute.String("kvselect.at", "lost"))
		return
	}
	b.log.Warn("extproc: booking update failed", "selection_id", b.id, "err", err)
}

// freed accounts for the result of the one Free: counted under at, lost
// when the booking was already gone, logged when it failed otherwise. A
// failed free is not retried: the core reclaims a booking it never hears of
// again after the active-request expiry.
func (b *booking) freed(err error, at *atomic.Uint64, why string) {
	switch {
	case err == nil:
		at.Add(1)
		b.event(tracing.EventFreed, attribute.String("kvselect.at", why), attribute.Int("kvselect.output_blocks", b.added))
	case selection.KindOf(err) == selection.KindNotFound:
		b.m.lost.Add(1)
		b.event(tracing.EventFreed, attribute.String("kvselect.at", "lost"))
	default:
		b.log.Warn("extproc: free failed", "selection_id", b.id, "err", err)
	}
}
