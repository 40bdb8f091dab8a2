package kind

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gieconf "sigs.k8s.io/gateway-api-inference-extension/conformance"
	"sigs.k8s.io/yaml"
)

// TestManifestsSwapLWEPPForKVSelect runs here (no cluster): every lwepp
// Deployment of the suite's base.yaml runs kvselect with the pool it was
// given, every other Deployment (the echo model servers) carries the model
// annotation, and the other embedded files are served unchanged.
func TestManifestsSwapLWEPPForKVSelect(t *testing.T) {
	m, err := Manifests(Options{Image: "kvselect:conformance", PullPolicy: "IfNotPresent", ExtraArgs: []string{"--log-level=debug"}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := fs.ReadFile(m, "resources/base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(base), LWEPPImage) {
		t.Fatal("base.yaml still names the lwepp image")
	}
	pickers, servers := 0, 0
	for _, doc := range splitDocs(base) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatal(err)
		}
		if obj["kind"] != "Deployment" {
			continue
		}
		c := dig(obj, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
		if c["image"] == "kvselect:conformance" {
			pickers++
			args := asList(c["args"])
			// TLS as lwepp serves it; the REST API reachable by the probes,
			// unauthenticated by an explicit choice (pickerArgs).
			for _, want := range []string{"--extproc-test-pick-header", "--extproc-port=9002", "--log-level=debug", "--extproc-default-model=" + Model,
				"--extproc-secure-serving", "--host=0.0.0.0", "--auth-allow-unauthenticated"} {
				if !slices.Contains(args, any(want)) {
					t.Errorf("%v: picker args %v lack %s", dig(obj, "metadata", "name"), args, want)
				}
			}
			if !slices.ContainsFunc(args, func(a any) bool { return strings.HasPrefix(a.(string), "--pool-name=") }) {
				t.Errorf("picker args %v: no pool", args)
			}
			// kubelet's gRPC probes speak no TLS: HTTP /health on the REST port.
			for _, probe := range []string{"livenessProbe", "readinessProbe"} {
				if dig(c, probe, "grpc") != nil {
					t.Errorf("%s is gRPC: it cannot reach the TLS picker", probe)
				}
				if path, port := dig(c, probe, "httpGet", "path"), dig(c, probe, "httpGet", "port"); path != "/health" || (port != float64(8092) && port != 8092) {
					t.Errorf("%s GET %v on %v, want /health on 8092", probe, path, port)
				}
			}
			continue
		}
		servers++
		if dig(obj, "spec", "template", "metadata", "annotations", "kvselect.io/model") != Model {
			t.Errorf("%v: model server without the kvselect.io/model annotation", dig(obj, "metadata", "name"))
		}
	}
	if pickers < 4 || servers < 3 {
		t.Fatalf("rewrote %d pickers and %d model servers; the suite's base.yaml has at least 4 and 3", pickers, servers)
	}
	// Everything else is served as embedded.
	err = fs.WalkDir(gieconf.Manifests, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "resources/base.yaml" {
			return err
		}
		a, _ := fs.ReadFile(gieconf.Manifests, p)
		b, err := fs.ReadFile(m, p)
		if err != nil || string(a) != string(b) {
			t.Errorf("%s not served unchanged: %v", p, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRewriteBaseRefusesAnUnexpectedShape(t *testing.T) {
	if _, err := RewriteBase([]byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n"), Options{Image: "i"}); err == nil {
		t.Fatal("a base without lwepp was accepted")
	}
	if _, err := RewriteBase(nil, Options{}); err == nil {
		t.Fatal("no image accepted")
	}
}

// TestPickerArgsStartKvselect starts the real kvselect with the arguments the
// rewrite gives each picker (a workers file in place of the pool, which needs
// a cluster; free ports in place of 9002 and 8092): flag validation accepts
// them, the REST API binds every address so the kubelet's HTTP probes reach
// it on the pod IP, /health answers without a token, and the picker answers a
// TLS handshake with ALPN h2 as the suite's gateways expect of lwepp.
func TestPickerArgsStartKvselect(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kvselect; skipped with -short")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kvselect")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kvselect")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	workers := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(workers, []byte("workers: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := pickerArgs([]any{"--pool-name", "primary-inference-pool", "--pool-namespace", "ns"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range in {
		s := a.(string)
		if strings.HasPrefix(s, "--pool-") || strings.HasPrefix(s, "--extproc-port=") || strings.HasPrefix(s, "--port=") {
			continue
		}
		args = append(args, s)
	}
	// --port 0 without --extproc-port: both on free ports.
	args = append(args, "--workers-file="+workers, "--port=0")
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var logs strings.Builder
	addrs := map[string]string{}
	sc := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer deadline.Stop()
	for len(addrs) < 2 && sc.Scan() {
		logs.WriteString(sc.Text() + "\n")
		var rec struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &rec) == nil && (rec.Msg == "kvselect listening" || rec.Msg == "ext_proc listening") {
			addrs[rec.Msg] = rec.Addr
		}
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }() // never block kvselect's logging
	rest, picker := addrs["kvselect listening"], addrs["ext_proc listening"]
	if rest == "" || picker == "" {
		t.Fatalf("kvselect did not start with %q:\n%s", args, logs.String())
	}
	host, port, _ := net.SplitHostPort(rest)
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		t.Errorf("REST API on %s: the kubelet's probes come to the pod IP, it must bind every address", rest)
	}
	resp, err := http.Get("http://127.0.0.1:" + port + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health: %s", resp.Status)
	}
	_, pport, _ := net.SplitHostPort(picker)
	conn, err := tls.Dial("tcp", "127.0.0.1:"+pport, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // the suite's gateways do not verify lwepp either
	if err != nil {
		t.Fatalf("TLS to the picker: %v\n%s", err, logs.String())
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Errorf("picker ALPN %q, want h2", p)
	}
}
