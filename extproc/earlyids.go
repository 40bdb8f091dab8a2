package extproc

import (
	"bytes"

	"github.com/kvselect/kvselect/internal/sizepool"
)

// In FULL_DUPLEX_STREAMED a long body reaches the picker in Envoy's 16 KiB
// chunks, and the pick can only start at its end: a 100k-token prompt's
// ~600 KB arrive in ~40 messages, a 1M-token one's in ~380. earlyIDs reads
// the prompt's ids from the chunks as they come, so that at the body's end
// only the last chunk's ids are left to read: the scan (most of a long
// prompt's parse) happens while the rest of the body is still on its way,
// not between the body's end and the routing decision.
//
// Exactness: it cannot know yet which array is the prompt (that takes the
// whole body: liftTokenIDs), so it reads the first array that starts with
// an id — a candidate, the '[' at open — with scanPackedIDs only, which
// reads an id only once the comma after it has arrived. Reading an array is
// a function of its bytes alone, and the bytes already received never
// change (the body is only appended to), so when the array liftTokenIDs
// reads starts at open, scanIDArrayFrom goes on from next with the ids read
// so far and gets what reading from open would. Anything else — another
// array, a candidate given up, a body that is not JSON — is read as before.

// earlyMin is the body size from which the ids are read as they arrive:
// below it the whole scan is a few microseconds.
const earlyMin = 32 << 10

// earlyIDs is the state of the early read of one request body.
type earlyIDs struct {
	// pool lends long prompts' id arrays (nil: allocate); the stream
	// gives the request's back once it is booked (pick).
	pool   *sizepool.Pool[uint32]
	open   int      // the candidate array's '[' (when active)
	next   int      // the first byte of the candidate not read yet
	tokens []uint32 // the candidate's ids read so far
	from   int      // where the search for the next candidate goes on
	active bool     // a candidate is being read
}

// advance reads what arrived of b since the last call: it takes the next
// '[' as a candidate and reads its ids as far as scanPackedIDs can. A
// candidate it stops in before the last 72 bytes of b is given up (another
// field's array, text, a form scanPackedIDs leaves to scanIDArray's loop)
// and the search goes on after it. total is the body's announced length
// (0: unknown), which sizes the ids' slice. Each call goes on from where
// the last one stopped: a body is read once, whatever its chunks.
func (e *earlyIDs) advance(b []byte, total int) {
	for {
		if !e.active {
			k := bytes.IndexByte(b[e.from:], '[')
			if k < 0 {
				e.from = len(b)
				return
			}
			e.open = e.from + k
			e.active, e.next, e.tokens = true, e.open+1, e.tokens[:0]
		}
		// An id starts after the whitespace (after '[' or a comma) where
		// the last call may have stopped, as in scanIDArray.
		e.next = skipWS(b, e.next)
		if e.next < len(b) && b[e.next]-'0' <= 9 {
			// Every id read takes at least two bytes (a digit and a
			// comma): room for that many never runs out in
			// scanPackedIDs.
			e.tokens = growIDs(e.pool, e.tokens, (len(b)-e.next)/2+1, e.estimate(total))
			e.tokens, e.next, _ = scanPackedIDs(b, e.next, e.tokens)
		}
		if e.next+72 > len(b) {
			return // stopped for want of bytes: the next chunk goes on
		}
		e.active, e.from = false, e.next
	}
}

// resumes returns the ids read and where to go on from, when the array at
// open is the candidate and at least one of its ids was read.
func (e *earlyIDs) resumes(open int) ([]uint32, int, bool) {
	if e == nil || !e.active || e.open != open || len(e.tokens) == 0 {
		return nil, 0, false
	}
	return e.tokens, e.next, true
}

// estimate is how many ids the candidate will hold if the rest of a body
// of total bytes is ids as dense as those read so far, and an eighth more;
// 0 when there is nothing to go by. It is held to a quarter of total, so
// that the ids' room (4 bytes an id) is never larger than the body's
// buffer, which appendBody has already sized from the same announced
// length: a body that announces more than it sends makes the picker take
// at most that much again. A prompt's ids take 4 bytes or more each in the
// body (three digits and a comma, for any vocabulary of 1,000 ids and
// more), so the bound does not bind on a real prompt.
func (e *earlyIDs) estimate(total int) int {
	read := e.next - e.open
	if total <= e.next || len(e.tokens) == 0 || read <= 0 {
		return 0
	}
	// In floating point: total is the client's content-length, as large
	// as --extproc-max-body-bytes lets it be, and must not overflow.
	n := float64(len(e.tokens)) * float64(total-e.open) / float64(read) * 9 / 8
	return int(min(n, float64(total/4)))
}

// growIDs returns ids with room for at least more ids after its length.
// When it grows it takes room for estimate ids, and at least half again
// its capacity: the body arrives in many chunks, and each growth copies
// the ids read so far. The new array comes from pool when it is not nil,
// and the old one goes back to it: only the early read refers to it.
func growIDs(pool *sizepool.Pool[uint32], ids []uint32, more, estimate int) []uint32 {
	need := len(ids) + more
	if need <= cap(ids) {
		return ids
	}
	size := max(need, estimate, cap(ids)+cap(ids)/2)
	if pool == nil {
		grown := make([]uint32, len(ids), size)
		copy(grown, ids)
		return grown
	}
	grown := append(pool.Get(size), ids...)
	pool.Put(ids)
	return grown
}
