package kvevents

import (
	"errors"
	"reflect"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/selection/index"
)

const wid = 3

var (
	toks4 = seq(10, 4) // two blocks of 2
	l2    = local(toks4, "", "", 2, false, nil)
	dev   = index.WorkerKey{WorkerID: wid}
)

func st2(hashes ...uint64) []index.Block { return blocks(hashes, l2) }

// Table-driven ports of Dynamo's lib/kv-router/src/zmq_wire/tests.rs cases and
// of its normalisation rules (hash signedness, SGLang's slot-7 metadata,
// multimodal extra keys, medium → tier, locality, cache-group filter, block
// size, duplicates). Each case decodes one batch into a fresh decoder
// (BlockSize 2) and compares the events and the one stat that matters.
func TestDecodeEventShapes(t *testing.T) {
	type want struct {
		events []index.Event
		stat   func(Stats) int
	}
	stored := func(bs ...index.Block) []index.Event {
		return []index.Event{{Worker: dev, Kind: index.EventStored, Blocks: bs}}
	}
	none := []index.Event(nil)
	tests := []struct {
		name  string
		batch []byte
		want  want
	}{
		{"positional_v09_stored", batch(0, storedPos(Hs(11, 12), Nil(), Toks(toks4...), 2)),
			want{stored(st2(11, 12)...), nil}},
		{"positional_v09_removed", batch(0, A(S("BlockRemoved"), Hs(11))),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved, Hashes: []uint64{11}}}, nil}},
		{"map_stored_equals_positional", batch(0, M("type", S("BlockStored"), "block_hashes", Hs(11, 12),
			"token_ids", Toks(toks4...), "block_size", U(2), "lora_id", Nil(), "medium", S("GPU"),
			"lora_name", Nil(), "some_future_key", A(U(1), M("x", Nil())))),
			want{stored(st2(11, 12)...), nil}},
		{"map_type_not_first", batch(0, M("block_hashes", Hs(11), "type", S("BlockRemoved"))),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved, Hashes: []uint64{11}}}, nil}},
		{"signed_negative_hashes", batch(0, storedPos(SignedHs(1<<63|5, 0xffffffffffffffff), I(-2), Toks(toks4...), 2)),
			want{[]index.Event{{Worker: dev, Kind: index.EventStored, Parent: 0xfffffffffffffffe, HasParent: true,
				Blocks: st2(1<<63|5, 0xffffffffffffffff)}}, nil}},
		{"unsigned_large_hashes", batch(0, storedPos(Hs(1<<63|5, 7), U(1<<64-1), Toks(toks4...), 2)),
			want{[]index.Event{{Worker: dev, Kind: index.EventStored, Parent: 1<<64 - 1, HasParent: true,
				Blocks: st2(1<<63|5, 7)}}, nil}},
		{"bin_hashes_last8_bigendian", batch(0, storedPos(
			A(Bin(append(make([]byte, 24), 1, 2, 3, 4, 5, 6, 7, 8)), Bin([]byte{0xab, 0xcd})),
			Bin([]byte{9}), Toks(toks4...), 2)),
			want{[]index.Event{{Worker: dev, Kind: index.EventStored, Parent: 9, HasParent: true,
				Blocks: st2(0x0102030405060708, 0xabcd)}}, nil}},
		{"sglang_metadata_slot7_salt", batch(0, storedPos(SignedHs(11), Nil(), Toks(10, 11), 2, S("GPU"),
			M("cache_salt", S("tenant-a"), "session_id", S("s1")))),
			want{stored(index.Block{Ext: 11, Local: local(seq(10, 2), "", "tenant-a", 2, false, nil)[0]}), nil}},
		{"sglang_metadata_beats_extra_key_salt", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(),
			M("cache_salt", S("tenant-a")), A(A(S("dynamo-cache-salt:tenant-b"))))),
			want{stored(index.Block{Ext: 11, Local: local(seq(10, 2), "", "tenant-a", 2, false, nil)[0]}), nil}},
		{"sglang_metadata_without_salt_uses_extra_key", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(),
			M(), A(A(S("dynamo-cache-salt:tenant-b"))))),
			want{stored(index.Block{Ext: 11, Local: local(seq(10, 2), "", "tenant-b", 2, false, nil)[0]}), nil}},
		{"sglang_null_salt_unsalted", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), M("cache_salt", Nil()))),
			want{stored(st2(11)[0]), nil}},
		{"vllm_lora_name_slot7", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), S("adapter-a"))),
			want{stored(index.Block{Ext: 11, Local: local(seq(10, 2), "adapter-a", "", 2, false, nil)[0]}), nil}},
		{"untagged_string_is_not_salt_or_mm", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), Nil(),
			A(A(S("tenant-a"), Bin([]byte("prompt-embed")), U(5), F(1.5), Bool(true))))),
			want{stored(st2(11)[0]), nil}},
		{"hex_salt_is_not_mm", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), Nil(),
			A(A(S("dynamo-cache-salt:"+hex64(42)))))),
			want{stored(index.Block{Ext: 11, Local: local(seq(10, 2), "", hex64(42), 2, false, nil)[0]}), nil}},
		{"mm_pair_opaque_id_xxh3", batch(0, storedPos(Hs(11, 12), Nil(), Toks(toks4...), 2, Nil(), Nil(),
			A(Nil(), A(A(S("opaque-renderer-image-0"), I(-3)))))),
			want{stored(blocks([]uint64{11, 12}, local(toks4, "", "", 2, false,
				[][]uint64{nil, {xxh3.HashString("opaque-renderer-image-0")}}))...), nil}},
		{"mm_hex_and_pair_sorted", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), Nil(),
			A(A(S(hex64(99)), A(S(hex64(7)), U(1)))))),
			want{stored(blocks([]uint64{11}, local(seq(10, 2), "", "", 2, false, [][]uint64{{99, 7}}))...), nil}},
		{"hex_lora_name_is_not_mm", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), S(hex64(5)),
			A(A(S(hex64(5)), A(S("img"), U(1)))))),
			want{stored(blocks([]uint64{11}, local(seq(10, 2), hex64(5), "", 2, false,
				[][]uint64{{xxh3.HashString("img")}}))...), nil}},
		{"legacy_tail_block_mm_infos", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), Nil(), Nil(),
			A(A(A(A(U(99), A(A(U(0), U(1))))))), U(0), S("full_attention"))),
			want{stored(blocks([]uint64{11}, local(seq(10, 2), "", "", 2, false, [][]uint64{{99}}))...), nil}},
		{"map_block_mm_infos", batch(0, M("type", S("BlockStored"), "block_hashes", Hs(11), "token_ids", Toks(10, 11),
			"block_size", U(2), "block_mm_infos", A(M("mm_objects", A(M("mm_hash", U(99), "offsets", A()))))),
		),
			want{stored(blocks([]uint64{11}, local(seq(10, 2), "", "", 2, false, [][]uint64{{99}}))...), nil}},
		{"eagle_bigrams", batch(0, storedPos(Hs(11, 12), Nil(),
			A(A(U(10), U(11)), A(U(11), U(12)), A(U(12), U(13)), A(U(13), U(14))), 2)),
			want{stored(blocks([]uint64{11, 12}, local(seq(10, 5), "", "", 2, true, nil))...), nil}},
		{"medium_case_insensitive", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, S("cpu_pinned"))),
			want{[]index.Event{{Worker: dev, Tier: index.TierHostPinned, Kind: index.EventStored, Blocks: st2(11)}}, nil}},
		{"medium_empty_is_device", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, S(""))),
			want{stored(st2(11)...), nil}},
		{"medium_disk", batch(0, A(S("BlockRemoved"), Hs(11), S("CPU_TIER2"))),
			want{[]index.Event{{Worker: dev, Tier: index.TierDisk, Kind: index.EventRemoved, Hashes: []uint64{11}}}, nil}},
		{"unknown_medium_dropped", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, S("TAPE"))),
			want{none, func(s Stats) int { return s.UnknownMedium }}},
		{"locality_remote_dropped", batch(0, M("type", S("BlockRemoved"), "block_hashes", Hs(11), "locality", S("REMOTE"))),
			want{none, func(s Stats) int { return s.NonLocal }}},
		{"locality_unknown_dropped", batch(0, A(S("BlockRemoved"), Hs(11), Nil(), U(0), Nil(), Nil(), S("MARS"), Nil())),
			want{none, func(s Stats) int { return s.NonLocal }}},
		{"locality_local_fixed_tail_kept", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), Nil(), Nil(),
			U(0), S("full_attention"), Nil(), S("LOCAL"), S("offload"))),
			want{stored(st2(11)...), nil}},
		{"kind_sliding_window_dropped", batch(0, storedPos(Hs(11), Nil(), Toks(10, 11), 2, Nil(), Nil(), Nil(),
			U(1), S("sliding_window"))),
			want{none, func(s Stats) int { return s.NonMainGroup }}},
		{"kind_unknown_dropped", batch(0, M("type", S("BlockStored"), "block_hashes", Hs(11), "token_ids", Toks(10, 11),
			"block_size", U(2), "kv_cache_spec_kind", S("quantum"))),
			want{none, func(s Stats) int { return s.NonMainGroup }}},
		{"kind_main_nonzero_group_kept", batch(0, A(S("BlockRemoved"), Hs(11), Nil(), U(3), S("mla_attention"))),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved, Hashes: []uint64{11}}}, nil}},
		{"kind_without_group_slot_kept", batch(0, A(S("BlockRemoved"), Hs(11), Nil(), S("full_attention"))),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved, Hashes: []uint64{11}}}, nil}},
		{"unknown_nonzero_group_dropped", batch(0, A(S("BlockRemoved"), Hs(11), Nil(), U(1))),
			want{none, func(s Stats) int { return s.UnknownGroup }}},
		{"block_size_mismatch", batch(0, storedPos(Hs(11, 12), Nil(), Toks(seq(0, 8)...), 4)),
			want{none, func(s Stats) int { return s.BlockSizeMismatch }}},
		{"short_tokens_truncate", batch(0, storedPos(Hs(11, 12, 13), Nil(), Toks(10, 11, 12, 13, 14), 2)),
			want{stored(st2(11, 12)...), func(s Stats) int { return s.TruncatedBlocks }}},
		{"no_complete_block", batch(0, storedPos(Hs(11), Nil(), Toks(10), 2)),
			want{none, func(s Stats) int { return s.EmptyStored }}},
		{"duplicate_hash_is_noop", batch(0, storedPos(Hs(11, 11), Nil(), Toks(toks4...), 2)),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved}}, func(s Stats) int { return s.Duplicate }}},
		{"parent_equal_to_block_is_noop", batch(0, storedPos(Hs(11, 12), U(12), Toks(toks4...), 2)),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved}}, func(s Stats) int { return s.Duplicate }}},
		{"ignored_tag", batch(0, A(S("Ignored"), U(1)), M("type", S("Ignored"))),
			want{none, func(s Stats) int { return s.Ignored }}},
		{"unknown_tags_skipped", batch(0, A(S("BlockPromoted"), Hs(1)), M("type", S("Nope")), A(S("BlockRemoved"), Hs(11))),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved, Hashes: []uint64{11}}},
				func(s Stats) int { return s.UnknownTag }}},
		{"malformed_event_skipped", batch(0, storedPos(Hs(11), Nil(), S("not tokens"), 2), U(5), A(),
			M("type", S("BlockStored")), A(S("BlockRemoved"), Hs(11))),
			want{[]index.Event{{Worker: dev, Kind: index.EventRemoved, Hashes: []uint64{11}}},
				func(s Stats) int { return s.Malformed }}},
		{"cleared_with_source_kind", batch(0, A(S("AllBlocksCleared"), S("offload"))),
			want{[]index.Event{{Worker: dev, Kind: index.EventCleared}}, nil}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDec(t, Config{WorkerID: wid, BlockSize: 2})
			got, st, err := d.Decode(tc.batch, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want.events) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want.events)
			}
			if tc.want.stat != nil && tc.want.stat(st) == 0 {
				t.Fatalf("expected stat not counted: %+v", st)
			}
			checkInvariants(t, d, 0, got)
		})
	}
}

func TestDecodeBatchEnvelopes(t *testing.T) {
	rm := A(S("BlockRemoved"), Hs(11))
	tests := []struct {
		name  string
		batch []byte
		rank  uint32
		err   bool
	}{
		{"array3_rank", A(F(ts), A(rm), U(5)), 5, false},
		{"array3_nil_rank_keeps_registered", A(F(ts), A(rm), Nil()), 2, false},
		{"array2_old", A(F(ts), A(rm)), 2, false},
		{"int_ts", A(U(1700000000), A(rm)), 2, false},
		{"map_data_parallel_rank", M("ts", F(ts), "events", A(rm), "data_parallel_rank", U(4)), 4, false},
		{"map_dp_rank_alias", M("events", A(rm), "dp_rank", U(6), "ts", F(ts)), 6, false},
		{"map_attn_dp_rank_alias", M("ts", F(ts), "attn_dp_rank", U(1), "events", A(rm)), 1, false},
		{"map_rank_omitted", M("ts", F(ts), "events", A(rm), "extra", S("x")), 2, false},
		{"array4", A(F(ts), A(rm), Nil(), Nil()), 0, true},
		{"array1", A(F(ts)), 0, true},
		{"ts_string", A(S("now"), A(rm), Nil()), 0, true},
		{"events_not_array", A(F(ts), M(), Nil()), 0, true},
		{"map_without_events", M("ts", F(ts)), 0, true},
		{"negative_rank", A(F(ts), A(rm), I(-1)), 0, true},
		{"trailing_bytes", append(A(F(ts), A(rm), Nil()), 0x01), 0, true},
		{"truncated", A(F(ts), A(rm), Nil())[:10], 0, true},
		{"scalar", U(1), 0, true},
		{"empty", nil, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDec(t, Config{WorkerID: wid, DPRank: 2, BlockSize: 2})
			dst := []index.Event{{ID: 99}}
			got, st, err := d.Decode(tc.batch, dst)
			if tc.err {
				if !errors.Is(err, ErrBatch) || len(got) != 1 || d.NextID() != 0 || st.Events != 0 {
					t.Fatalf("want ErrBatch with dst and state unchanged: %v %v %d", err, got, d.NextID())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[1].Worker.DPRank != tc.rank {
				t.Fatalf("got %+v, want rank %d", got, tc.rank)
			}
		})
	}
}

// Group kinds are learned per (dp_rank, group_idx) from events that carry both,
// and then decide events that carry only the group (Dynamo zmq_wire filter.rs).
func TestGroupKindLearnedPerRank(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 2})
	storedG := func(h uint64, tail ...[]byte) []byte {
		return storedPos(Hs(h), Nil(), Toks(10, 11), 2, append([][]byte{Nil(), Nil(), Nil()}, tail...)...)
	}
	removedG := func(h uint64, g uint64) []byte { return A(S("BlockRemoved"), Hs(h), Nil(), U(g)) }
	steps := []struct {
		batch []byte
		kinds []index.EventKind
	}{
		{batch(0, removedG(1, 1)), nil}, // unknown group 1
		{batch(0, storedG(2, U(1), S("full_attention"))), []index.EventKind{index.EventStored}},
		{batch(0, storedG(3, U(2), S("mamba"))), nil}, // learns 2 = non-main
		{batch(0, removedG(2, 1), removedG(3, 2)), []index.EventKind{index.EventRemoved}},
		{batch(0, storedG(4, U(1))), []index.EventKind{index.EventStored}}, // learned main
		{batch(1, removedG(2, 1)), nil},                                    // other rank: not learned there
		{batch(0, storedG(5, U(1), S("sliding_window"))), nil},             // relearn 1 = non-main
		{batch(0, removedG(4, 1)), nil},
	}
	for i, s := range steps {
		got, _, err := d.Decode(s.batch, nil)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []index.EventKind
		for _, e := range got {
			kinds = append(kinds, e.Kind)
		}
		if !reflect.DeepEqual(kinds, s.kinds) {
			t.Fatalf("step %d: kinds %v, want %v", i, kinds, s.kinds)
		}
	}
}

// A child block inherits the cache namespace its parent was stored under; a
// hash seen under two namespaces becomes ambiguous and its children are dropped.
func TestCacheNamespaceInheritedFromParent(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 2})
	mapStored := func(h, parent uint64, salt string, tok ...uint32) []byte {
		kv := []any{"type", S("BlockStored"), "block_hashes", Hs(h), "token_ids", Toks(tok...), "block_size", U(2)}
		if parent != 0 {
			kv = append(kv, "parent_block_hash", U(parent))
		}
		if salt != "" {
			kv = append(kv, "cache_salt", S(salt))
		}
		return M(kv...)
	}
	lns := func(ns string, tok ...uint32) uint64 { return local(tok, "", ns, 2, false, nil)[0] }

	got, _, _ := d.Decode(batch(0, mapStored(1, 0, "tenant-a", 1, 2), mapStored(2, 1, "", 3, 4)), nil)
	if len(got) != 2 || got[1].Blocks[0].Local != lns("tenant-a", 3, 4) {
		t.Fatalf("child did not inherit: %+v", got)
	}
	// Removing the parent on the device forgets it: a later child is unsalted.
	got, _, _ = d.Decode(batch(0, A(S("BlockRemoved"), Hs(1)), mapStored(3, 1, "", 5, 6)), nil)
	if len(got) != 2 || got[1].Blocks[0].Local != lns("", 5, 6) {
		t.Fatalf("removed parent still propagates: %+v", got)
	}
	// Block 2 is stored again under another namespace: ambiguous.
	got, st, _ := d.Decode(batch(0, mapStored(2, 0, "tenant-b", 3, 4), mapStored(4, 2, "", 7, 8)), nil)
	if len(got) != 1 || st.NamespaceConflict != 1 || st.NamespaceAmbiguous != 1 {
		t.Fatalf("ambiguous parent not dropped: %+v %+v", got, st)
	}
	// A child naming its own namespace that disagrees with the parent's is dropped.
	got, st, _ = d.Decode(batch(0, mapStored(5, 0, "tenant-a", 1, 2), mapStored(6, 5, "tenant-c", 3, 4)), nil)
	if len(got) != 1 || st.NamespaceAmbiguous != 1 {
		t.Fatalf("conflicting child not dropped: %+v %+v", got, st)
	}
	// Cleared forgets everything.
	got, _, _ = d.Decode(batch(0, A(S("AllBlocksCleared")), mapStored(7, 5, "", 3, 4)), nil)
	if len(got) != 2 || got[1].Blocks[0].Local != lns("", 3, 4) {
		t.Fatalf("cleared did not forget: %+v", got)
	}
}

func TestEventIDsMonotonicAcrossBatches(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 2})
	var all []index.Event
	for i := range 5 {
		got, _, err := d.Decode(batch(i%2, storedPos(Hs(uint64(i+100), uint64(i+100)), Nil(), Toks(toks4...), 2),
			A(S("BlockRemoved"), Hs(1)), A(S("Unknown")), A(S("AllBlocksCleared"))), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			all = append(all, index.Event{ID: e.ID, Kind: e.Kind})
		}
	}
	for i, e := range all {
		if e.ID != uint64(i) {
			t.Fatalf("event %d has id %d", i, e.ID)
		}
	}
	if len(all) != 15 {
		t.Fatalf("%d events", len(all))
	}
}

func TestNewDecoderValidates(t *testing.T) {
	for _, cfg := range []Config{{BlockSize: 0}, {BlockSize: -1}, {BlockSize: 4, MaxNamespaceEntries: -1}} {
		if _, err := NewDecoder(cfg); err == nil {
			t.Errorf("NewDecoder(%+v) accepted", cfg)
		}
	}
}

func TestConfigEagleHashesFlatTokensInWindows(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 2, Eagle: true})
	got, _, err := d.Decode(batch(0, storedPos(Hs(11, 12), Nil(), Toks(seq(10, 5)...), 2)), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := local(seq(10, 5), "", "", 2, true, nil)
	if len(got) != 1 || got[0].Blocks[0].Local != want[0] || got[0].Blocks[1].Local != want[1] {
		t.Fatalf("got %+v", got)
	}
}

func TestLongStoredDuplicateDetectedAndStrHashes(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 1})
	hs := make([]uint64, 40)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	unique := storedPos(Hs(hs...), Nil(), Toks(seq(0, 40)...), 1)
	hs[39] = 5
	dup := storedPos(Hs(hs...), Nil(), Toks(seq(0, 40)...), 1)
	parentDup := storedPos(Hs(seq64(100, 40)...), U(120), Toks(seq(0, 40)...), 1)
	strHash := storedPos(A(S("\x01\x02"), S("abcdefghij")), Nil(), Toks(1, 2), 1)
	got, st, err := d.Decode(batch(0, unique, dup, parentDup, strHash), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || len(got[0].Blocks) != 40 || st.Duplicate != 2 || got[1].Kind != index.EventRemoved {
		t.Fatalf("got %d events, stats %+v", len(got), st)
	}
	// str hashes: last 8 bytes big-endian, left-padded when shorter.
	if got[3].Blocks[0].Ext != 0x0102 || got[3].Blocks[1].Ext != binaryBE("cdefghij") {
		t.Fatalf("str hash %x", got[3].Blocks[1].Ext)
	}
}

func seq64(from uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

func binaryBE(s string) uint64 {
	var v uint64
	for i := 0; i < len(s); i++ {
		v = v<<8 | uint64(s[i])
	}
	return v
}

// Tokens in signed encodings (non-negative) are accepted; negative ones make the
// event malformed.
func TestTokenEncodings(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 2})
	got, st, _ := d.Decode(batch(0,
		storedPos(Hs(1), Nil(), A(I(10), U(70000)), 2),
		storedPos(Hs(2), Nil(), A(I(-1), U(1)), 2),
		storedPos(Hs(3), Nil(), A(U(1<<33), U(1)), 2)), nil)
	if len(got) != 1 || got[0].Blocks[0].Local != local([]uint32{10, 70000}, "", "", 2, false, nil)[0] || st.Malformed != 2 {
		t.Fatalf("got %+v stats %+v", got, st)
	}
}

func TestNamespaceMemoryIsBounded(t *testing.T) {
	d := newDec(t, Config{WorkerID: wid, BlockSize: 1, MaxNamespaceEntries: 2})
	ev := func(h uint64, salt string) []byte {
		return M("type", S("BlockStored"), "block_hashes", Hs(h), "token_ids", Toks(1), "block_size", U(1),
			"cache_salt", S(salt))
	}
	_, st, _ := d.Decode(batch(0, ev(1, "a"), ev(2, "a"), ev(3, "a"), ev(4, "b"), ev(5, "c")), nil)
	if len(d.ns) > 2 || len(d.nsNames) > 3 || st.NamespaceOverflow != 3 {
		t.Fatalf("ns %d names %d stats %+v", len(d.ns), len(d.nsNames), st)
	}
	var sum Stats
	sum.Add(st)
	sum.Add(st)
	if sum.NamespaceOverflow != 6 || sum.Stored != 10 || sum.Dropped() != 0 {
		t.Fatalf("Add: %+v", sum)
	}
}
