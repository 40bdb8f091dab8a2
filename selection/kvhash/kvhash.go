// Package kvhash computes the block and sequence hashes that Dynamo's KV router
// uses, bit for bit: the LocalBlockHash that keys the radix index (xxh3-64 of the
// block's little-endian token ids and multimodal hashes, seeded with the
// LoRA / cache-namespace salt), the chained SequenceHash (public-xxh3-v1), and the
// tracking hashes that identify active requests (public, keyed-xxh3-v1, or random
// when KV reuse is not assumed).
//
// The algorithms are Dynamo's: compute_salt_hash (lib/kv-hashing), the
// LocalBlockHash and its sequence chain (lib/kv-router/src/protocols.rs), and the
// tracking-hash algorithms of lib/kv-router/src/tracking_hash.rs. Dynamo's own
// test vectors, and public-mode vectors computed from the same definitions with
// the reference XXH3, are golden tests in this package. Hashing is
// allocation-free when the caller supplies destination slices with enough
// capacity and reuses a Hasher.
package kvhash

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// Seed is Dynamo's XXH3 seed for block hashes without salt and for the public
// sequence-hash chain (XXH3_SEED in lib/kv-router).
const Seed uint64 = 1337

// Salt returns the block-hash seed for a LoRA adapter and a cache namespace
// (cache_salt). Empty strings contribute nothing; additions wrap, as in Dynamo's
// compute_salt_hash.
func Salt(loraName, cacheNamespace string) uint64 {
	salt := Seed
	if loraName != "" {
		salt += xxh3.HashStringSeed(loraName, 0)
	}
	if cacheNamespace != "" {
		salt += xxh3.HashStringSeed(cacheNamespace, 1)
	}
	return salt
}

// BlockOptions describe how a token sequence is cut into blocks.
type BlockOptions struct {
	// BlockSize is the number of tokens per KV block; it must be positive.
	BlockSize int
	// Eagle selects Eagle speculative-decoding windows: block i covers the
	// BlockSize+1 tokens starting at i*BlockSize, so there are (n-1)/BlockSize
	// complete blocks.
	Eagle bool
	// MM holds, per block index, the multimodal object hashes whose placeholder
	// tokens fall in that block. They are appended, ascending, after the tokens.
	// Blocks beyond len(MM), and nil entries, have none.
	MM [][]uint64
}

// NumBlocks is the number of complete blocks that n tokens make. A partial tail
// block is never hashed or indexed.
func (o BlockOptions) NumBlocks(n int) int {
	if o.BlockSize <= 0 {
		return 0
	}
	if o.Eagle {
		if n < 1 {
			return 0
		}
		return (n - 1) / o.BlockSize
	}
	return n / o.BlockSize
}

// Hasher holds a reusable scratch buffer. The zero value is ready to use; a
// Hasher must not be used by two goroutines at once.
type Hasher struct {
	buf []byte
	mm  []uint64
}

// AppendBlockHashes appends to dst the hash of every complete block of tokens,
// each hashed with seed, and returns the extended slice. With seed = Salt(lora,
// namespace) these are Dynamo's LocalBlockHashes; with a keyed block seed they are
// keyed tracking block hashes.
func (h *Hasher) AppendBlockHashes(dst []uint64, tokens []uint32, seed uint64, o BlockOptions) []uint64 {
	n := o.NumBlocks(len(tokens))
	window := o.BlockSize
	if o.Eagle {
		window++
	}
	for i := 0; i < n; i++ {
		start := i * o.BlockSize
		// Sized once, then filled in place: appending token by token
		// checked the capacity for every token.
		b := slices.Grow(h.buf[:0], 4*window)[:4*window]
		for j, t := range tokens[start : start+window] {
			binary.LittleEndian.PutUint32(b[4*j:4*j+4], t)
		}
		if i < len(o.MM) && len(o.MM[i]) > 0 {
			mm := append(h.mm[:0], o.MM[i]...)
			slices.Sort(mm)
			for _, m := range mm {
				b = binary.LittleEndian.AppendUint64(b, m)
			}
			h.mm = mm
		}
		h.buf = b
		dst = append(dst, xxh3.HashSeed(b, seed))
	}
	return dst
}

// LocalBlockHashes is a convenience wrapper that returns Dynamo's LocalBlockHashes
// of tokens under the LoRA / cache-namespace salt.
func LocalBlockHashes(tokens []uint32, loraName, cacheNamespace string, o BlockOptions) []uint64 {
	var h Hasher
	return h.AppendBlockHashes(make([]uint64, 0, o.NumBlocks(len(tokens))), tokens, Salt(loraName, cacheNamespace), o)
}

// ChainHash is one link of the sequence-hash chain:
// xxh3_64(LE64(prev) || LE64(block), chainSeed).
func ChainHash(prev, block, chainSeed uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], prev)
	binary.LittleEndian.PutUint64(b[8:], block)
	return xxh3.HashSeed(b[:], chainSeed)
}

// AppendSequenceHashes appends the chained sequence hashes of blocks:
// seq[0] = blocks[0], seq[i] = ChainHash(seq[i-1], blocks[i], chainSeed).
// Public mode (public-xxh3-v1) chains with Seed.
func AppendSequenceHashes(dst, blocks []uint64, chainSeed uint64) []uint64 {
	for i, b := range blocks {
		if i == 0 {
			dst = append(dst, b)
			continue
		}
		dst = append(dst, ChainHash(dst[len(dst)-1], b, chainSeed))
	}
	return dst
}

// SequenceHashes returns the public-xxh3-v1 chain of blocks.
func SequenceHashes(blocks []uint64) []uint64 {
	return AppendSequenceHashes(make([]uint64, 0, len(blocks)), blocks, Seed)
}

// WireHashes returns blocks and their public-xxh3-v1 chain as the signed
// 64-bit integers a select request carries them in (block_hashes and
// sequence_hashes of Dynamo's REST API): the same bits, reinterpreted.
func WireHashes(blocks []uint64) (block, sequence []int64) {
	block, sequence = make([]int64, len(blocks)), make([]int64, len(blocks))
	for i, h := range SequenceHashes(blocks) {
		block[i], sequence[i] = int64(blocks[i]), int64(h)
	}
	return block, sequence
}

// MMPadValue is the placeholder token id SGLang and Dynamo use for an image whose
// multimodal hash is mmHash: 1,000,000 + (mmHash mod 2^30).
func MMPadValue(mmHash uint64) uint32 {
	return uint32(1_000_000 + (mmHash & (1<<30 - 1)))
}
