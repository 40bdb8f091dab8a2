package kvhash

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

func seq(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i)
	}
	return t
}

func TestXXH3SeedVector(t *testing.T) {
	if got, want := xxh3.HashSeed([]byte("test data"), Seed), uint64(13226331709069118873); got != want {
		t.Fatalf("xxh3(test data, 1337) = %d, want %d", got, want)
	}
}

func TestSaltVectors(t *testing.T) {
	for _, tc := range []struct {
		lora, ns string
		want     uint64
	}{
		{"", "", 1337},
		{"adapter-a", "", 8842669519798868182},
		{"", "tenant-a", 1948188790972764086},
		{"adapter-a", "tenant-a", 10790858310771630931},
	} {
		if got := Salt(tc.lora, tc.ns); got != tc.want {
			t.Errorf("Salt(%q, %q) = %d, want %d", tc.lora, tc.ns, got, tc.want)
		}
	}
}

// Public-mode golden vectors, computed from the LocalBlockHash and
// public-xxh3-v1 definitions with the reference XXH3_64bits_withSeed (the same
// implementation that reproduces Dynamo's keyed vectors below).
func TestPublicVectors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tokens    []uint32
		lora, ns  string
		opts      BlockOptions
		wantLocal []uint64
		wantSeq   []uint64
	}{
		{"no salt", seq(8), "", "", BlockOptions{BlockSize: 4},
			[]uint64{9143094415614847814, 12124091508212882195}, []uint64{9143094415614847814, 9510318385840434533}},
		{"lora", seq(8), "adapter-a", "", BlockOptions{BlockSize: 4},
			[]uint64{6665157333201000639, 11721812545976571723}, []uint64{6665157333201000639, 13351519314849170528}},
		{"namespace", seq(8), "", "tenant-a", BlockOptions{BlockSize: 4},
			[]uint64{17009624042690211646, 10000672136415158886}, []uint64{17009624042690211646, 18279821067719767880}},
		{"lora and namespace", seq(8), "adapter-a", "tenant-a", BlockOptions{BlockSize: 4},
			[]uint64{8269515957840517240, 11937877779520612889}, []uint64{8269515957840517240, 16913744751721653295}},
		{"bs16", seq(32), "", "", BlockOptions{BlockSize: 16},
			[]uint64{15310707395893867146, 15292316782987903195}, []uint64{15310707395893867146, 13769157705258532664}},
		{"eagle", seq(9), "", "", BlockOptions{BlockSize: 4, Eagle: true},
			[]uint64{14562210786876287112, 15916330181359808192}, []uint64{14562210786876287112, 11643125693293304894}},
		{"mm on block 0", seq(8), "", "", BlockOptions{BlockSize: 4, MM: [][]uint64{{42}}},
			[]uint64{18280081842874931122, 12124091508212882195}, []uint64{18280081842874931122, 10220977589420084508}},
		{"partial tail ignored", seq(10), "", "", BlockOptions{BlockSize: 4},
			[]uint64{9143094415614847814, 12124091508212882195}, []uint64{9143094415614847814, 9510318385840434533}},
		{"shorter than a block", seq(3), "", "", BlockOptions{BlockSize: 4}, []uint64{}, []uint64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := LocalBlockHashes(tc.tokens, tc.lora, tc.ns, tc.opts)
			if !slices.Equal(local, tc.wantLocal) {
				t.Fatalf("local = %v, want %v", local, tc.wantLocal)
			}
			if got := SequenceHashes(local); !slices.Equal(got, tc.wantSeq) {
				t.Fatalf("seq = %v, want %v", got, tc.wantSeq)
			}
			tr, err := NewTracker(TrackingConfig{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var h Hasher
			got := tr.AppendTrackingHashes(&h, nil, tc.tokens, Scope{BlockSize: uint32(tc.opts.BlockSize), LoraName: tc.lora, CacheNamespace: tc.ns, Eagle: tc.opts.Eagle}, tc.opts.MM, true)
			if len(tc.wantSeq) > 0 && !slices.Equal(got, tc.wantSeq) {
				t.Fatalf("public tracking = %v, want %v", got, tc.wantSeq)
			}
			// The shortcut callers take in public mode gives the same hashes.
			if !tr.DerivesFromLocal() || !slices.Equal(AppendSequenceHashes(nil, local, Seed), got) {
				t.Fatalf("chaining the local hashes differs from public tracking hashes")
			}
		})
	}
}

func TestSingleBlockVectors(t *testing.T) {
	for n, want := range map[int]uint64{8: 12126819726423666500, 32: 5756925433886871916, 64: 3480597578098033343, 128: 9509643624113304476} {
		got := LocalBlockHashes(seq(n), "", "", BlockOptions{BlockSize: n})
		if len(got) != 1 || got[0] != want {
			t.Errorf("block of %d tokens = %v, want %d", n, got, want)
		}
	}
}

func TestWireHashesKeepTheBits(t *testing.T) {
	blocks := []uint64{1, 1 << 63, math.MaxUint64}
	block, sequence := WireHashes(blocks)
	chain := SequenceHashes(blocks)
	want := []int64{1, math.MinInt64, -1}
	for i := range blocks {
		if block[i] != want[i] || uint64(sequence[i]) != chain[i] {
			t.Errorf("%d: block %d sequence %d, want %d and %d", i, block[i], sequence[i], want[i], int64(chain[i]))
		}
	}
	if b, s := WireHashes(nil); len(b) != 0 || len(s) != 0 {
		t.Errorf("no blocks: %v %v", b, s)
	}
}

func TestMMHashesSortedAndPadValue(t *testing.T) {
	a := LocalBlockHashes(seq(4), "", "", BlockOptions{BlockSize: 4, MM: [][]uint64{{9, 3}}})
	b := LocalBlockHashes(seq(4), "", "", BlockOptions{BlockSize: 4, MM: [][]uint64{{3, 9}}})
	if !slices.Equal(a, b) {
		t.Fatalf("multimodal hash order changed the block hash: %v vs %v", a, b)
	}
	if got := MMPadValue(9533257059414191570); got != 49115154 {
		t.Fatalf("pad value = %d, want 49115154", got)
	}
}

func key(b byte) (k [KeySize]byte) {
	for i := range k {
		k[i] = b
	}
	return k
}

// Dynamo's own keyed-xxh3-v1 vectors (tracking_hash.rs tests).
func TestKeyedVectors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		key      byte
		scope    Scope
		tokens   []uint32
		mm       [][]uint64
		want     []uint64
		wantSeed [2]uint64
	}{
		{"full scope", 0x5a, Scope{Model: "model-a", RoutingGroup: "tenant-a", BlockSize: 4, CacheNamespace: "cache-a", LoraName: "adapter-a"},
			seq(12), nil, []uint64{4363769719052127296, 14998523962162619427, 13920914207884994756},
			[2]uint64{18195031674076271517, 8617989506309882921}},
		{"multimodal", 0x41, Scope{Model: "model", RoutingGroup: "default", BlockSize: 4},
			seq(10), [][]uint64{{42}}, []uint64{13077030603177067515, 12131634976806651614}, [2]uint64{}},
		{"eagle", 0x41, Scope{Model: "model", RoutingGroup: "default", BlockSize: 4, Eagle: true},
			seq(10), nil, []uint64{18351479723295049348, 8577555336206814019}, [2]uint64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := NewKeyedTracker(key(tc.key), "2026-01")
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantSeed != [2]uint64{} {
				b, c := tr.Seeds(tc.scope)
				if [2]uint64{b, c} != tc.wantSeed {
					t.Fatalf("seeds = %d, %d, want %v", b, c, tc.wantSeed)
				}
			}
			var h Hasher
			if got := tr.AppendTrackingHashes(&h, nil, tc.tokens, tc.scope, tc.mm, true); !slices.Equal(got, tc.want) {
				t.Fatalf("keyed seq = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTrackerConfigErrors(t *testing.T) {
	k := key(0x5a)
	good, short := k[:], k[:31]
	for _, tc := range []struct {
		name string
		cfg  TrackingConfig
		ok   bool
	}{
		{"public default", TrackingConfig{}, true},
		{"public explicit", TrackingConfig{Algorithm: AlgorithmPublic}, true},
		{"public rejects a key", TrackingConfig{Key: good}, false},
		{"public rejects key id", TrackingConfig{KeyID: "x"}, false},
		{"unknown algorithm", TrackingConfig{Algorithm: "sha256"}, false},
		{"keyed ok", TrackingConfig{Algorithm: AlgorithmKeyed, Key: good, KeyID: " 2026-01 "}, true},
		{"keyed needs id", TrackingConfig{Algorithm: AlgorithmKeyed, Key: good, KeyID: "  "}, false},
		{"keyed needs a key", TrackingConfig{Algorithm: AlgorithmKeyed, KeyID: "a"}, false},
		{"keyed short key", TrackingConfig{Algorithm: AlgorithmKeyed, Key: short, KeyID: "a"}, false},
		{"keyed long key", TrackingConfig{Algorithm: AlgorithmKeyed, Key: append(k[:], 0), KeyID: "a"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := NewTracker(tc.cfg, nil)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrTrackingConfig) {
				t.Fatalf("error %v does not wrap ErrTrackingConfig", err)
			}
			if tc.ok && tc.cfg.Algorithm == AlgorithmKeyed {
				var h Hasher
				got := tr.AppendTrackingHashes(&h, nil, seq(12), Scope{Model: "model-a", RoutingGroup: "tenant-a", BlockSize: 4, CacheNamespace: "cache-a", LoraName: "adapter-a"}, nil, true)
				if got[0] != 4363769719052127296 {
					t.Fatalf("keyed tracker from file gives %v", got)
				}
			}
		})
	}
}

func TestRandomTrackingHashes(t *testing.T) {
	tr, err := NewTracker(TrackingConfig{}, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	var h Hasher
	a := tr.AppendTrackingHashes(&h, nil, seq(8), Scope{BlockSize: 4}, nil, false)
	b := tr.AppendTrackingHashes(&h, nil, seq(8), Scope{BlockSize: 4}, nil, false)
	if len(a) != 2 || len(b) != 2 || slices.Equal(a, b) {
		t.Fatalf("random tracking hashes should differ per call: %v %v", a, b)
	}
}

func BenchmarkLocalBlockHashes16Tokens(b *testing.B) {
	tokens := seq(16 * 128)
	var h Hasher
	dst := make([]uint64, 0, 128)
	b.ReportAllocs()
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		dst = h.AppendBlockHashes(dst[:0], tokens, Seed, BlockOptions{BlockSize: 16})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tokens)), "ns/token")
}

// BenchmarkHashLongPrompt is a long prompt's hashing as a selection does it:
// the block hashes of 16-token blocks and their public sequence chain, into
// reused destinations (6,250 blocks at 100k tokens, 62,500 at 1M).
func BenchmarkHashLongPrompt(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			tokens := seq(n)
			var h Hasher
			blocks := BlockOptions{BlockSize: 16}.NumBlocks(n)
			locals, chain := make([]uint64, 0, blocks), make([]uint64, 0, blocks)
			b.ReportAllocs()
			b.SetBytes(int64(n * 4))
			for b.Loop() {
				locals = h.AppendBlockHashes(locals[:0], tokens, Seed, BlockOptions{BlockSize: 16})
				chain = AppendSequenceHashes(chain[:0], locals, Seed)
			}
		})
	}
}
