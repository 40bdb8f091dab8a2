//go:build unix

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/proctest"
)

// The replica-set tests run real kvselect processes on loopback, talking ZMQ
// to each other and HTTP to the test: a three-replica mesh (propagation,
// session affinity, kill and restart with index recovery, dynamic peers) and
// a peer that dies mid-stream. Asynchronous conditions are polled with
// generous deadlines; nothing is timed.

const replicaDeadline = 45 * time.Second

// kvselectBinary builds cmd/kvselect once per test binary run.
var kvselectBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kvselect-replicas-")
	if err != nil {
		return "", err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kvselect")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// proc is one running kvselect.
type proc struct {
	name   string
	base   string // http://127.0.0.1:port
	zmq    string // tcp://127.0.0.1:<replica port>, "" without replica sync
	cmd    *exec.Cmd
	logs   *logBuffer
	exited chan struct{}
}

// freePort returns a loopback TCP port nobody listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startProc runs kvselect with the approximate index (bookings teach it, so
// a test can fill an index without engines) plus env and args.
func startProc(t *testing.T, name string, replicaPort int, env []string, args ...string) *proc {
	t.Helper()
	bin, err := kvselectBinary()
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string{"--host", "127.0.0.1", "--port", "0", "--log-format", "json", "--log-level", "debug"}, args...)
	p := &proc{name: name, logs: &logBuffer{}, exited: make(chan struct{})}
	if replicaPort > 0 {
		all = append(all, "--replica-sync-port", fmt.Sprint(replicaPort))
		p.zmq = fmt.Sprintf("tcp://127.0.0.1:%d", replicaPort)
	}
	p.cmd = exec.Command(bin, all...)
	p.cmd.Env = append(withoutRouterEnv(os.Environ()), append([]string{"DYN_ROUTER_USE_KV_EVENTS=false"}, env...)...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(io.TeeReader(stderr, p.logs))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if addr, ok := listeningAddr(sc.Text()); ok {
				addrc <- addr
			}
		}
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s logs (tail):\n%s", p.name, tail(p.logs.String(), 40))
		}
	})
	select {
	case addr := <-addrc:
		p.base = "http://" + addr
	case <-p.exited:
		t.Fatalf("%s exited before listening:\n%s", name, p.logs.String())
	case <-time.After(replicaDeadline):
		t.Fatalf("%s: no startup line:\n%s", name, p.logs.String())
	}
	return p
}

func (p *proc) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// call sends a request and returns status and body; transport errors fail.
func (p *proc) call(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s %s: %v", p.name, method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (p *proc) must(t *testing.T, method, path, body string, status int) string {
	t.Helper()
	got, b := p.call(t, method, path, body)
	if got != status {
		t.Fatalf("%s %s %s = %d %s, want %d", p.name, method, path, got, b, status)
	}
	return b
}

// total is a process's /loads summed over workers.
type total struct{ requests, prefill, decode uint64 }

func (p *proc) load(t *testing.T) total {
	t.Helper()
	var rows []struct {
		Loads []struct {
			Prefill  uint64 `json:"potential_prefill_tokens"`
			Decode   uint64 `json:"potential_decode_blocks"`
			Requests uint64 `json:"active_requests"`
		} `json:"loads"`
	}
	if err := json.Unmarshal([]byte(p.must(t, "GET", "/loads", "", http.StatusOK)), &rows); err != nil {
		t.Fatal(err)
	}
	var s total
	for _, r := range rows {
		for _, l := range r.Loads {
			s.requests += l.Requests
			s.prefill += l.Prefill
			s.decode += l.Decode
		}
	}
	return s
}

const workerJSON = `{"worker_id":%d,"model_name":"llama","endpoint":"http://10.0.0.%d:8000","block_size":4}`

func registerWorkers(t *testing.T, ps ...*proc) {
	t.Helper()
	for _, p := range ps {
		for id := 1; id <= 2; id++ {
			p.must(t, "POST", "/workers", fmt.Sprintf(workerJSON, id, id), http.StatusCreated)
		}
	}
}

var probeSeq int

// meshed books probes on from until every peer's /loads shows one, then frees
// them: a ZMQ subscription reaches the publisher asynchronously, and what is
// published before it arrives is lost, so the test waits for the mesh to carry
// traffic before it measures anything.
func meshed(t *testing.T, from *proc, to ...*proc) {
	t.Helper()
	end := time.Now().Add(replicaDeadline)
	for {
		probeSeq++
		id := fmt.Sprintf("probe-%s-%d", from.name, probeSeq)
		from.must(t, "POST", "/reservations", fmt.Sprintf(`{"model_name":"llama","selection_id":%q,"worker_id":1,"sequence_hashes":[7],"isl_tokens":4}`, id), http.StatusCreated)
		seen := false
		for wait := time.Now().Add(500 * time.Millisecond); !seen && time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
			seen = true
			for _, p := range to {
				seen = seen && p.load(t).requests > 0
			}
		}
		from.must(t, "DELETE", "/reservations/"+id, "", http.StatusOK)
		for _, p := range to {
			proctest.Eventually(t, p.name+" drops the probe", replicaDeadline, func() bool { return p.load(t).requests == 0 })
		}
		if seen {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("mesh from %s to the others not carrying events", from.name)
		}
	}
}

// normalizedDump flattens /dump into sorted (partition, worker, rank, tier,
// parent, block, tokens) rows: the index's content, independent of the order
// in which a tree lists siblings it created in a different order.
func normalizedDump(t *testing.T, p *proc) []string {
	t.Helper()
	var d map[string]struct {
		BlockSize uint32 `json:"block_size"`
		Events    []struct {
			WorkerID uint64 `json:"worker_id"`
			Tier     string `json:"storage_tier"`
			Event    struct {
				DPRank uint32 `json:"dp_rank"`
				Data   struct {
					Stored *struct {
						Parent *uint64 `json:"parent_hash"`
						Blocks []struct {
							Block  uint64 `json:"block_hash"`
							Tokens uint64 `json:"tokens_hash"`
						} `json:"blocks"`
					} `json:"stored"`
				} `json:"data"`
			} `json:"event"`
		} `json:"events"`
	}
	if err := json.Unmarshal([]byte(p.must(t, "GET", "/dump", "", http.StatusOK)), &d); err != nil {
		t.Fatal(err)
	}
	var rows []string
	for key, part := range d {
		rows = append(rows, fmt.Sprintf("%s block_size=%d", key, part.BlockSize))
		for _, ev := range part.Events {
			st := ev.Event.Data.Stored
			if st == nil {
				t.Fatalf("%s: dump holds a non-stored event", p.name)
			}
			parent := "root"
			if st.Parent != nil {
				parent = fmt.Sprint(*st.Parent)
			}
			for _, b := range st.Blocks {
				rows = append(rows, fmt.Sprintf("%s w=%d/%d %s parent=%s block=%d tokens=%d", key, ev.WorkerID, ev.Event.DPRank, ev.Tier, parent, b.Block, b.Tokens))
				parent = fmt.Sprint(b.Block)
			}
		}
	}
	slices.Sort(rows)
	return rows
}

func tokens(from, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprint(from + i)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func TestReplicaSetOverLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs kvselect processes; skipped with -short")
	}
	ports := map[string]int{"A": freePort(t), "B": freePort(t), "C": freePort(t)}
	peersOf := func(self string) string {
		var eps []string
		for _, n := range []string{"A", "B", "C"} {
			if n != self {
				eps = append(eps, fmt.Sprintf("tcp://127.0.0.1:%d", ports[n]))
			}
		}
		return strings.Join(eps, ",")
	}
	start := func(name string, extra ...string) *proc {
		return startProc(t, name, ports[name], nil,
			append([]string{"--replica-sync-peers", peersOf(name), "--session-affinity-ttl-secs", "600"}, extra...)...)
	}
	a, b, c := start("A"), start("B"), start("C")
	registerWorkers(t, a, b, c)
	meshed(t, a, b, c)
	meshed(t, b, a, c)
	meshed(t, c, a, b)

	t.Run("booking on A shows on B and C, prefill complete and free follow", func(t *testing.T) {
		a.must(t, "POST", "/select_and_reserve", `{"model_name":"llama","selection_id":"req-1","token_ids":`+tokens(1, 16)+`}`, http.StatusOK)
		for _, p := range []*proc{b, c} {
			proctest.Eventually(t, p.name+" mirrors req-1", replicaDeadline, func() bool { return p.load(t) == total{1, 16, 4} })
		}
		// The id is taken everywhere now.
		b.must(t, "POST", "/select_and_reserve", `{"model_name":"llama","selection_id":"req-1","token_ids":[1,2,3,4]}`, http.StatusConflict)
		a.must(t, "POST", "/reservations/req-1/prefill_complete", "", http.StatusOK)
		for _, p := range []*proc{b, c} {
			proctest.Eventually(t, p.name+" sees prefill complete", replicaDeadline, func() bool { return p.load(t) == total{1, 0, 4} })
		}
		a.must(t, "POST", "/reservations/req-1/output_block", `{}`, http.StatusOK) // local only
		time.Sleep(100 * time.Millisecond)                                         // a negative: let a stray event arrive
		if got := b.load(t); got != (total{1, 0, 4}) {
			t.Fatalf("output block reached B: %+v", got)
		}
		a.must(t, "DELETE", "/reservations/req-1", "", http.StatusOK)
		for _, p := range []*proc{b, c} {
			proctest.Eventually(t, p.name+" frees req-1", replicaDeadline, func() bool { return p.load(t) == total{} })
		}
	})

	t.Run("session bound on A is honoured by C", func(t *testing.T) {
		var booked struct {
			WorkerID uint64 `json:"worker_id"`
		}
		body := a.must(t, "POST", "/select_and_reserve", `{"model_name":"llama","selection_id":"sess-1","session_id":"chat-7","token_ids":`+tokens(500, 8)+`}`, http.StatusOK)
		if err := json.Unmarshal([]byte(body), &booked); err != nil {
			t.Fatal(err)
		}
		proctest.Eventually(t, "C steers the session to A's worker", replicaDeadline, func() bool {
			var got struct {
				WorkerID uint64 `json:"worker_id"`
			}
			_, body := c.call(t, "POST", "/select", `{"model_name":"llama","session_id":"chat-7","token_ids":`+tokens(900, 8)+`}`)
			return json.Unmarshal([]byte(body), &got) == nil && got.WorkerID == booked.WorkerID
		})
		a.must(t, "DELETE", "/reservations/sess-1", "", http.StatusOK)
	})

	t.Run("B killed and restarted recovers A's index and rejoins", func(t *testing.T) {
		for i := range 6 {
			id := fmt.Sprint("warm-", i)
			a.must(t, "POST", "/select_and_reserve", fmt.Sprintf(`{"model_name":"llama","selection_id":%q,"token_ids":%s}`, id, tokens(1000*(i+1), 12)), http.StatusOK)
			a.must(t, "DELETE", "/reservations/"+id, "", http.StatusOK)
		}
		want := normalizedDump(t, a)
		if len(want) < 10 {
			t.Fatalf("A's index is too small to test recovery: %q", want)
		}
		b.kill()
		b2 := start("B", "--indexer-peers", a.base)
		registerWorkers(t, b2)
		proctest.Eventually(t, "B ready after recovery", replicaDeadline, func() bool {
			status, body := b2.call(t, "GET", "/ready", "")
			return status == http.StatusOK && strings.Contains(body, `"index_recovery":"recovered"`)
		})
		if got := normalizedDump(t, b2); !slices.Equal(got, want) {
			t.Fatalf("B's recovered dump differs from A's:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// A and C redial B's port on their own; B subscribes to both.
		meshed(t, b2, a, c)
		meshed(t, a, b2, c)
		meshed(t, c, a, b2)
		b = b2
	})

	t.Run("dynamic peers", func(t *testing.T) {
		var peers []string
		if err := json.Unmarshal([]byte(c.must(t, "GET", "/replica_sync/peers", "", http.StatusOK)), &peers); err != nil {
			t.Fatal(err)
		}
		if want := strings.Split(peersOf("C"), ","); !slices.Equal(peers, slices.Sorted(slices.Values(want))) {
			t.Fatalf("C peers %q, want %q", peers, want)
		}
		extra := fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%d"}`, freePort(t))
		c.must(t, "POST", "/replica_sync/register_peer", extra, http.StatusCreated)
		c.must(t, "POST", "/replica_sync/register_peer", extra, http.StatusOK)
		c.must(t, "POST", "/replica_sync/register_peer", `{"endpoint":"invalid"}`, http.StatusBadRequest)
		c.must(t, "POST", "/replica_sync/register_peer", `{"endpoint":"tcp://127.0.0.1"}`, http.StatusBadRequest)
		c.must(t, "POST", "/replica_sync/register_peer", `{}`, http.StatusUnprocessableEntity)
		c.must(t, "POST", "/replica_sync/deregister_peer", extra, http.StatusOK)
		c.must(t, "POST", "/replica_sync/deregister_peer", extra, http.StatusNotFound)
		// Deregistering A cuts A's events off from C; re-registering restores them.
		aEP := fmt.Sprintf(`{"endpoint":"tcp://127.0.0.1:%d"}`, ports["A"])
		c.must(t, "POST", "/replica_sync/deregister_peer", aEP, http.StatusOK)
		a.must(t, "POST", "/reservations", `{"model_name":"llama","selection_id":"cut","worker_id":2,"sequence_hashes":[9],"isl_tokens":4}`, http.StatusCreated)
		proctest.Eventually(t, "B mirrors the booking", replicaDeadline, func() bool { return b.load(t).requests == 1 })
		time.Sleep(200 * time.Millisecond) // a negative: C, which heard it no later than B would, must not
		if got := c.load(t); got != (total{}) {
			t.Fatalf("C applied A's event after deregistering A: %+v", got)
		}
		a.must(t, "DELETE", "/reservations/cut", "", http.StatusOK)
		c.must(t, "POST", "/replica_sync/register_peer", aEP, http.StatusCreated)
		meshed(t, a, c)
	})
}

// A replica that dies mid-stream leaves its mirrored bookings on the others
// only until the active-request expiry reclaims them; a replica without
// --replica-sync-port refuses peer changes with 409.
func TestReplicaDeadPeerExpiresAndDisabledSync(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs kvselect processes; skipped with -short")
	}
	pd, pe := freePort(t), freePort(t)
	short := []string{"DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS=2"}
	d := startProc(t, "D", pd, short, "--replica-sync-peers", fmt.Sprintf("tcp://127.0.0.1:%d", pe))
	e := startProc(t, "E", pe, short, "--replica-sync-peers", fmt.Sprintf("tcp://127.0.0.1:%d", pd))
	off := startProc(t, "F", 0, nil)
	registerWorkers(t, d, e)
	meshed(t, d, e)
	for i := range 3 {
		d.must(t, "POST", "/select_and_reserve", fmt.Sprintf(`{"model_name":"llama","selection_id":"doomed-%d","token_ids":%s}`, i, tokens(10*i, 8)), http.StatusOK)
	}
	proctest.Eventually(t, "E mirrors D's bookings", replicaDeadline, func() bool { return e.load(t).requests == 3 })
	d.kill() // SIGKILL: no frees will ever come
	proctest.Eventually(t, "E reclaims the dead peer's load", replicaDeadline, func() bool { return e.load(t) == total{} })

	off.must(t, "GET", "/replica_sync/peers", "", http.StatusOK)
	if body := off.must(t, "GET", "/replica_sync/peers", "", http.StatusOK); strings.TrimSpace(body) != "[]" {
		t.Fatalf("peers without replica sync: %s", body)
	}
	off.must(t, "POST", "/replica_sync/register_peer", `{"endpoint":"tcp://127.0.0.1:9"}`, http.StatusConflict)
	off.must(t, "POST", "/replica_sync/deregister_peer", `{"endpoint":"tcp://127.0.0.1:9"}`, http.StatusConflict)
}
