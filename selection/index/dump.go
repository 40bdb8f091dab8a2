package index

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Dump is the /dump recovery snapshot, in the format of Dynamo's standalone
// indexer that a peer's startup recovery reads: per partition
// "<model_name>:<routing_group>", its block size and the events that rebuild it.
type Dump map[string]PartitionDump

// PartitionDump is one partition of a Dump.
type PartitionDump struct {
	BlockSize uint32        `json:"block_size"`
	Events    []RouterEvent `json:"events"`
}

// PartitionKey is the Dump key of a partition.
func PartitionKey(model, routingGroup string) string { return model + ":" + routingGroup }

// SplitPartitionKey splits a Dump key at its first ':', as Dynamo's recovery does
// (a model name may not contain ':', a routing group may).
func SplitPartitionKey(key string) (model, routingGroup string, err error) {
	m, g, ok := strings.Cut(key, ":")
	if !ok {
		return "", "", fmt.Errorf("dump key %q is not <model_name>:<routing_group>", key)
	}
	return m, g, nil
}

// RouterEvent is Dynamo's serialized RouterEvent.
type RouterEvent struct {
	WorkerID        uint64       `json:"worker_id"`
	StorageTier     string       `json:"storage_tier"`
	ResidencyDomain string       `json:"residency_domain,omitempty"`
	Event           KvCacheEvent `json:"event"`
}

// KvCacheEvent is the event body of a RouterEvent.
type KvCacheEvent struct {
	EventID uint64    `json:"event_id"`
	Data    EventData `json:"data"`
	DPRank  uint32    `json:"dp_rank"`
}

// EventData is one of {"stored": …}, {"removed": …} or "cleared".
type EventData struct {
	Stored  *StoredData
	Removed *RemovedData
	Cleared bool
}

// StoredData is the body of a stored event.
type StoredData struct {
	ParentHash    *Hash         `json:"parent_hash"`
	StartPosition *uint32       `json:"start_position"`
	Blocks        []StoredBlock `json:"blocks"`
}

// StoredBlock is one block of a stored event. MMExtraInfo is carried verbatim:
// the multimodal identity is already inside TokensHash.
type StoredBlock struct {
	BlockHash   Hash            `json:"block_hash"`
	TokensHash  Hash            `json:"tokens_hash"`
	MMExtraInfo json.RawMessage `json:"mm_extra_info"`
}

// RemovedData is the body of a removed event.
type RemovedData struct {
	BlockHashes []Hash `json:"block_hashes"`
}

// Hash is a 64-bit hash in JSON. It encodes as an unsigned decimal and decodes
// from unsigned or signed (two's-complement, as SGLang and TRT-LLM produce)
// decimals.
type Hash uint64

// MarshalJSON encodes the hash as an unsigned decimal.
func (h Hash) MarshalJSON() ([]byte, error) {
	return strconv.AppendUint(nil, uint64(h), 10), nil
}

// UnmarshalJSON accepts an integer in [-2^63, 2^64).
func (h *Hash) UnmarshalJSON(b []byte) error {
	s := string(b)
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		*h = Hash(u)
		return nil
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("hash %s is not a 64-bit integer", s)
	}
	*h = Hash(uint64(i))
	return nil
}

var clearedJSON = []byte(`"cleared"`)

// MarshalJSON encodes the externally tagged enum.
func (d EventData) MarshalJSON() ([]byte, error) {
	switch {
	case d.Stored != nil:
		return json.Marshal(struct {
			Stored *StoredData `json:"stored"`
		}{d.Stored})
	case d.Removed != nil:
		return json.Marshal(struct {
			Removed *RemovedData `json:"removed"`
		}{d.Removed})
	case d.Cleared:
		return clearedJSON, nil
	}
	return nil, fmt.Errorf("event data has no variant")
}

// UnmarshalJSON decodes the externally tagged enum.
func (d *EventData) UnmarshalJSON(b []byte) error {
	*d = EventData{}
	if bytes.Equal(bytes.TrimSpace(b), clearedJSON) {
		d.Cleared = true
		return nil
	}
	var v struct {
		Stored  *StoredData  `json:"stored"`
		Removed *RemovedData `json:"removed"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("event data: %w", err)
	}
	switch {
	case v.Stored != nil && v.Removed == nil:
		d.Stored = v.Stored
	case v.Removed != nil && v.Stored == nil:
		d.Removed = v.Removed
	default:
		return fmt.Errorf("event data must be \"cleared\" or an object with exactly one of stored, removed")
	}
	return nil
}

// ToEvent converts a serialized event into an index Event.
func (re *RouterEvent) ToEvent() (Event, error) {
	tier := TierDevice
	if re.StorageTier != "" {
		t, err := ParseTier(re.StorageTier)
		if err != nil {
			return Event{}, err
		}
		tier = t
	}
	ev := Event{Worker: WorkerKey{re.WorkerID, re.Event.DPRank}, Tier: tier, ID: re.Event.EventID}
	d := re.Event.Data
	switch {
	case d.Stored != nil:
		ev.Kind = EventStored
		if d.Stored.ParentHash != nil {
			ev.Parent, ev.HasParent = uint64(*d.Stored.ParentHash), true
		}
		ev.Blocks = make([]Block, len(d.Stored.Blocks))
		for i, b := range d.Stored.Blocks {
			ev.Blocks[i] = Block{Ext: uint64(b.BlockHash), Local: uint64(b.TokensHash)}
		}
	case d.Removed != nil:
		ev.Kind = EventRemoved
		ev.Hashes = make([]uint64, len(d.Removed.BlockHashes))
		for i, h := range d.Removed.BlockHashes {
			ev.Hashes[i] = uint64(h)
		}
	case d.Cleared:
		ev.Kind = EventCleared
	default:
		return Event{}, fmt.Errorf("%w: event %d has no data", ErrInvalidEvent, re.Event.EventID)
	}
	return ev, nil
}

// DecodeDump parses a /dump body. It rejects unknown tiers and malformed keys, so
// a parsed Dump can be replayed without further checks.
func DecodeDump(b []byte) (Dump, error) {
	var d Dump
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decode dump: %w", err)
	}
	for key, p := range d {
		if _, _, err := SplitPartitionKey(key); err != nil {
			return nil, fmt.Errorf("decode dump: %w", err)
		}
		if p.BlockSize == 0 {
			return nil, fmt.Errorf("decode dump: partition %q: block_size must be positive", key)
		}
		for i := range p.Events {
			if _, err := p.Events[i].ToEvent(); err != nil {
				return nil, fmt.Errorf("decode dump: partition %q event %d: %w", key, i, err)
			}
		}
	}
	return d, nil
}

// Snapshot returns the primary tree as events that rebuild it (the partition's
// part of /dump). The side index is local-only and never dumped.
func (ix *Index) Snapshot() PartitionDump {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	// An empty partition dumps "events": [], never null: Dynamo's /dump always
	// has an array there.
	return PartitionDump{BlockSize: ix.cfg.BlockSize, Events: ix.primary.appendSnapshot([]RouterEvent{})}
}

// Replay applies a partition dump and returns how many events failed, with the
// first failure. In approximate mode replayed blocks get a fresh TTL from now, so
// recovered predictions expire like local ones.
func (ix *Index) Replay(now time.Time, events []RouterEvent) (failed int, first error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i := range events {
		ev, err := events[i].ToEvent()
		if err == nil {
			err = ix.primary.Apply(&ev)
		}
		if err != nil {
			failed++
			if first == nil {
				first = fmt.Errorf("event %d: %w", i, err)
			}
			continue
		}
		if ix.cfg.Approximate && ev.Kind == EventStored {
			exts := make([]uint64, len(ev.Blocks))
			for j, b := range ev.Blocks {
				exts[j] = b.Ext
			}
			ix.ttl.touch(now, ev.Worker, exts)
		}
	}
	return failed, first
}

type heldEntry struct {
	tier Tier
	ext  uint64
}

// appendSnapshot emits, per worker rank, Stored events in depth-first order from
// the root, so every parent is stored before its children and chains become one
// event each. Blocks a worker holds below a block it no longer holds are not
// reachable for that worker by any lookup and are left out.
func (t *Tree) appendSnapshot(dst []RouterEvent) []RouterEvent {
	keys := make([]WorkerKey, 0, len(t.slots))
	for w := range t.slots {
		keys = append(keys, w)
	}
	slices.SortFunc(keys, CompareWorkerKeys)
	var id uint64
	for _, w := range keys {
		ws := &t.workers[t.slots[w]]
		held := make(map[uint32][]heldEntry)
		for tier := range ws.lookup {
			ws.lookup[tier].all(func(ext uint64, n uint32) {
				held[n] = append(held[n], heldEntry{Tier(tier), ext})
			})
		}
		kids := make(map[uint32][]uint32)
		for n, entries := range held {
			slices.SortFunc(entries, func(a, b heldEntry) int {
				if a.tier != b.tier {
					return int(a.tier) - int(b.tier)
				}
				return cmp.Compare(a.ext, b.ext)
			})
			p := t.meta(n).parent
			kids[p] = append(kids[p], n)
		}
		for _, c := range kids {
			slices.Sort(c)
		}
		var openEvent [numTiers]int // index in dst of the event ending at openLast
		var openLast [numTiers]uint32
		for tier := range openLast {
			openLast[tier] = ^uint32(0)
		}
		stack := slices.Clone(kids[root])
		slices.Reverse(stack)
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			p := t.meta(n).parent
			local := Hash(t.node(n).hash)
			for _, e := range held[n] {
				blk := StoredBlock{BlockHash: Hash(e.ext), TokensHash: local}
				if openLast[e.tier] == p && p != root {
					sd := dst[openEvent[e.tier]].Event.Data.Stored
					sd.Blocks = append(sd.Blocks, blk)
				} else {
					sd := &StoredData{Blocks: []StoredBlock{blk}}
					if p != root {
						pe := held[p][0]
						for _, cand := range held[p] {
							if cand.tier == e.tier {
								pe = cand
								break
							}
						}
						ph := Hash(pe.ext)
						sd.ParentHash = &ph
					}
					dst = append(dst, RouterEvent{
						WorkerID:    w.WorkerID,
						StorageTier: e.tier.String(),
						Event:       KvCacheEvent{EventID: id, DPRank: w.DPRank, Data: EventData{Stored: sd}},
					})
					id++
					openEvent[e.tier] = len(dst) - 1
				}
				openLast[e.tier] = n
			}
			c := kids[n]
			for i := len(c) - 1; i >= 0; i-- {
				stack = append(stack, c[i])
			}
		}
	}
	return dst
}
