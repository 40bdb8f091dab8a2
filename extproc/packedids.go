package extproc

import (
	"encoding/binary"
	"math/bits"
)

// A long prompt's ids are almost always written the same way: an id, a
// comma, maybe a space or a newline and indentation, the next id. Reading
// them one after the other, each id's end found in the bytes just loaded,
// makes a chain of dependent loads (~1 ns a byte). scanPackedIDs finds
// every separator of 64 bytes at once instead (a bit mask built eight bytes
// at a time, SWAR), so each id's bounds come from the mask and its digits'
// load and value no longer wait on the id before: the loads overlap.
//
// It reads only the ids it is sure of, each exactly as scanIDArray's loop
// reads it, and stops at the first id it is not sure of (more than eight
// digits, a leading zero, whitespace before a comma, the array's end, the
// body's last 72 bytes, anything else); the loop reads that one, and
// rejects what it rejects.

// packedRetry is how many ids scanIDArray's own loop reads after a call to
// scanPackedIDs that read none, before the next call.
const packedRetry = 32

// scanPackedIDs reads ids from b[i], the first byte of an id, while each
// has one to eight digits without a leading zero and is followed directly
// by a comma, then any JSON whitespace. It appends them to tokens, whose
// capacity the caller sized (one id per comma it reads), and returns them,
// the index of the first id it did not read with the whitespace before it
// skipped, and how many ids it read.
func scanPackedIDs(b []byte, i int, tokens []uint32) (_ []uint32, next, read int) {
	// The ids are stored by index into the capacity, not appended: an
	// append's possible call to grow the slice would make the compiler
	// keep the loop's state in memory.
	n := len(tokens)
	dst := tokens[:cap(tokens)]
	// Each window starts at the first byte of an id not read yet, so
	// that every offset in it is small and known to be in it: an id's
	// eight-byte load starts at most 64 bytes in.
	for i+72 <= len(b) {
		c := (*[72]byte)(b[i:])
		s := 0
		for m := nonDigits64((*[64]byte)(c[:64])); m != 0; m &= m - 1 {
			p := bits.TrailingZeros64(m)
			if p == s {
				// Whitespace after a comma (not before the first id:
				// the caller skipped it, and anything else there is
				// not an id).
				if n == len(tokens) || !isJSONSpace(c[p]) {
					return dst[:n], skipWS(b, i+s), n - len(tokens)
				}
				s = p + 1
				continue
			}
			w := binary.LittleEndian.Uint64(c[s:])
			l := p - s
			if c[p] != ',' || l > 8 || (l > 1 && byte(w) == '0') || n >= len(dst) {
				return dst[:n], i + s, n - len(tokens)
			}
			dst[n] = uint32(packedValue(w, l))
			n++
			s = p + 1
		}
		if s == 0 {
			break
		}
		i += s
	}
	return dst[:n], skipWS(b, i), n - len(tokens)
}

// nonDigits64 returns a mask of the bytes of c that are not ASCII digits,
// bit k for c[k]. Per byte, exactly (no carry crosses bytes): t = c^'0' is
// below 10 for a digit only; (t&0x7f)+0x76 sets the high bit for t from 10
// to 127 and t itself for the rest. The eight high bits of a word are then
// gathered into one byte by a multiply (x86's movemask, done in a general
// register): each partial product lands on its own bit, none overlap, so
// no carry disturbs the top byte.
func nonDigits64(c *[64]byte) uint64 {
	return nonDigits8(binary.LittleEndian.Uint64(c[0:])) |
		nonDigits8(binary.LittleEndian.Uint64(c[8:]))<<8 |
		nonDigits8(binary.LittleEndian.Uint64(c[16:]))<<16 |
		nonDigits8(binary.LittleEndian.Uint64(c[24:]))<<24 |
		nonDigits8(binary.LittleEndian.Uint64(c[32:]))<<32 |
		nonDigits8(binary.LittleEndian.Uint64(c[40:]))<<40 |
		nonDigits8(binary.LittleEndian.Uint64(c[48:]))<<48 |
		nonDigits8(binary.LittleEndian.Uint64(c[56:]))<<56
}

// nonDigits8 is nonDigits64 for the eight bytes of w, the first in its low
// byte: bit k for byte k.
func nonDigits8(w uint64) uint64 {
	const ones = 0x0101010101010101
	t := w ^ (0x30 * ones)
	hi := ((t&(0x7f*ones) + 0x76*ones) | t) & (0x80 * ones)
	return hi >> 7 * 0x0102040810204080 >> 56
}

// packedValue is the value of the l (1 to 8) decimal digits w starts with
// (the first in its low byte), combined pairwise as digits8 does.
func packedValue(w uint64, l int) uint64 {
	const ones = 0x0101010101010101
	// Subtracting '0' borrows only above the digits, which the shift
	// drops; the zeros it brings in read as leading zeros.
	d := (w - 0x30*ones) << (uint(64-8*l) & 63)
	d = d*10 + d>>8
	return ((d&0x000000ff000000ff)*(100+1000000<<32) + (d>>16&0x000000ff000000ff)*(1+10000<<32)) >> 32
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }
