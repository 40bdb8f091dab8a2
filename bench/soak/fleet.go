package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

const (
	model     = "soak-model"
	blockSize = 16
)

// replica is one kvselect process and its mesh port.
type replica struct {
	name     string
	kv       *fleet.KVSelect
	meshPort int
	conn     *grpc.ClientConn
	picker   *envoysim.Client
}

// worker is one mock worker and how the catalog learns about it.
type worker struct {
	id      int
	proc    *fleet.Process
	viaFile bool // in the workers file; otherwise registered over REST on every replica
	proxied bool // its KV events pass the lossy proxy, its replay the TCP proxy
	// sim is an llm-d-inference-sim: its PUB socket dials a collector, so a
	// fan-out proxy binds one and republishes to every replica; its cache
	// cannot be read, so the index truth check leaves it out.
	sim bool

	mu                   sync.Mutex
	port, kvPort, rpPort int  // HTTP, KV events PUB, replay ROUTER
	inCatalog            bool // the catalog (file or REST) lists it
	proxy                *kvProxy
	replay               *tcpProxy
}

func (w *worker) url() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return "http://127.0.0.1:" + strconv.Itoa(w.port)
}

// record is the worker's catalog record, in the POST /workers shape.
func (w *worker) record() map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	kv, rp := fmt.Sprintf("tcp://127.0.0.1:%d", w.kvPort), fmt.Sprintf("tcp://127.0.0.1:%d", w.rpPort)
	switch {
	case w.proxied:
		kv, rp = w.proxy.pubEndpoint(), w.replay.endpoint()
	case w.sim:
		kv = w.proxy.pubEndpoint()
	}
	return map[string]any{
		"worker_id": w.id, "model_name": model, "endpoint": fmt.Sprintf("http://127.0.0.1:%d", w.port),
		"kv_events_endpoint": kv, "replay_endpoint": rp, "block_size": blockSize, "total_kv_blocks": poolBlocks,
	}
}

// poolBlocks is each worker's KV pool: small enough that the traffic evicts
// all the time, so that removals flow as steadily as stores.
const poolBlocks = 192

// cluster is every process of a run and the catalog they share.
type cluster struct {
	cfg      *Config
	out      string
	hc       *http.Client
	replicas []*replica
	workers  []*worker
	file     string // the workers file every replica watches
	fileMu   sync.Mutex
	// topo is held for writing while a replica is killed, started or paused
	// and for reading by catalog changes, which must reach every replica.
	topo   sync.RWMutex
	onExit func(name string, err error)
}

// startFleet starts the workers (and the proxies of the proxied ones), writes
// the workers file, starts the replicas and registers the REST workers on
// each, and waits until every replica sees every worker's KV events.
func startCluster(ctx context.Context, cfg *Config, out string, onExit func(string, error)) (_ *cluster, err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	fl := &cluster{cfg: cfg, out: out, onExit: onExit, file: filepath.Join(out, "workers.json"),
		hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxIdleConns: 512}}}
	defer func() {
		if err != nil {
			fl.stop()
		}
	}()
	for i := range cfg.Workers {
		w := &worker{id: i + 1, viaFile: i < cfg.Workers/2, proxied: i >= cfg.Workers-cfg.ProxiedWorkers, inCatalog: true}
		if err := fl.startWorker(w, true); err != nil {
			return nil, err
		}
		if w.proxied {
			if w.proxy, err = newKVProxy(fmt.Sprintf("tcp://127.0.0.1:%d", w.kvPort), false, cfg.Seed+uint64(w.id)); err != nil {
				return nil, err
			}
			if w.replay, err = newTCPProxy(fmt.Sprintf("127.0.0.1:%d", w.rpPort)); err != nil {
				return nil, err
			}
		}
		fl.workers = append(fl.workers, w)
	}
	for i := range cfg.Sims {
		w := &worker{id: cfg.Workers + i + 1, sim: true, inCatalog: true}
		ps, err := fleet.FreePorts(3)
		if err != nil {
			return nil, err
		}
		w.port, w.kvPort, w.rpPort = ps[0], ps[1], ps[2]
		// The collector the simulator dials is bound before it starts, so
		// that nothing it publishes is lost to a missing subscriber.
		if w.proxy, err = newKVProxy(fmt.Sprintf("tcp://127.0.0.1:%d", w.kvPort), true, cfg.Seed+uint64(w.id)); err != nil {
			return nil, err
		}
		if err := fl.startWorker(w, false); err != nil {
			return nil, err
		}
		fl.workers = append(fl.workers, w)
	}
	if err := fl.writeWorkersFile(); err != nil {
		return nil, err
	}
	ports, err := fleet.FreePorts(3 * cfg.Replicas)
	if err != nil {
		return nil, err
	}
	for i := range cfg.Replicas {
		r := &replica{name: string(rune('a' + i)), meshPort: ports[3*i+2]}
		args := []string{"--workers-file", fl.file, "--session-affinity-ttl-secs", "120",
			"--replica-sync-port", strconv.Itoa(r.meshPort)}
		var peers, rest []string
		for j := range cfg.Replicas {
			if j != i {
				peers = append(peers, fmt.Sprintf("tcp://127.0.0.1:%d", ports[3*j+2]))
				rest = append(rest, fmt.Sprintf("http://127.0.0.1:%d", ports[3*j]))
			}
		}
		if len(peers) > 0 {
			args = append(args, "--replica-sync-peers", strings.Join(peers, ","))
		}
		if i == len(fl.replicas)-1 && i > 0 {
			// The last replica is the one the run kills: it recovers its
			// index from the others.
			args = append(args, "--indexer-peers", strings.Join(rest, ","))
		}
		if r.kv, err = fleet.NewKVSelect(fleet.KVSelectConfig{Binary: cfg.KVSelect, Name: "kvselect-" + r.name, Dir: out,
			Port: ports[3*i], ExtProcPort: ports[3*i+1], Args: args, HTTP: fl.hc, OnExit: onExit,
			Env: []string{"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS=" + strconv.Itoa(int(cfg.Expiry/time.Second))}}); err != nil {
			return nil, err
		}
		fl.replicas = append(fl.replicas, r)
		// Every replica starts before any is waited for: the last recovers
		// its index from the others.
		if err := r.kv.Proc.Start(); err != nil {
			return nil, err
		}
		if r.conn, err = r.kv.Dial(false); err != nil {
			return nil, err
		}
		r.picker = envoysim.New(r.conn)
	}
	for _, r := range fl.replicas {
		if err := fl.replicaUp(ctx, r); err != nil {
			return nil, err
		}
	}
	return fl, nil
}

// replicaUp waits for a (re)started replica to serve, registers the REST
// workers on it and waits until it sees every catalogued worker's events.
func (fl *cluster) replicaUp(ctx context.Context, r *replica) error {
	if err := r.kv.WaitServing(ctx); err != nil {
		return err
	}
	for _, w := range fl.workers {
		w.mu.Lock()
		rest, in := !w.viaFile, w.inCatalog
		w.mu.Unlock()
		if !rest {
			continue
		}
		if err := fl.restCatalog(ctx, r, w, in); err != nil {
			return err
		}
	}
	return fl.waitCatalog(ctx, []*replica{r}, 60*time.Second)
}

// workerEngine is how every mock worker runs: a small pool, so that the
// traffic evicts all the time and removals flow as steadily as stores.
var workerEngine = fleet.Engine{BlockSize: blockSize, PoolBlocks: poolBlocks,
	PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 4 * time.Millisecond}

// startWorker starts (or restarts) w's process; fresh picks new ports.
func (fl *cluster) startWorker(w *worker, fresh bool) error {
	w.mu.Lock()
	if fresh || w.port == 0 {
		ps, err := fleet.FreePorts(3)
		if err != nil {
			w.mu.Unlock()
			return err
		}
		w.port, w.kvPort, w.rpPort = ps[0], ps[1], ps[2]
	}
	args := append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(w.port), "--worker-id", strconv.Itoa(w.id),
		"--model", model, "--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", w.kvPort),
		"--kv-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", w.rpPort),
		// The ring holds a whole run's batches, so that a listener attached
		// anew (the documented restart remedy) replays the pool exactly.
		"--kv-replay-buffer", "100000",
		"--max-num-seqs", "64", "--shutdown-timeout", "3s", "--log-level", "warn"}, workerEngine.MockWorkerArgs()...)
	bin, name := fl.cfg.MockWorker, fmt.Sprintf("worker-%d", w.id)
	var env []string
	if w.sim {
		bin, name = fl.cfg.Sim, fmt.Sprintf("sim-%d", w.id)
		args, env = peerproc.SimArgs(peerproc.Sim{Model: model, Port: w.port, BlockSize: blockSize, KVCacheSize: poolBlocks,
			ZMQEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", w.kvPort), ReplayPort: w.rpPort,
			Extra: []string{"--kv-events-replay-queue-size", "100000", "--max-num-seqs", "64"}})
	}
	if w.proc == nil {
		w.proc = fleet.NewProcess(name, bin, fl.out)
		w.proc.Env, w.proc.OnExit = env, fl.onExit
	}
	w.proc.SetArgs(args)
	w.mu.Unlock()
	if err := w.proc.Start(); err != nil {
		return err
	}
	return fleet.WaitOK(context.Background(), fl.hc, w.url()+"/health", 30*time.Second)
}

// writeWorkersFile writes the file workers in the catalog, atomically (a
// rename), as a ConfigMap update or an editor would.
func (fl *cluster) writeWorkersFile() error {
	fl.fileMu.Lock()
	defer fl.fileMu.Unlock()
	var recs []map[string]any
	for _, w := range fl.workers {
		w.mu.Lock()
		in := w.viaFile && w.inCatalog
		w.mu.Unlock()
		if in {
			recs = append(recs, w.record())
		}
	}
	b, err := json.MarshalIndent(map[string]any{"workers": recs}, "", "  ")
	if err != nil {
		return err
	}
	tmp := fl.file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, fl.file)
}

// restCatalog registers w on r over REST, or deletes it there.
func (fl *cluster) restCatalog(ctx context.Context, r *replica, w *worker, in bool) error {
	if in {
		if err := r.kv.RegisterWorker(ctx, w.record()); err != nil {
			return fmt.Errorf("register worker %d on %s: %w", w.id, r.name, err)
		}
		return nil
	}
	status, body, err := fleet.Call(ctx, fl.hc, http.MethodDelete, fmt.Sprintf("%s/workers/%d", r.kv.REST, w.id), nil)
	if err == nil && status != http.StatusOK && status != http.StatusNotFound {
		err = fmt.Errorf("%d %s", status, body)
	}
	if err != nil {
		return fmt.Errorf("delete worker %d on %s: %w", w.id, r.name, err)
	}
	return nil
}

// catalog is setInCatalog with the replica set held still.
func (fl *cluster) catalog(ctx context.Context, w *worker, in bool) error {
	fl.topo.RLock()
	defer fl.topo.RUnlock()
	return fl.setInCatalog(ctx, w, in)
}

// lostBatches sums the KV event batches every running replica counts lost
// for w.
func (fl *cluster) lostBatches(ctx context.Context, w *worker) uint64 {
	var n uint64
	for _, r := range fl.replicas {
		if !r.kv.Proc.Running() || paused(r) {
			continue
		}
		var ws []struct {
			WorkerID       uint64 `json:"worker_id"`
			KVEventsStatus map[string]struct {
				Lost uint64 `json:"lost_batches"`
			} `json:"kv_events_status"`
		}
		if fleet.GetJSON(ctx, fl.hc, r.kv.REST+"/workers", &ws) != nil {
			continue
		}
		for _, x := range ws {
			if x.WorkerID == uint64(w.id) {
				for _, st := range x.KVEventsStatus {
					n += st.Lost
				}
			}
		}
	}
	return n
}

// setInCatalog adds or removes w everywhere: the workers file, or POST /
// DELETE on every running replica, then waits until every running replica
// agrees. A replica that is down is brought in line when it comes back.
func (fl *cluster) setInCatalog(ctx context.Context, w *worker, in bool) error {
	w.mu.Lock()
	w.inCatalog = in
	w.mu.Unlock()
	if w.viaFile {
		if err := fl.writeWorkersFile(); err != nil {
			return err
		}
	} else {
		for _, r := range fl.replicas {
			if !r.kv.Proc.Running() || paused(r) {
				continue
			}
			if err := fl.restCatalog(ctx, r, w, in); err != nil && r.kv.Proc.Running() {
				return err
			}
		}
	}
	var live []*replica
	for _, r := range fl.replicas {
		if r.kv.Proc.Running() && !paused(r) {
			live = append(live, r)
		}
	}
	return fl.waitCatalog(ctx, live, 30*time.Second)
}

func paused(r *replica) bool { return r.kv.Proc.Paused() }

type catalogWorker struct {
	WorkerID       uint64 `json:"worker_id"`
	Endpoint       string `json:"endpoint"`
	Lifecycle      string `json:"lifecycle"`
	KVEventsStatus map[string]struct {
		Connected bool `json:"connected"`
	} `json:"kv_events_status"`
}

// waitCatalog waits until each of rs lists exactly the catalogued workers,
// schedulable at their current endpoints with connected KV event streams.
func (fl *cluster) waitCatalog(ctx context.Context, rs []*replica, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last string
	for {
		want := map[uint64]string{}
		for _, w := range fl.workers {
			w.mu.Lock()
			if w.inCatalog {
				want[uint64(w.id)] = fmt.Sprintf("http://127.0.0.1:%d", w.port)
			}
			w.mu.Unlock()
		}
		last = ""
		for _, r := range rs {
			var ws []catalogWorker
			if err := fleet.GetJSON(ctx, fl.hc, r.kv.REST+"/workers", &ws); err != nil {
				last = fmt.Sprintf("%s: %v", r.name, err)
				break
			}
			got := map[uint64]string{}
			for _, w := range ws {
				conn := len(w.KVEventsStatus) > 0
				for _, st := range w.KVEventsStatus {
					conn = conn && st.Connected
				}
				if w.Lifecycle == "schedulable" && conn {
					got[w.WorkerID] = w.Endpoint
				} else {
					got[w.WorkerID] = w.Endpoint + " (" + w.Lifecycle + ", events connected " + strconv.FormatBool(conn) + ")"
				}
			}
			if !mapsEqual(got, want) {
				last = fmt.Sprintf("%s lists %v, want %v", r.name, got, want)
				break
			}
		}
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("catalog did not settle in %s: %s", limit, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func mapsEqual(a, b map[uint64]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// stop ends everything: workers first, then replicas and proxies.
func (fl *cluster) stop() {
	var wg sync.WaitGroup
	for _, w := range fl.workers {
		if w.proc != nil {
			wg.Go(func() { w.proc.Stop(10 * time.Second) })
		}
	}
	wg.Wait()
	for _, r := range fl.replicas {
		if r.conn != nil {
			r.conn.Close()
		}
		if r.kv != nil {
			wg.Go(r.kv.Stop)
		}
	}
	wg.Wait()
	for _, w := range fl.workers {
		if w.proxy != nil {
			w.proxy.close()
		}
		if w.replay != nil {
			w.replay.close()
		}
	}
}
