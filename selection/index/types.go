package index

import (
	"errors"
	"fmt"
	"strings"
)

// WorkerKey identifies one data-parallel rank of a worker. All indexing and
// scoring is per (worker, rank): a DP=8 engine is eight candidates.
type WorkerKey struct {
	WorkerID uint64
	DPRank   uint32
}

func (w WorkerKey) String() string { return fmt.Sprintf("%d/%d", w.WorkerID, w.DPRank) }

// CompareOverlaps orders overlap rows by their ranks (CompareWorkerKeys), the
// order Match returns them in.
func CompareOverlaps(a, b Overlap) int { return CompareWorkerKeys(a.Worker, b.Worker) }

// CompareWorkerKeys orders worker ranks by (worker_id, dp_rank), the order of
// every listing the service returns.
func CompareWorkerKeys(a, b WorkerKey) int {
	// Written out rather than cmp.Or(cmp.Compare, cmp.Compare), which
	// evaluates both comparisons: selection sorts a row per matched rank by
	// this key, thousands per request on a large fleet.
	switch {
	case a.WorkerID < b.WorkerID:
		return -1
	case a.WorkerID > b.WorkerID:
		return 1
	case a.DPRank < b.DPRank:
		return -1
	case a.DPRank > b.DPRank:
		return 1
	}
	return 0
}

// Tier is the storage tier a KV event reports blocks in.
type Tier uint8

// The tiers, in the order the continuation walk visits them.
const (
	TierDevice Tier = iota
	TierHostPinned
	TierDisk
	TierExternal
	numTiers
)

var tierNames = [numTiers]string{"device", "host_pinned", "disk", "external"}

// String returns the /dump spelling of the tier.
func (t Tier) String() string {
	if t < numTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier parses the /dump spelling of a tier.
func ParseTier(s string) (Tier, error) {
	for i, n := range tierNames {
		if s == n {
			return Tier(i), nil
		}
	}
	return 0, fmt.Errorf("unknown storage tier %q (want device, host_pinned, disk or external)", s)
}

// TierFromMedium maps an engine's `medium` string to a tier, case-insensitively,
// as Dynamo's StorageTier::from_kv_medium does. Absent or empty means device. ok is
// false for any other string: such events must be dropped (fail closed).
func TierFromMedium(medium string) (t Tier, ok bool) {
	switch strings.ToUpper(medium) {
	case "", "GPU", "DEVICE":
		return TierDevice, true
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return TierHostPinned, true
	case "CPU_TIER2", "DISK", "NVME", "STORAGE":
		return TierDisk, true
	case "EXTERNAL", "NETWORK", "REMOTE", "SHARED":
		return TierExternal, true
	}
	return 0, false
}

// Block is one stored KV block: the engine's own hash, used only as a per-worker
// handle for parent links and removals, and the router's content hash
// (LocalBlockHash), which keys the tree.
type Block struct {
	Ext   uint64 // ExternalSequenceBlockHash, engine-defined
	Local uint64 // LocalBlockHash (tokens_hash)
}

// EventKind says what an Event does.
type EventKind uint8

// Event kinds.
const (
	EventStored EventKind = iota
	EventRemoved
	EventCleared
)

func (k EventKind) String() string {
	switch k {
	case EventStored:
		return "stored"
	case EventRemoved:
		return "removed"
	case EventCleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is a normalized KV cache event for one worker rank and tier (Dynamo's
// RouterEvent). Decoders of the engines' wire formats produce these.
type Event struct {
	Worker WorkerKey
	Tier   Tier
	ID     uint64
	Kind   EventKind
	// Stored: the parent block's engine hash (HasParent false means the root) and
	// the blocks in chain order.
	Parent    uint64
	HasParent bool
	Blocks    []Block
	// Removed: the engine hashes of the removed blocks.
	Hashes []uint64
}

// Errors Apply reports. They are sentinels so callers count them with errors.Is.
var (
	// ErrParentNotFound: a Stored event names a parent the worker does not hold.
	// The whole event is dropped; usually a missed event or replay gap.
	ErrParentNotFound = errors.New("parent block not found")
	// ErrInvalidBlockSequence: a Stored event repeats an engine hash (a block equal
	// to its parent or to an earlier block of the same chain). Dropped whole.
	ErrInvalidBlockSequence = errors.New("invalid block sequence")
	// ErrBlockNotFound: a Removed event names blocks the worker does not hold. The
	// other blocks of the event are still removed.
	ErrBlockNotFound = errors.New("block not found")
	// ErrInvalidEvent: an event whose kind or tier is out of range.
	ErrInvalidEvent = errors.New("invalid event")
)

// Overlap is one candidate's cached prefix for a query, in blocks. Device counts
// the leading blocks held on the device; Host, Disk and External count how many
// further consecutive blocks the worker holds in that tier, each continuing where
// the previous tier stopped (Dynamo's lower-tier continuation walk).
type Overlap struct {
	Worker   WorkerKey
	Device   uint32
	Host     uint32
	Disk     uint32
	External uint32
}

// Total is the number of leading query blocks the worker holds in any tier.
func (o Overlap) Total() uint32 { return o.Device + o.Host + o.Disk + o.External }

// Breakdown is the standalone indexer's cumulative tier breakdown, in blocks:
// GPU = device, CPU = GPU + host, Disk = CPU + disk + external, and the longest
// match over all tiers. Token counts are blocks × block size.
type Breakdown struct {
	GPU, CPU, Disk, LongestMatched uint32
}

// Cumulative returns the rank's cumulative tier breakdown.
func (o Overlap) Cumulative() Breakdown {
	gpu := o.Device
	cpu := gpu + o.Host
	disk := cpu + o.Disk + o.External
	return Breakdown{GPU: gpu, CPU: cpu, Disk: disk, LongestMatched: disk}
}

// PerInstance folds rank rows into one breakdown per worker, taking the max over
// its data-parallel ranks tier by tier, as the standalone indexer reports a DP
// engine.
func PerInstance(overlaps []Overlap) map[uint64]Breakdown {
	out := make(map[uint64]Breakdown, len(overlaps))
	for _, o := range overlaps {
		c := o.Cumulative()
		b := out[o.Worker.WorkerID]
		out[o.Worker.WorkerID] = Breakdown{
			GPU: max(b.GPU, c.GPU), CPU: max(b.CPU, c.CPU), Disk: max(b.Disk, c.Disk),
			LongestMatched: max(b.LongestMatched, c.LongestMatched),
		}
	}
	return out
}
