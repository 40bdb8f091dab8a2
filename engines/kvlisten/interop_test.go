package kvlisten

import (
	"bufio"
	"encoding/json"

	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/selection/index"
)

// The interop test runs testdata/vllm_publisher.py, a publisher written with
// pyzmq and msgpack that encodes batches the way vLLM's msgspec encoder does,
// and checks that the listener, fed through real sockets with a fifth of the
// batches withheld from the live stream (recovered by replay), ends with the
// engine's ground truth in the index.
//
// It needs Debian's python3-zmq and python3-msgpack under /usr/bin/python3
// (.ci/run installs them and sets KVSELECT_REQUIRE_PYTHON=1, which turns a
// missing interpreter or module into a failure instead of a skip).

const python = "/usr/bin/python3"

func requirePython(t *testing.T) {
	t.Helper()
	err := exec.Command(python, "-c", "import zmq, msgpack").Run()
	if err == nil {
		return
	}
	if os.Getenv("KVSELECT_REQUIRE_PYTHON") != "" {
		t.Fatalf("%s with pyzmq and msgpack is required (KVSELECT_REQUIRE_PYTHON is set): %v", python, err)
	}
	t.Skipf("%s with pyzmq and msgpack not available (apt install python3-zmq python3-msgpack): %v", python, err)
}

// pyEvent is the publisher script's JSON form of one event.
type pyEvent struct {
	Type            string   `json:"type"`
	BlockHashes     []uint64 `json:"block_hashes,omitempty"`
	ParentBlockHash *uint64  `json:"parent_block_hash"`
	TokenIDs        []uint32 `json:"token_ids,omitempty"`
	BlockSize       int      `json:"block_size,omitempty"`
	LoraID          *int     `json:"lora_id"`
	Medium          *string  `json:"medium"`
	LoraName        *string  `json:"lora_name"`
}

type pyBatch struct {
	Events []pyEvent `json:"events"`
	Drop   bool      `json:"drop"`
}

func (w *workload) pyJSON(dpRank uint32) ([]byte, error) {
	doc := struct {
		Topic   string    `json:"topic"`
		DPRank  uint32    `json:"dp_rank"`
		Batches []pyBatch `json:"batches"`
	}{Topic: "kv-events", DPRank: dpRank}
	for i, b := range w.batches {
		pb := pyBatch{Events: []pyEvent{}, Drop: w.drop[i]}
		for _, ev := range b {
			pe := pyEvent{Type: ev.Kind, BlockHashes: ev.Hashes, ParentBlockHash: ev.Parent, TokenIDs: ev.Tokens}
			if ev.Kind != "AllBlocksCleared" {
				m := ev.Medium
				pe.Medium = &m
			}
			if ev.Kind == "BlockStored" {
				pe.BlockSize = blockSize
				if ev.Lora != "" {
					l := ev.Lora
					pe.LoraName = &l
				}
			}
			pb.Events = append(pb.Events, pe)
		}
		doc.Batches = append(doc.Batches, pb)
	}
	return json.Marshal(doc)
}

// pyPublisher is a running vllm_publisher.py.
type pyPublisher struct {
	cmd           *exec.Cmd
	stdin         io.WriteCloser
	pubEP, replay string
}

func startPython(t *testing.T, workload []byte, args ...string) *pyPublisher {
	t.Helper()
	dir := t.TempDir()
	wf := filepath.Join(dir, "workload.json")
	if err := os.WriteFile(wf, workload, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, append([]string{filepath.Join("testdata", "vllm_publisher.py"), "--workload", wf}, args...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPublisher{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		p.stdin.Close()
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("publisher exit: %v", err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the publisher's endpoints: %v", err)
	}
	var eps struct{ Pub, Replay string }
	if err := json.Unmarshal([]byte(line), &eps); err != nil {
		t.Fatalf("publisher said %q: %v", line, err)
	}
	// pyzmq reports the wildcard bind as tcp://127.0.0.1:port already.
	p.pubEP, p.replay = eps.Pub, eps.Replay
	return p
}

func (p *pyPublisher) goNow(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

func TestPythonPublisherInterop(t *testing.T) {
	requirePython(t)
	cases := []struct {
		name string
		args []string
	}{
		{"positional arrays, int hashes", []string{"--shape", "array"}},
		{"tagged maps, int hashes", []string{"--shape", "map"}},
		{"positional arrays, bytes hashes", []string{"--shape", "array", "--bytes-hashes"}},
		{"tagged maps, bytes hashes", []string{"--shape", "map", "--bytes-hashes"}},
	}
	for i, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			w := newWorkload(uint64(100+i), 150, 0.2)
			wk := index.WorkerKey{WorkerID: uint64(40 + i), DPRank: 1}
			doc, err := w.pyJSON(wk.DPRank)
			if err != nil {
				t.Fatal(err)
			}
			p := startPython(t, doc, tc.args...)
			ix := newIndex(t)
			l := newListeners(t)
			if err := l.Attach(attachment(ix, wk, p.pubEP, p.replay)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "connected", func() bool { return status(t, l, wk).Connected })
			p.goNow(t)
			last := uint64(len(w.batches) - 1)
			eventually(t, "every workload batch accepted", func() bool {
				st := status(t, l, wk)
				return st.Synced && st.LastSeq > last
			})
			// Heartbeats keep coming; the workload's batches are all in by now
			// once the lane has applied what the cursor accepted.
			// A batch is counted after the index applied it, and the last
			// withheld one may change nothing the index checks: wait for both.
			withheld := uint64(countTrue(w.drop))
			eventually(t, "index equals the publisher's ground truth and every withheld batch replayed", func() bool {
				return w.check(ix, wk) == nil && status(t, l, wk).Replayed >= withheld
			})
			st := status(t, l, wk)
			if st.Lost != 0 || st.DecodeErrors != 0 || st.IncompleteReplays != 0 || st.Failed != 0 {
				t.Fatalf("unexpected listener status: %+v", st)
			}
			t.Logf("%d batches (%d withheld live), %d replays, %d replayed", len(w.batches), countTrue(w.drop), st.Replays, st.Replayed)
			if err := w.check(ix, wk); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
