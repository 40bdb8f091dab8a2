package mooncake

// Mix64 is the splitmix64 finalizer: a cheap bijective 64-bit mixer.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

const (
	localSalt  = 0x9e3779b97f4a7c15
	workerSalt = 0xd6e8feb86659fd93
	chainMul   = 0xff51afd7ed558ccd
)

// LocalHash returns the content hash a router indexes for the block with the
// given trace hash id. It depends on the id only, so equal prefixes of ids
// give equal sequences of local hashes on every worker. LocalHash is a
// bijection, so distinct ids never collide.
func LocalHash(id uint64) uint64 { return Mix64(id + localSalt) }

// LocalHashes returns the local hashes of a sequence of hash ids.
func LocalHashes(ids []uint64) []uint64 {
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = LocalHash(id)
	}
	return out
}

// workerSeed is the per-worker root of the engine hash chain, playing the
// role of vLLM's random NONE_HASH seed.
func workerSeed(worker int) uint64 { return Mix64(uint64(worker)*chainMul ^ workerSalt) }

// chainExt returns the engine hash of a block with the given local hash whose
// parent has engine hash prev (or the worker seed for a first block).
func chainExt(prev, local uint64) uint64 {
	return Mix64(Mix64(prev^workerSalt) + local*chainMul)
}

// ChainExts returns the engine (Ext) hashes worker would assign to the
// blocks of a request with the given hash ids: each hash depends on the
// worker and on the whole chain of ids up to and including that block.
func ChainExts(worker int, ids []uint64) []uint64 {
	out := make([]uint64, len(ids))
	prev := workerSeed(worker)
	for i, id := range ids {
		prev = chainExt(prev, LocalHash(id))
		out[i] = prev
	}
	return out
}
