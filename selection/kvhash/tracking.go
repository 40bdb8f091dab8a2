package kvhash

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/zeebo/blake3"
)

// Tracking-hash algorithm names, as accepted by --router-tracking-hash and
// DYN_ROUTER_TRACKING_HASH.
const (
	AlgorithmPublic = "public-xxh3-v1"
	AlgorithmKeyed  = "keyed-xxh3-v1"
)

// KeySize is the exact size of a keyed-xxh3-v1 key file.
const KeySize = 32

// keyedDomain separates keyed tracking derivations from any other use of the key.
// The trailing NUL is part of Dynamo's domain string.
const keyedDomain = "dynamo.router.tracking-hash/keyed-xxh3-v1\x00"

// ErrTrackingConfig is wrapped by every tracking configuration error.
var ErrTrackingConfig = errors.New("invalid tracking-hash configuration")

// TrackingConfig selects how router-side tracking hashes (active-load identities,
// reservations, replica sync) are derived. Primary index lookups always use the
// public LocalBlockHash, whatever this says.
type TrackingConfig struct {
	// Algorithm is AlgorithmPublic (the default when empty) or AlgorithmKeyed.
	Algorithm string
	// Key is the KeySize-byte secret (keyed mode only). The caller reads it
	// from wherever it is kept (the server reads --router-tracking-key-file);
	// the tracker copies it.
	Key []byte
	// KeyID names the key epoch (keyed mode only); it is trimmed and must be non-empty.
	KeyID string
}

// Scope is what a keyed derivation binds a tracking hash to.
type Scope struct {
	Model          string
	RoutingGroup   string
	BlockSize      uint32
	CacheNamespace string
	LoraName       string
	Eagle          bool
}

// Tracker derives tracking hashes. It is safe for concurrent use.
type Tracker struct {
	keyed bool
	key   [KeySize]byte
	keyID string
	mu    sync.Mutex // guards rnd
	rnd   *rand.Rand
}

// NewTracker validates cfg. rnd supplies the
// random hashes (KV reuse not assumed, placeholder output blocks); nil seeds a
// private ChaCha8 source from crypto/rand. Pass a seeded source for determinism.
func NewTracker(cfg TrackingConfig, rnd *rand.Rand) (*Tracker, error) {
	if rnd == nil {
		var seed [32]byte
		_, _ = crand.Read(seed[:]) // never fails on supported platforms
		rnd = rand.New(rand.NewChaCha8(seed))
	}
	t := &Tracker{rnd: rnd}
	switch cfg.Algorithm {
	case "", AlgorithmPublic:
		if cfg.Key != nil || cfg.KeyID != "" {
			return nil, fmt.Errorf("%w: %s takes no key or key id", ErrTrackingConfig, AlgorithmPublic)
		}
		return t, nil
	case AlgorithmKeyed:
	default:
		return nil, fmt.Errorf("%w: unknown algorithm %q (want %s or %s)", ErrTrackingConfig, cfg.Algorithm, AlgorithmPublic, AlgorithmKeyed)
	}
	id := strings.TrimSpace(cfg.KeyID)
	if id == "" {
		return nil, fmt.Errorf("%w: %s needs a non-empty key id", ErrTrackingConfig, AlgorithmKeyed)
	}
	if cfg.Key == nil {
		return nil, fmt.Errorf("%w: %s needs a key", ErrTrackingConfig, AlgorithmKeyed)
	}
	if len(cfg.Key) != KeySize {
		return nil, fmt.Errorf("%w: the key holds %d bytes, want exactly %d", ErrTrackingConfig, len(cfg.Key), KeySize)
	}
	t.keyed = true
	t.keyID = id
	copy(t.key[:], cfg.Key)
	return t, nil
}

// NewKeyedTracker builds a keyed-xxh3-v1 tracker from key material already in
// memory (tests, embedders that manage keys themselves).
func NewKeyedTracker(key [KeySize]byte, keyID string) (*Tracker, error) {
	id := strings.TrimSpace(keyID)
	if id == "" {
		return nil, fmt.Errorf("%w: %s needs a non-empty key id", ErrTrackingConfig, AlgorithmKeyed)
	}
	t, err := NewTracker(TrackingConfig{}, nil)
	if err != nil {
		return nil, err
	}
	t.keyed, t.key, t.keyID = true, key, id
	return t, nil
}

// DerivesFromLocal reports whether tracking hashes are the public sequence hashes
// of the LocalBlockHashes (public-xxh3-v1: same block seed, chain seed Seed), so
// a caller that already hashed the blocks can chain them instead of hashing the
// tokens again.
func (t *Tracker) DerivesFromLocal() bool { return !t.keyed }

// Algorithm reports the configured algorithm name.
func (t *Tracker) Algorithm() string {
	if t.keyed {
		return AlgorithmKeyed
	}
	return AlgorithmPublic
}

// Seeds returns the block seed and chain seed for scope. In public mode they are
// Salt(lora, namespace) and Seed; in keyed mode both come from a BLAKE3 keyed
// digest over the framed scope, as in Dynamo's tracking_hash.rs: the domain
// string, then tag-numbered frames (tag byte, u64 LE length, bytes) for the key
// id, model, routing group, 4-byte block size, the optional cache namespace and
// LoRA name (a presence byte before the length), and the Eagle flag. The first
// two little-endian u64 words of the digest are the block and chain seeds.
func (t *Tracker) Seeds(s Scope) (blockSeed, chainSeed uint64) {
	if !t.keyed {
		return Salt(s.LoraName, s.CacheNamespace), Seed
	}
	h, err := blake3.NewKeyed(t.key[:])
	if err != nil {
		// NewKeyed fails only for a key of the wrong size, which the type rules out.
		panic(fmt.Sprintf("kvhash: blake3 keyed hasher: %v", err))
	}
	var scratch [16]byte
	frame := func(tag byte, b []byte) {
		scratch[0] = tag
		binary.LittleEndian.PutUint64(scratch[1:9], uint64(len(b)))
		_, _ = h.Write(scratch[:9])
		_, _ = h.Write(b)
	}
	optFrame := func(tag byte, v string) {
		if v == "" {
			_, _ = h.Write([]byte{tag, 0})
			return
		}
		_, _ = h.Write([]byte{tag, 1})
		binary.LittleEndian.PutUint64(scratch[:8], uint64(len(v)))
		_, _ = h.Write(scratch[:8])
		_, _ = h.Write([]byte(v))
	}
	_, _ = h.Write([]byte(keyedDomain))
	frame(1, []byte(t.keyID))
	frame(2, []byte(s.Model))
	frame(3, []byte(s.RoutingGroup))
	var bs [4]byte
	binary.LittleEndian.PutUint32(bs[:], s.BlockSize)
	frame(4, bs[:])
	optFrame(5, s.CacheNamespace)
	optFrame(6, s.LoraName)
	eagle := []byte{0}
	if s.Eagle {
		eagle[0] = 1
	}
	frame(7, eagle)
	var d [32]byte
	h.Sum(d[:0])
	return binary.LittleEndian.Uint64(d[0:8]), binary.LittleEndian.Uint64(d[8:16])
}

// AppendTrackingHashes appends the tracking (sequence) hashes of the complete
// blocks of tokens in scope. mm holds per-block multimodal hashes, as in
// BlockOptions.MM. Without reuse (router_assume_kv_reuse=false, possibly a
// per-request override) every block gets a random hash, so concurrent requests
// never share active blocks.
func (t *Tracker) AppendTrackingHashes(h *Hasher, dst []uint64, tokens []uint32, s Scope, mm [][]uint64, reuse bool) []uint64 {
	o := BlockOptions{BlockSize: int(s.BlockSize), Eagle: s.Eagle, MM: mm}
	if !reuse {
		return t.AppendRandom(dst, o.NumBlocks(len(tokens)))
	}
	blockSeed, chainSeed := t.Seeds(s)
	start := len(dst)
	dst = h.AppendBlockHashes(dst, tokens, blockSeed, o)
	// Chain in place: seq[i] depends only on seq[i-1] and block[i].
	for i := start + 1; i < len(dst); i++ {
		dst[i] = ChainHash(dst[i-1], dst[i], chainSeed)
	}
	return dst
}

// AppendRandom appends n random tracking hashes (router_assume_kv_reuse=false, and
// placeholder output blocks).
func (t *Tracker) AppendRandom(dst []uint64, n int) []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	for range n {
		dst = append(dst, t.rnd.Uint64())
	}
	return dst
}
