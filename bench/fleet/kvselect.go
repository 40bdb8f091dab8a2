package fleet

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvselect/kvselect/bench/promtext"
	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/peerproc"
)

// KVSelect is a kvselect process serving its REST API and its ext_proc
// picker on loopback. This is the one place the benchmarks run kvselect's
// binary.
type KVSelect struct {
	Proc    *Process
	REST    string // http://127.0.0.1:port
	ExtProc string // 127.0.0.1:port
	HTTP    *http.Client
}

// KVSelectConfig is how to run kvselect.
type KVSelectConfig struct {
	Binary string
	// Name names the process and its log, Dir/Name.log.
	Name, Dir string
	// Port and ExtProcPort are its REST and ext_proc ports on 127.0.0.1;
	// free ports when 0.
	Port, ExtProcPort int
	// Args follow the listeners and --log-level warn.
	Args []string
	Env  []string
	// Wrap is a command kvselect runs under, such as taskset -c 0 to pin
	// it to a CPU (taskset execs it in place: the process id is kvselect's).
	Wrap []string
	// HTTP talks to its REST API; a client of its own when nil.
	HTTP   *http.Client
	OnExit func(name string, err error)
}

// NewKVSelect chooses kvselect's ports and prepares its process; Start runs
// it.
func NewKVSelect(cfg KVSelectConfig) (*KVSelect, error) {
	if cfg.Port == 0 || cfg.ExtProcPort == 0 {
		ports, err := FreePorts(2)
		if err != nil {
			return nil, err
		}
		cfg.Port, cfg.ExtProcPort = cmp.Or(cfg.Port, ports[0]), cmp.Or(cfg.ExtProcPort, ports[1])
	}
	args := append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(cfg.Port),
		"--extproc-port", strconv.Itoa(cfg.ExtProcPort), "--log-level", "warn"}, cfg.Args...)
	bin := cfg.Binary
	if len(cfg.Wrap) > 0 {
		bin, args = cfg.Wrap[0], append(append(slices.Clone(cfg.Wrap[1:]), cfg.Binary), args...)
	}
	p := NewProcess(cfg.Name, bin, cfg.Dir, args...)
	p.Env, p.OnExit = cfg.Env, cfg.OnExit
	hc := cfg.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	return &KVSelect{Proc: p, REST: "http://127.0.0.1:" + strconv.Itoa(cfg.Port),
		ExtProc: "127.0.0.1:" + strconv.Itoa(cfg.ExtProcPort), HTTP: hc}, nil
}

// FreePorts returns n distinct TCP ports that were free on 127.0.0.1 a
// moment ago (peerproc.FreePort's, which never repeats one), for processes
// that must know each other's ports before they start.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := peerproc.FreePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// StartKVSelect runs kvselect and waits until it serves.
func StartKVSelect(ctx context.Context, cfg KVSelectConfig) (*KVSelect, error) {
	k, err := NewKVSelect(cfg)
	if err != nil {
		return nil, err
	}
	if err := k.Start(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// Start starts a new incarnation and waits until it serves.
func (k *KVSelect) Start(ctx context.Context) error {
	if err := k.Proc.Start(); err != nil {
		return err
	}
	if err := k.WaitServing(ctx); err != nil {
		k.Stop()
		return err
	}
	return nil
}

// WaitServing waits up to 30 s for kvselect to answer GET /health.
func (k *KVSelect) WaitServing(ctx context.Context) error {
	if err := WaitOK(ctx, k.HTTP, k.REST+"/health", 30*time.Second); err != nil {
		return fmt.Errorf("%s did not come up: %w (log %s)\n%s", k.Proc.Name, err, k.Proc.Log, k.Proc.LogTail(2000))
	}
	return nil
}

// Stop ends kvselect (SIGTERM, SIGKILL after 10 s).
func (k *KVSelect) Stop() { k.Proc.Stop(10 * time.Second) }

// Dial connects to the picker as Envoy does, plaintext or over TLS without
// verifying kvselect's certificate.
func (k *KVSelect) Dial(secure bool) (*grpc.ClientConn, error) { return Dial(k.ExtProc, secure) }

// Dial connects to the ext_proc picker at addr as Envoy does (envoysim's
// options), plaintext or over TLS without verifying the picker's
// certificate.
func Dial(addr string, secure bool) (*grpc.ClientConn, error) {
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if secure {
		creds = envoysim.InsecureTLS()
	}
	return grpc.NewClient(addr, append(envoysim.DialOptions(), creds)...)
}

// Metrics scrapes kvselect's /metrics.
func (k *KVSelect) Metrics(ctx context.Context) (promtext.Samples, error) {
	return promtext.Scrape(ctx, k.HTTP, k.REST+"/metrics")
}

// RegisterWorker registers (or replaces) a worker: rec is a POST /workers
// body.
func (k *KVSelect) RegisterWorker(ctx context.Context, rec any) error {
	return Post(ctx, k.HTTP, k.REST+"/workers", rec)
}

// ActiveRequests sums kvselect's active requests over every worker (GET
// /loads): the bookings it holds.
func (k *KVSelect) ActiveRequests(ctx context.Context) (uint64, error) {
	var loads []struct {
		Loads []struct {
			ActiveRequests uint64 `json:"active_requests"`
		} `json:"loads"`
	}
	if err := GetJSON(ctx, k.HTTP, k.REST+"/loads", &loads); err != nil {
		return 0, err
	}
	var n uint64
	for _, m := range loads {
		for _, l := range m.Loads {
			n += l.ActiveRequests
		}
	}
	return n, nil
}

// Settle waits up to limit for kvselect's bookings to drain — the picker
// frees each when it sees its response end, which can trail the client's
// last byte — and returns how many are left.
func (k *KVSelect) Settle(ctx context.Context, limit time.Duration) (uint64, error) {
	deadline := time.Now().Add(limit)
	for {
		n, err := k.ActiveRequests(ctx)
		if err != nil || n == 0 || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WaitNoBookings is Settle that fails when bookings are left.
func (k *KVSelect) WaitNoBookings(ctx context.Context, limit time.Duration) error {
	n, err := k.Settle(ctx, limit)
	if err == nil && n > 0 {
		err = fmt.Errorf("%d bookings left in kvselect after every response ended", n)
	}
	return err
}

// WaitWorkers waits until kvselect lists n schedulable workers whose KV event
// streams are connected.
func (k *KVSelect) WaitWorkers(ctx context.Context, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		var ws []struct {
			Lifecycle      string `json:"lifecycle"`
			KVEventsStatus map[string]struct {
				Connected bool `json:"connected"`
			} `json:"kv_events_status"`
		}
		if err := GetJSON(ctx, k.HTTP, k.REST+"/workers", &ws); err == nil {
			ready := 0
			for _, w := range ws {
				conn := len(w.KVEventsStatus) > 0
				for _, st := range w.KVEventsStatus {
					conn = conn && st.Connected
				}
				if w.Lifecycle == "schedulable" && conn {
					ready++
				}
			}
			if ready == n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("timed out waiting for %d registered workers with connected KV event streams", n)
}
