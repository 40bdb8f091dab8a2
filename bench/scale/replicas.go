package scale

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvselect/kvselect/replicas/mesh"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/kvhash"
)

// ReplicaPoint is the replica mesh at one replica count and fleet request
// rate.
type ReplicaPoint struct {
	Replicas int `json:"replicas"`
	// Offered is the fleet's request rate, spread evenly over the replicas;
	// Achieved what they served in Duration.
	Offered  float64       `json:"offered_per_second"`
	Achieved float64       `json:"achieved_per_second"`
	Duration time.Duration `json:"duration_ns"`
	Served   int64         `json:"served"`
	// CPU is the process's CPU time over the run, every replica's.
	CPU time.Duration `json:"cpu_ns"`
	// Mesh messages over the run, all replicas together: booking events
	// published (an admission, a prefill completion and a free per
	// request), received from peers, applied, and dropped on a full
	// outbound queue.
	Published uint64 `json:"published"`
	Received  uint64 `json:"received"`
	Applied   uint64 `json:"applied"`
	Dropped   uint64 `json:"dropped"`
	// PublishedPerReplica and ReceivedPerReplica are per second.
	PublishedPerReplica float64 `json:"published_per_replica_per_second"`
	ReceivedPerReplica  float64 `json:"received_per_replica_per_second"`
	// CoresPerReplica is the process's CPU over the run divided by the
	// replicas: selection, the request driver and the mesh.
	CoresPerReplica float64 `json:"cores_per_replica"`
	// MeshCoresPerReplica is CoresPerReplica less what the same requests
	// cost one replica alone (its CPU per request at the same rate), and
	// MeshMicrosPerReceived that remainder per message received: the cost of
	// a message sent, received, decoded and applied.
	MeshCoresPerReplica   float64 `json:"mesh_cores_per_replica"`
	MeshMicrosPerReceived float64 `json:"mesh_us_per_received"`
	// KeptUp is false when the replicas served less than 95 % of the offered
	// rate, dropped messages, or received less than 98 % of what their peers
	// published: this machine's cores, not the design, set that point.
	KeptUp bool `json:"kept_up"`
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// replicaSet is R services over the same fleet, each with its mesh, every
// one subscribed to every other.
type replicaSet struct {
	fleets []*fleet
	meshes []*mesh.Mesh
}

func (rs *replicaSet) close() {
	for _, m := range rs.meshes {
		_ = m.Close()
	}
}

// newReplicaSet builds n replicas of a fleet of c.ReplicaRanks ranks: the
// first one's index is populated through the event path, the others
// recover it from its dump as a starting replica does from a peer.
func newReplicaSet(ctx context.Context, c Config, n int) (*replicaSet, error) {
	rs := &replicaSet{}
	p := newPrompts(max(1, c.ReplicaRanks/c.RanksPerGroup), c.SystemTokens, c.QuestionTokens, c.QuestionsPerGroup, c.BlockSize)
	for i := range n {
		f, err := newFleet(ctx, c.ReplicaRanks, c.RanksPerWorker, c.BlockSize, c.CacheBlocks, c.Seed*31+uint64(i))
		if err != nil {
			rs.close()
			return nil, err
		}
		if i == 0 {
			var sp SelectionPoint
			if _, err := populate(f, c, p, &sp, false); err != nil {
				rs.close()
				return nil, err
			}
		} else {
			for _, r := range f.svc.Replica().Restore(rs.fleets[0].svc.Inspect().Dump()) {
				if r.Err != nil || r.Failed > 0 {
					rs.close()
					return nil, fmt.Errorf("replica %d: restore the index: %+v", i, r)
				}
			}
		}
		m, err := mesh.Start(ctx, f.svc.Replica(), mesh.Options{Bind: "tcp://127.0.0.1:0", Logger: quiet, ReconnectMax: 200 * time.Millisecond})
		if err != nil {
			rs.close()
			return nil, fmt.Errorf("replica %d: start the mesh: %w", i, err)
		}
		rs.fleets, rs.meshes = append(rs.fleets, f), append(rs.meshes, m)
	}
	for i, m := range rs.meshes {
		for j, peer := range rs.meshes {
			if i == j {
				continue
			}
			if _, err := m.Register("tcp://" + peer.Addr().String()); err != nil {
				rs.close()
				return nil, fmt.Errorf("replica %d: register peer %d: %w", i, j, err)
			}
		}
	}
	if err := rs.linked(ctx); err != nil {
		rs.close()
		return nil, err
	}
	return rs, nil
}

// linked waits until every subscription carries messages: ZMQ subscriptions
// reach a publisher asynchronously and what it sent before is lost, so each
// replica books and frees a probe until every peer has received something
// from every other.
func (rs *replicaSet) linked(ctx context.Context) error {
	if len(rs.meshes) < 2 {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for probe := 0; time.Now().Before(deadline); probe++ {
		for i, f := range rs.fleets {
			id := fmt.Sprintf("probe-%d-%d", i, probe)
			isl := uint64(4 * 16)
			if _, err := f.svc.SelectAndReserve(ctx, &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: model},
				SelectionID: &id, PromptRequest: selection.PromptRequest{BlockHashes: []int64{1, 2, 3, 4}, SequenceHashes: []int64{1, 2, 3, 4}, ISLTokens: &isl}}); err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			if err := f.svc.Free(ctx, id); err != nil {
				return fmt.Errorf("probe: %w", err)
			}
		}
		time.Sleep(100 * time.Millisecond)
		all := true
		for _, m := range rs.meshes {
			st := m.Stats()
			if len(st.Peers) != len(rs.meshes)-1 {
				all = false
			}
			for _, ps := range st.Peers {
				all = all && ps.Received > 0
			}
		}
		if all {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return fmt.Errorf("replica mesh of %d replicas not carrying events within 30s", len(rs.meshes))
}

// meshTotals sums the meshes' counters.
func (rs *replicaSet) meshTotals() (published, received, applied, dropped uint64) {
	for _, m := range rs.meshes {
		st := m.Stats()
		published += st.BookingsPublished
		received += st.Received
		applied += st.Bookings["applied"]
		dropped += st.BookingsDropped
	}
	return
}

// hashedPrompts are the replica runs' prompts as precomputed block and
// sequence hashes (the ext_proc header form), so that the run spends its
// cores on selection and the mesh rather than on hashing tokens.
func hashedPrompts(c Config, n int) []selection.PromptRequest {
	p := newPrompts(max(1, c.ReplicaRanks/c.RanksPerGroup), c.SystemTokens, c.QuestionTokens, c.QuestionsPerGroup, c.BlockSize)
	rng := rand.New(rand.NewPCG(c.Seed, 0x4e91))
	out := make([]selection.PromptRequest, n)
	for i := range out {
		g := rng.IntN(p.groups)
		if rng.Float64() < c.HotShare {
			g = p.hot()
		}
		t := p.prompt(g, rng.IntN(p.questionsPerGrp))
		locals := kvhash.LocalBlockHashes(t, "", "", kvhash.BlockOptions{BlockSize: c.BlockSize})
		seqs := kvhash.SequenceHashes(locals)
		bh, sh := make([]int64, len(locals)), make([]int64, len(seqs))
		for j := range locals {
			bh[j], sh[j] = int64(locals[j]), int64(seqs[j])
		}
		isl := uint64(len(t))
		out[i] = selection.PromptRequest{BlockHashes: bh, SequenceHashes: sh, ISLTokens: &isl}
	}
	return out
}

// point offers rate requests per second to rs for d, each replica
// taking its share open loop (a request's selection, prefill completion and
// free back to back), and measures the mesh.
func (rs *replicaSet) point(ctx context.Context, prompts []selection.PromptRequest, rate float64, d time.Duration, run int) (ReplicaPoint, error) {
	n := len(rs.fleets)
	pt := ReplicaPoint{Replicas: n, Offered: rate}
	p0, r0, a0, d0 := rs.meshTotals()
	var served atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cpu0, start := cpuTime(), time.Now()
	for i, f := range rs.fleets {
		wg.Go(func() {
			if err := drive(runCtx, f.svc, prompts, rate/float64(n), fmt.Sprintf("r%d-%d-", i, run), &served); err != nil {
				errOnce.Do(func() { firstErr = err })
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// Let the meshes deliver what is queued before reading their counters.
	for range 50 {
		p, r, _, _ := rs.meshTotals()
		if r-r0 >= (p-p0)*uint64(n-1) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cpu := cpuTime() - cpu0
	if firstErr != nil {
		return pt, firstErr
	}
	p1, r1, a1, d1 := rs.meshTotals()
	pt.Duration, pt.Served, pt.CPU = elapsed, served.Load(), cpu
	pt.Achieved = float64(served.Load()) / elapsed.Seconds()
	pt.Published, pt.Received, pt.Applied, pt.Dropped = p1-p0, r1-r0, a1-a0, d1-d0
	pt.PublishedPerReplica = float64(pt.Published) / elapsed.Seconds() / float64(n)
	pt.ReceivedPerReplica = float64(pt.Received) / elapsed.Seconds() / float64(n)
	pt.CoresPerReplica = cpu.Seconds() / elapsed.Seconds() / float64(n)
	pt.KeptUp = pt.Achieved >= 0.95*rate && pt.Dropped == 0 && float64(pt.Received) >= 0.98*float64(pt.Published)*float64(n-1)
	return pt, nil
}

// drive runs one replica's share of the traffic: every millisecond it
// starts the requests due by then.
func drive(ctx context.Context, svc *selection.Service, prompts []selection.PromptRequest, rate float64, prefix string, served *atomic.Int64) error {
	start := time.Now()
	done := 0
	for ctx.Err() == nil {
		due := int(time.Since(start).Seconds() * rate)
		for ; done < due && ctx.Err() == nil; done++ {
			id := prefix + fmt.Sprint(done)
			req := &selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: model}, SelectionID: &id,
				PromptRequest: prompts[done%len(prompts)]}
			if _, err := svc.SelectAndReserve(ctx, req); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("select_and_reserve: %w", err)
			}
			if err := svc.PrefillComplete(ctx, id); err != nil {
				return fmt.Errorf("prefill_complete: %w", err)
			}
			if err := svc.Free(ctx, id); err != nil {
				return fmt.Errorf("free: %w", err)
			}
			served.Add(1)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
