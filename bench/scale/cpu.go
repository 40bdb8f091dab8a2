package scale

import (
	"time"

	benchfleet "github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/mockworker/kvpublish"
)

// cpuTime is the process's CPU time so far, user and system: what one core
// (or every core, for the replica runs) spent, garbage collection included.
func cpuTime() time.Duration { return benchfleet.SelfCPU() }

// storedBlocks is the blocks a BlockStored event adds (0 for any other).
func storedBlocks(ev kvpublish.Event) int {
	if st, ok := ev.(*kvpublish.BlockStored); ok {
		return len(st.BlockHashes)
	}
	return 0
}
