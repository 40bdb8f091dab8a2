package server

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/proctest"
)

func TestDiscoveryFlagsRejected(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--workers-file", "w.yaml", "--pool-name", "p"}, "--workers-file and --pool-name are both discovery sources"},
		{[]string{"--workers-file", " "}, "--workers-file: empty path"},
		{[]string{"--pool-name", "Bad_Name"}, `--pool-name "Bad_Name": a lowercase RFC 1123 subdomain`},
		{[]string{"--pool-name", "p", "--pool-namespace", "a.b"}, `--pool-namespace "a.b": must not contain dots`},
		{[]string{"--pool-namespace", "ns"}, "--pool-namespace requires --pool-name"},
		{[]string{"--kubeconfig", "/k"}, "--kubeconfig requires --pool-name"},
		{[]string{"--pool-name", "p", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubernetes client config"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			status, _, stderr := runArgs(t, append([]string{"--port", "0", "--extproc-port", "0"}, tt.args...)...)
			if status != 2 || !strings.Contains(stderr, tt.want) {
				t.Fatalf("status %d, stderr %q; want 2 and %q", status, stderr, tt.want)
			}
		})
	}
}

// TestWorkersFileThroughTheServer runs the whole program with --workers-file:
// not ready until the file is read, then the file's workers over REST.
func TestWorkersFileThroughTheServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.json")
	if err := os.WriteFile(path, []byte(`{"workers":[{"worker_id":11,"model_name":"m","endpoint":"http://127.0.0.1:1","block_size":16}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := runInBackground(t, withoutKVEvents, []string{"--extproc-port", "0", "--workers-file", path})
	addr, logs := srv.addrs.REST.String(), srv.logs
	proctest.Eventually(t, "the file's worker to be ready", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/ready")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Ready   bool `json:"ready"`
			Workers []struct {
				WorkerID uint64 `json:"worker_id"`
			}
			Conditions []struct{ Name, Reason string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode == http.StatusOK && body.Ready && len(body.Workers) == 1 && body.Workers[0].WorkerID == 11 &&
			len(body.Conditions) == 1 && body.Conditions[0].Reason == "WorkersFileLoaded"
	})
	if err := srv.stop(20 * time.Second); err != nil {
		t.Fatalf("run = %v", err)
	}
	if !strings.Contains(logs.String(), `"msg":"workers file loaded"`) {
		t.Errorf("logs lack the load line:\n%s", logs.String())
	}
}
