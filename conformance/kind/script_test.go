package kind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scripts are the shell scripts of the Kubernetes work.
var scripts = []string{"run.sh", "../kube/run.sh", "../kube/build-apiserver.sh", "../../deploy/replicas/register-workers.sh"}

// TestScriptsPassShellcheck lints the scripts (Debian's shellcheck; make
// test-kube installs it). Without it the test skips, unless
// KVSELECT_REQUIRE_KUBE=1.
func TestScriptsPassShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		if os.Getenv("KVSELECT_REQUIRE_KUBE") == "1" {
			t.Fatal("shellcheck is required (apt-get install shellcheck)")
		}
		t.Skip("no shellcheck")
	}
	out, err := exec.Command(sc, append([]string{"--severity=style"}, scripts...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("shellcheck: %v\n%s", err, out)
	}
}

// TestRunScriptDryRun walks the whole kind procedure without Docker or a
// cluster: every step is printed in order with the flags the suite and the
// tools need.
func TestRunScriptDryRun(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{nil, []string{
			"+ kind create cluster --name kvselect-conformance",
			"config/crd/standard/", "gateway-api-inference-extension@v1.6.0/config/crd/bases/",
			"oci://docker.io/envoyproxy/gateway-helm", "controllerName: gateway.envoyproxy.io/gatewayclass-controller",
			"docker build -f " + abs(t, "../../deploy/Dockerfile"),
			"kind load docker-image kvselect:conformance",
			"KVSELECT_IMAGE=kvselect:conformance go test -run TestConformance",
			"-gateway-class eg -report-output",
			"kind load docker-image kvselect-mockworker:conformance",
			"+ kind delete cluster --name kvselect-conformance",
		}},
		{[]string{"--gateway", "kgateway", "--keep", "--run-test", "GatewayFollowingEPPRouting"}, []string{
			"charts/kgateway", "-gateway-class kgateway", "-run-test GatewayFollowingEPPRouting",
		}},
		{[]string{"--gateway", "none", "--gateway-class", "mine"}, []string{"-gateway-class mine"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, err := exec.Command("bash", append([]string{"run.sh", "--dry-run"}, tt.args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("run.sh --dry-run: %v\n%s", err, out)
			}
			s := string(out)
			last := -1
			for _, w := range tt.want {
				i := strings.Index(s, w)
				if i < 0 {
					t.Fatalf("dry run lacks %q:\n%s", w, s)
				}
				if len(tt.args) == 0 && i < last {
					t.Errorf("%q comes out of order", w)
				}
				last = i
			}
			if slicesContains(tt.args, "--keep") && strings.Contains(s, "kind delete cluster") {
				t.Error("--keep still deletes the cluster")
			}
		})
	}
	for _, bad := range [][]string{{"--gateway", "nginx"}, {"--gateway", "none"}, {"--bogus"}} {
		if err := exec.Command("bash", append([]string{"run.sh", "--dry-run"}, bad...)...).Run(); err == nil {
			t.Errorf("run.sh %v accepted", bad)
		}
	}
}

func abs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
