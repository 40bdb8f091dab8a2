package kvevents

import (
	"encoding/binary"
	"errors"
	"slices"

	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"

	"github.com/kvselect/kvselect/internal/sizepool"
)

type tagKind uint8

const (
	tagStoredKind tagKind = iota
	tagRemovedKind
	tagClearedKind
	tagIgnoredKind
)

var (
	errUnknownTag = errors.New("unknown event tag")
	errMissing    = errors.New("missing required field")
)

// parseArena holds the hashes and tokens of every event of a batch, one
// buffer each for the whole batch rather than one per event, so that a
// decoder's scratch grows once to its largest batch.
type parseArena struct {
	hashes []uint64
	tokens []uint32
	// bigTokens keeps token arenas over keepScratch between the batches
	// that need them (a 1M-token prompt's BlockStored: 4 MB), so that each
	// such batch does not fault a new one in; Trim hands them over.
	bigTokens sizepool.Pool[uint32]
	bigHashes sizepool.Pool[uint64] // the same for the engine hashes
}

// rawEvent is one event as read from the wire. Byte slices alias the payload;
// hashes and tokens alias the batch's parseArena.
type rawEvent struct {
	arena       *parseArena
	hashes      []uint64
	parent      uint64
	hasParent   bool
	tokens      []uint32
	bigram      bool
	blockSize   uint64
	medium      []byte
	lora        []byte
	salt        []byte // cache_salt: map field or SGLang slot-7 metadata
	extraKeys   []byte // raw msgpack extra_keys array, nil when absent
	mmInfos     []byte // raw msgpack block_mm_infos array, nil when absent
	group       uint32
	hasGroup    bool
	kind        []byte
	hasKind     bool
	locality    []byte
	hasLocality bool

	// What parse made of the event: its tag, or why it is skipped.
	tag tagKind
	err error
}

func (r *rawEvent) reset() {
	*r = rawEvent{arena: r.arena}
}

// parse reads one event in either shape into r and returns the bytes after
// it. On success it has consumed exactly the event's msgpack value; on error
// the caller finds the event's end itself.
func parse(ev []byte, r *rawEvent) (tagKind, []byte, error) {
	r.reset()
	if b, ok := parseRemovedOne(ev, r); ok {
		return tagRemovedKind, b, nil
	}
	return parseShape(ev, r)
}

// parseShape reads an event, r cleared, by its shape: field by field.
func parseShape(ev []byte, r *rawEvent) (tagKind, []byte, error) {
	switch msgp.NextType(ev) {
	case msgp.ArrayType:
		return parsePositional(ev, r)
	case msgp.MapType:
		return parseMap(ev, r)
	}
	return 0, ev, errType("event")
}

// The encodings of a one-block BlockRemoved up to its hash: vLLM's map
// (msgspec writes its fields in declaration order and omits a None medium)
// and the positional array of older vLLM and SGLang, with a medium or without.
const (
	removedMap     = "\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91"
	removedMapBare = "\x82\xa4type\xacBlockRemoved\xacblock_hashes\x91"
	removedPos     = "\x93\xacBlockRemoved\x91"
	removedPosBare = "\x92\xacBlockRemoved\x91"
	mediumKey      = "\xa6medium"
)

// parseRemovedOne reads a one-block BlockRemoved written exactly as engines
// write it: three events in four, each a fraction of a batch's bytes, and
// through parseMap's key-by-key reading cost more than the table probe that
// applies it. It reports false, having changed nothing, for anything else,
// which parse reads the general way; what it accepts it reads into r as
// parse would (TestParseRemovedOneMatchesParse, FuzzParseRemovedOne).
func parseRemovedOne(ev []byte, r *rawEvent) ([]byte, bool) {
	var b []byte
	isMap, hasMedium := false, false
	switch {
	case len(ev) > len(removedMap) && string(ev[:len(removedMap)]) == removedMap:
		b, isMap, hasMedium = ev[len(removedMap):], true, true
	case len(ev) > len(removedPos) && string(ev[:len(removedPos)]) == removedPos:
		b, hasMedium = ev[len(removedPos):], true
	case len(ev) > len(removedMapBare) && string(ev[:len(removedMapBare)]) == removedMapBare:
		b = ev[len(removedMapBare):]
	case len(ev) > len(removedPosBare) && string(ev[:len(removedPosBare)]) == removedPosBare:
		b = ev[len(removedPosBare):]
	default:
		return nil, false
	}
	h, b, err := readHash(b)
	if err != nil {
		return nil, false
	}
	var medium []byte
	if hasMedium {
		if isMap {
			if len(b) < len(mediumKey) || string(b[:len(mediumKey)]) != mediumKey {
				return nil, false
			}
			b = b[len(mediumKey):]
		}
		if medium, _, b, err = readOptStr(b); err != nil {
			return nil, false
		}
	}
	a := r.arena
	start := len(a.hashes)
	a.hashes = append(a.hashes, h)
	r.hashes = a.hashes[start:len(a.hashes):len(a.hashes)]
	r.medium = medium
	return b, true
}

// skipN skips n msgpack values.
func skipN(b []byte, n int) ([]byte, error) {
	var err error
	for ; n > 0; n-- {
		if b, err = msgp.Skip(b); err != nil {
			return b, err
		}
	}
	return b, nil
}

func classify(tag []byte) (tagKind, error) {
	switch string(tag) {
	case string(tagStored):
		return tagStoredKind, nil
	case string(tagRemoved):
		return tagRemovedKind, nil
	case string(tagCleared):
		return tagClearedKind, nil
	case string(tagIgnored):
		return tagIgnoredKind, nil
	}
	return 0, errUnknownTag
}

// parsePositional reads the array_like shape: slot 0 is the tag, the fields
// follow in the declaration order of vLLM's kv_events.py classes (Dynamo
// deserialize.rs visit_seq).
//
// BlockStored: 1 block_hashes, 2 parent, 3 token_ids, 4 block_size (required,
// v0.9 stopped at 5 lora_id), 6 medium, 7 lora_name or SGLang's metadata map,
// 8 extra_keys, then the append-only tail. BlockRemoved: 1 block_hashes,
// 2 medium, then the tail. A missing trailing slot is the same as nil; slots past
// the known ones are ignored.
func parsePositional(ev []byte, r *rawEvent) (tagKind, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(ev)
	if err != nil {
		return 0, b, err
	}
	if n == 0 {
		return 0, b, errMissing
	}
	tag, b, err := msgp.ReadStringZC(b)
	if err != nil {
		return 0, b, err
	}
	kind, err := classify(tag)
	if err != nil {
		return 0, b, err
	}
	if kind == tagClearedKind || kind == tagIgnoredKind {
		// AllBlocksCleared may carry source_kind; nothing of it matters here.
		b, err = skipN(b, int(n)-1)
		return kind, b, err
	}
	left := int(n) - 1
	if left < 1 {
		return 0, b, errMissing
	}
	if b, err = r.readHashes(b); err != nil {
		return 0, b, err
	}
	left--
	if kind == tagRemovedKind {
		if left > 0 {
			if r.medium, _, b, err = readOptStr(b); err != nil {
				return 0, b, err
			}
			left--
		}
		b, err = r.readTail(b, left, false)
		return kind, b, err
	}
	if left < 3 {
		return 0, b, errMissing
	}
	if b, err = r.readParent(b); err != nil {
		return 0, b, err
	}
	if b, err = r.readTokens(b); err != nil {
		return 0, b, err
	}
	if r.blockSize, b, err = msgp.ReadUint64Bytes(b); err != nil {
		return 0, b, err
	}
	left -= 3
	if left > 0 { // 5: lora_id, deprecated and discarded by Dynamo
		if b, err = msgp.Skip(b); err != nil {
			return 0, b, err
		}
		left--
	}
	if left > 0 { // 6: medium
		if r.medium, _, b, err = readOptStr(b); err != nil {
			return 0, b, err
		}
		left--
	}
	if left > 0 { // 7: lora_name (vLLM) or {cache_salt, session_id} (SGLang >= 0.5.18)
		switch msgp.NextType(b) {
		case msgp.MapType:
			b, err = r.readSGLangMetadata(b)
		default:
			r.lora, _, b, err = readOptStr(b)
		}
		if err != nil {
			return 0, b, err
		}
		left--
	}
	if left > 0 { // 8: extra_keys
		if b, err = r.readRawArray(b, &r.extraKeys); err != nil {
			return 0, b, err
		}
		left--
	}
	b, err = r.readTail(b, left, true)
	return kind, b, err
}

// tailField is one value of the positional tail, by msgpack type, as Dynamo's
// untagged KvCacheEventTrailingField sees it.
type tailField struct {
	class uint8 // tailNil, tailUint, tailText, tailArray, tailOther
	u     uint32
	s     []byte
	raw   []byte
}

const (
	tailNil = iota
	tailUint
	tailText
	tailArray
	tailOther
)

// readTail reads up to five tail slots after the fixed ones. The current layout
// is append-only: group_idx (uint), kv_cache_spec_kind (str),
// sliding_window (uint), locality (str), source_kind (str). Dynamo applies it only
// when at least four slots are present and every slot has the type of its field
// (or nil); shorter or differently typed tails are the v1.2-era ones that
// appended metadata opportunistically, parsed by type: the first uint is
// group_idx, a later one the sliding window, a string the kind, and (Stored) an
// array the legacy block_mm_infos. Locality is only read from the fixed layout.
// Slots past the fifth are skipped; it returns the bytes after the event.
func (r *rawEvent) readTail(b []byte, left int, stored bool) ([]byte, error) {
	var f [5]tailField
	cnt := 0
	var err error
	for ; cnt < len(f) && cnt < left; cnt++ {
		t := &f[cnt]
		switch msgp.NextType(b) {
		case msgp.NilType:
			t.class = tailNil
			b, err = msgp.ReadNilBytes(b)
		case msgp.IntType, msgp.UintType:
			t.class = tailOther
			if v, o, e := msgp.ReadUint32Bytes(b); e == nil {
				t.class, t.u, b = tailUint, v, o
			} else {
				b, err = msgp.Skip(b)
			}
		case msgp.StrType:
			t.class = tailText
			t.s, b, err = msgp.ReadStringZC(b)
		case msgp.ArrayType:
			t.class = tailArray
			start := b
			b, err = msgp.Skip(b)
			t.raw = start[:len(start)-len(b)]
		default:
			t.class = tailOther
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, err
		}
	}
	if b, err = skipN(b, left-cnt); err != nil {
		return b, err
	}
	fixed := cnt >= 4
	want := [5]uint8{tailUint, tailText, tailUint, tailText, tailText}
	for i := range cnt {
		if f[i].class != tailNil && f[i].class != want[i] {
			fixed = false
		}
	}
	if fixed {
		if f[0].class == tailUint {
			r.group, r.hasGroup = f[0].u, true
		}
		if f[1].class == tailText {
			r.kind, r.hasKind = f[1].s, true
		}
		if f[3].class == tailText {
			r.locality, r.hasLocality = f[3].s, true
		}
		return b, nil
	}
	for i := range cnt {
		switch f[i].class {
		case tailUint:
			if !r.hasGroup {
				r.group, r.hasGroup = f[i].u, true
			} // else: kv_cache_spec_sliding_window, unused
		case tailText:
			r.kind, r.hasKind = f[i].s, true
		case tailArray:
			if stored {
				r.mmInfos = f[i].raw
			}
		}
	}
	return b, nil
}

// parseMap reads the tagged-map shape (vLLM PR #42892): fields by name, unknown
// keys ignored, omitted fields absent (msgspec omit_defaults drops trailing
// None fields; Dynamo deserialize.rs visit_map).
func parseMap(ev []byte, r *rawEvent) (tagKind, []byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(ev)
	if err != nil {
		return 0, b, err
	}
	var tag []byte
	var haveHashes, haveTokens, haveBS bool
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return 0, b, err
		}
		switch string(key) {
		case "type":
			tag, b, err = msgp.ReadStringZC(b)
		case "block_hashes":
			b, err = r.readHashes(b)
			haveHashes = err == nil
		case "parent_block_hash":
			b, err = r.readParent(b)
		case "token_ids":
			b, err = r.readTokens(b)
			haveTokens = err == nil
		case "block_size":
			r.blockSize, b, err = msgp.ReadUint64Bytes(b)
			haveBS = err == nil
		case "medium":
			r.medium, _, b, err = readOptStr(b)
		case "lora_name":
			r.lora, _, b, err = readOptStr(b)
		case "cache_salt":
			r.salt, _, b, err = readOptStr(b)
		case "extra_keys":
			b, err = r.readRawArray(b, &r.extraKeys)
		case "block_mm_infos":
			b, err = r.readRawArray(b, &r.mmInfos)
		case "group_idx":
			r.group, r.hasGroup, b, err = readOptUint32(b)
		case "kv_cache_spec_kind":
			r.kind, r.hasKind, b, err = readOptStr(b)
		case "locality":
			r.locality, r.hasLocality, b, err = readOptStr(b)
		default: // lora_id, kv_cache_spec_sliding_window, source_kind, future keys
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return 0, b, err
		}
	}
	if tag == nil {
		return 0, b, errMissing
	}
	kind, err := classify(tag)
	if err != nil {
		return 0, b, err
	}
	switch kind {
	case tagStoredKind:
		if !haveHashes || !haveTokens || !haveBS {
			return 0, b, errMissing
		}
	case tagRemovedKind:
		if !haveHashes {
			return 0, b, errMissing
		}
	}
	return kind, b, nil
}

func (r *rawEvent) readHashes(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, err
	}
	if int(n) > len(b) { // every element takes at least one byte
		return b, msgp.ErrShortBytes
	}
	a := r.arena
	start := len(a.hashes)
	a.hashes = keptGrow(&a.bigHashes, a.hashes, start+int(n))
	for range n {
		var h uint64
		if h, b, err = readHash(b); err != nil {
			return b, err
		}
		a.hashes = append(a.hashes, h)
	}
	// Capacity clipped: nothing appended later can reach into another
	// event's hashes.
	r.hashes = a.hashes[start:len(a.hashes):len(a.hashes)]
	return b, nil
}

func (r *rawEvent) readParent(b []byte) ([]byte, error) {
	if msgp.IsNil(b) {
		r.parent, r.hasParent = 0, false
		return msgp.ReadNilBytes(b)
	}
	var err error
	r.parent, b, err = readHash(b)
	r.hasParent = err == nil
	return b, err
}

// readTokens reads token_ids: a flat list of u32, or Eagle bigrams
// [(t0,t1), (t1,t2), …], flattened to the firsts plus the last second and
// flagged (Dynamo normalize_token_ids).
func (r *rawEvent) readTokens(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, err
	}
	if int(n) > len(b) {
		return b, msgp.ErrShortBytes
	}
	a := r.arena
	start := len(a.tokens)
	r.bigram = n > 0 && msgp.NextType(b) == msgp.ArrayType
	if !r.bigram {
		// n ≤ len(b): growing by n at once is bounded by the payload.
		a.tokens = keptGrow(&a.bigTokens, a.tokens, start+int(n))
		a.tokens = slices.Grow(a.tokens, int(n))[:start+int(n)]
		toks := a.tokens[start:]
		if b, err = readTokenRun(b, toks); err != nil {
			a.tokens = a.tokens[:start]
			return b, err
		}
		r.tokens = toks[:len(toks):len(toks)]
		return b, nil
	}
	var second uint32
	for range n {
		var sz uint32
		if sz, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return b, err
		}
		if sz != 2 {
			return b, errType("token bigram")
		}
		var first uint32
		if first, b, err = msgp.ReadUint32Bytes(b); err != nil {
			return b, err
		}
		if second, b, err = msgp.ReadUint32Bytes(b); err != nil {
			return b, err
		}
		a.tokens = append(a.tokens, first)
	}
	a.tokens = append(a.tokens, second)
	r.tokens = a.tokens[start:len(a.tokens):len(a.tokens)]
	return b, nil
}

// readTokenRun reads len(toks) token ids into toks. It is readToken
// unrolled into one loop: a prompt's tokens are most of a batch's bytes.
func readTokenRun(b []byte, toks []uint32) ([]byte, error) {
	for i := range toks {
		if len(b) >= 5 {
			switch c := b[0]; {
			case c < 0x80:
				toks[i], b = uint32(c), b[1:]
				continue
			case c == 0xcc:
				toks[i], b = uint32(b[1]), b[2:]
				continue
			case c == 0xcd:
				toks[i], b = uint32(binary.BigEndian.Uint16(b[1:])), b[3:]
				continue
			case c == 0xce:
				toks[i], b = binary.BigEndian.Uint32(b[1:]), b[5:]
				continue
			}
		}
		var err error
		if toks[i], b, err = readToken(b); err != nil {
			return b, err
		}
	}
	return b, nil
}

// readToken reads one token id. The encodings msgspec uses for u32 values
// (positive fixint, uint8/16/32) are decoded inline: token arrays are most of a
// batch's bytes, and this halves the decode time of a Stored event. Anything else
// goes through msgp, which also takes non-negative signed encodings.
func readToken(b []byte) (uint32, []byte, error) {
	if len(b) > 0 {
		switch c := b[0]; {
		case c < 0x80:
			return uint32(c), b[1:], nil
		case c == 0xcc && len(b) >= 2:
			return uint32(b[1]), b[2:], nil
		case c == 0xcd && len(b) >= 3:
			return uint32(binary.BigEndian.Uint16(b[1:])), b[3:], nil
		case c == 0xce && len(b) >= 5:
			return binary.BigEndian.Uint32(b[1:]), b[5:], nil
		}
	}
	return msgp.ReadUint32Bytes(b)
}

// readSGLangMetadata reads SGLang's slot-7 map {cache_salt, session_id}
// (sglang#30827, Dynamo PR #14530); session_id is ignored.
func (r *rawEvent) readSGLangMetadata(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return b, err
		}
		if string(key) == string(keyCacheSalt) && msgp.NextType(b) == msgp.StrType {
			r.salt, b, err = msgp.ReadStringZC(b)
		} else {
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// readRawArray keeps the raw bytes of an array value (nil when the value is
// nil) for a later pass, and skips it.
func (r *rawEvent) readRawArray(b []byte, into *[]byte) ([]byte, error) {
	if msgp.IsNil(b) {
		*into = nil
		return msgp.ReadNilBytes(b)
	}
	if msgp.NextType(b) != msgp.ArrayType {
		return b, errType("array field")
	}
	o, err := msgp.Skip(b)
	if err != nil {
		return b, err
	}
	*into = b[:len(b)-len(o)]
	return o, nil
}

// saltFromExtraKeys finds the cache salt Dynamo's vLLM handler tags into the
// first block's extra_keys as "dynamo-cache-salt:<ns>" (extra_keys.rs
// extra_keys_to_cache_namespace): only bare strings count, and the first one
// equal to the LoRA name is skipped so a salt equal to the LoRA name still works.
func (d *Decoder) saltFromExtraKeys(ek []byte, lora []byte) []byte {
	n, b, err := msgp.ReadArrayHeaderBytes(ek)
	if err != nil || n == 0 || msgp.IsNil(b) {
		return nil
	}
	m, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil
	}
	loraPending := len(lora) > 0
	for range m {
		if msgp.NextType(b) != msgp.StrType {
			if b, err = msgp.Skip(b); err != nil {
				return nil
			}
			continue
		}
		var s []byte
		if s, b, err = msgp.ReadStringZC(b); err != nil {
			return nil
		}
		if loraPending && string(s) == string(lora) {
			loraPending = false
			continue
		}
		if len(s) > len(saltPrefix) && string(s[:len(saltPrefix)]) == string(saltPrefix) {
			return s[len(saltPrefix):]
		}
	}
	return nil
}

// mmFromExtraKeys fills d.mm with the multimodal hashes of the first n blocks
// from vLLM's extra_keys (one entry per block: nil or a tuple of items), as
// Dynamo's extra_keys_to_block_mm_infos_with_lora: a bare string is an MM hash
// only when it is a 64-hex digest (first 16 hex chars as u64) and not the LoRA
// name; an (id, offset) pair (vLLM 0.19+) is always an MM object, hashed as
// xxh3_64(id) unless id is a 64-hex digest. Other items (bytes, numbers, the
// cache salt) are not MM. Unlike Dynamo, which fails the whole batch on an item
// of an unexpected shape, such items are ignored.
func (d *Decoder) mmFromExtraKeys(ek []byte, lora []byte, nBlocks int) {
	d.mmFlat, d.mmEnds = d.mmFlat[:0], d.mmEnds[:0]
	n, b, err := msgp.ReadArrayHeaderBytes(ek)
	if err != nil {
		d.buildMM()
		return
	}
	for i := 0; i < int(n) && i < nBlocks; i++ {
		if msgp.NextType(b) != msgp.ArrayType {
			b, err = msgp.Skip(b)
		} else {
			b, err = d.mmItems(b, lora)
		}
		d.mmEnds = append(d.mmEnds, len(d.mmFlat))
		if err != nil {
			break
		}
	}
	d.buildMM()
}

func (d *Decoder) mmItems(b []byte, lora []byte) ([]byte, error) {
	m, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, err
	}
	for range m {
		switch msgp.NextType(b) {
		case msgp.StrType:
			var s []byte
			if s, b, err = msgp.ReadStringZC(b); err != nil {
				return b, err
			}
			if len(lora) > 0 && string(s) == string(lora) {
				continue
			}
			if h, ok := hexU64(s); ok {
				d.mmFlat = append(d.mmFlat, h)
			}
		case msgp.ArrayType:
			start := b
			if b, err = msgp.Skip(b); err != nil {
				return b, err
			}
			if h, ok := mmPair(start); ok {
				d.mmFlat = append(d.mmFlat, h)
			}
		default:
			if b, err = msgp.Skip(b); err != nil {
				return b, err
			}
		}
	}
	return b, nil
}

// mmPair reads an (identifier, offset) pair and returns its MM hash
// (extra_keys.rs hash_mm_identifier); empty identifiers are not MM objects.
func mmPair(b []byte) (uint64, bool) {
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || sz != 2 || msgp.NextType(b) != msgp.StrType {
		return 0, false
	}
	id, b, err := msgp.ReadStringZC(b)
	if err != nil || len(id) == 0 {
		return 0, false
	}
	if t := msgp.NextType(b); t != msgp.IntType && t != msgp.UintType {
		return 0, false
	}
	if h, ok := hexU64(id); ok {
		return h, true
	}
	return xxh3.Hash(id), true
}

// mmFromInfos fills d.mm from Dynamo's own block_mm_infos (map-form key, or the
// legacy v1.2 positional tail): per block nil or a BlockExtraInfo
// {mm_objects: [{mm_hash, offsets}]}, as a map or as a tuple. When present it
// takes precedence over extra_keys, as in Dynamo.
func (d *Decoder) mmFromInfos(infos []byte, nBlocks int) {
	d.mmFlat, d.mmEnds = d.mmFlat[:0], d.mmEnds[:0]
	n, b, err := msgp.ReadArrayHeaderBytes(infos)
	if err != nil {
		d.buildMM()
		return
	}
	for i := 0; i < int(n) && i < nBlocks; i++ {
		start := b
		if b, err = msgp.Skip(b); err != nil {
			break
		}
		d.blockInfo(start[:len(start)-len(b)])
		d.mmEnds = append(d.mmEnds, len(d.mmFlat))
	}
	d.buildMM()
}

func (d *Decoder) blockInfo(b []byte) {
	objs, ok := structField(b, keyMMObjects)
	if !ok {
		return
	}
	n, b, err := msgp.ReadArrayHeaderBytes(objs)
	if err != nil {
		return
	}
	for range n {
		start := b
		if b, err = msgp.Skip(b); err != nil {
			return
		}
		hv, ok := structField(start[:len(start)-len(b)], keyMMHash)
		if !ok {
			continue
		}
		if h, _, err := msgp.ReadUint64Bytes(hv); err == nil {
			d.mmFlat = append(d.mmFlat, h)
		}
	}
}

// structField returns the first field of a serde struct encoded either as a map
// (looked up by key) or as a tuple (position 0). Both BlockExtraInfo and
// BlockMmObjectInfo have the wanted field first.
func structField(b []byte, key []byte) ([]byte, bool) {
	switch msgp.NextType(b) {
	case msgp.MapType:
		n, b, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			return nil, false
		}
		for range n {
			var k []byte
			if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return nil, false
			}
			if string(k) == string(key) {
				return b, true
			}
			if b, err = msgp.Skip(b); err != nil {
				return nil, false
			}
		}
	case msgp.ArrayType:
		n, b, err := msgp.ReadArrayHeaderBytes(b)
		if err == nil && n > 0 {
			return b, true
		}
	}
	return nil, false
}

// buildMM slices d.mmFlat into per-block lists in d.mm.
func (d *Decoder) buildMM() {
	d.mm = d.mm[:0]
	start := 0
	for _, end := range d.mmEnds {
		d.mm = append(d.mm, d.mmFlat[start:end:end])
		start = end
	}
}
