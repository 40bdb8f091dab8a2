// Package kubetest starts a real Kubernetes control plane for tests: the
// kube-apiserver binary built from k8s.io/kubernetes by
// conformance/kube/build-apiserver.sh and Debian's etcd, wired by
// controller-runtime's envtest (certificates, an admin user, RBAC
// authorization). Tests that need it call Start, which skips them when the
// binaries are not configured and fails them instead under
// KVSELECT_REQUIRE_KUBE=1 (make test-kube sets it).
package kubetest

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Environment variables.
const (
	// EnvAPIServer is the path of the kube-apiserver binary.
	EnvAPIServer = "KVSELECT_KUBE_APISERVER"
	// EnvEtcd is the path of the etcd binary; default: etcd on $PATH.
	EnvEtcd = "KVSELECT_ETCD"
	// EnvRequire turns a skip for missing binaries into a failure.
	EnvRequire = "KVSELECT_REQUIRE_KUBE"
)

// GIEModule and GatewayAPIModule are the modules whose CRDs the tests install.
const (
	GIEModule        = "sigs.k8s.io/gateway-api-inference-extension"
	GatewayAPIModule = "sigs.k8s.io/gateway-api"
)

// Binaries returns the kube-apiserver and etcd paths, or why they are missing.
func Binaries() (apiserver, etcd string, err error) {
	apiserver = os.Getenv(EnvAPIServer)
	if apiserver == "" {
		return "", "", fmt.Errorf("%s is not set (make test-kube builds kube-apiserver and sets it)", EnvAPIServer)
	}
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("%s: %w", EnvAPIServer, err)
	}
	etcd = os.Getenv(EnvEtcd)
	if etcd == "" {
		if etcd, err = exec.LookPath("etcd"); err != nil {
			return "", "", fmt.Errorf("no etcd on PATH and %s is not set (apt-get install etcd-server)", EnvEtcd)
		}
	}
	return apiserver, etcd, nil
}

// Skip skips t (or fails it under KVSELECT_REQUIRE_KUBE=1) unless the
// binaries are configured.
func Skip(t testing.TB) {
	t.Helper()
	if _, _, err := Binaries(); err != nil {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("a Kubernetes API server is required (%s=1): %v", EnvRequire, err)
		}
		t.Skipf("no Kubernetes API server: %v", err)
	}
}

// Start runs etcd and kube-apiserver with the CRDs under crdDirs installed and
// stops them when t ends. Config is the admin's.
func Start(t testing.TB, crdDirs ...string) *envtest.Environment {
	t.Helper()
	Skip(t)
	apiserver, etcd, _ := Binaries()
	env := &envtest.Environment{
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{Path: apiserver},
			Etcd:      &envtest.Etcd{Path: etcd},
		},
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 3 * time.Minute, // a loaded 2-core machine
		ControlPlaneStopTimeout:  time.Minute,
	}
	start := time.Now()
	if _, err := env.Start(); err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	t.Logf("kube-apiserver and etcd up in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return env
}

// ModuleDir returns the module cache directory of module as the calling
// package's module requires it (go list -m), so CRDs come from the exact
// version in go.mod without copying them into the repository.
func ModuleDir(t testing.TB, module string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("go list -m %s: %v", module, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatalf("go list -m %s: module not downloaded (go mod download %s)", module, module)
	}
	return dir
}

// GIECRDs is the InferencePool (and InferencePoolImport) CRD directory of the
// GIE module in go.mod.
func GIECRDs(t testing.TB) string {
	return filepath.Join(ModuleDir(t, GIEModule), "config", "crd", "bases")
}

// ObjectiveCRDVersion is the GIE release whose InferenceObjective and
// InferenceModelRewrite CRDs (inference.networking.x-k8s.io) the tests
// install: the last that carries them, before the APIs moved to
// llm-d/llm-d-router (GIE PR #2973). go.mod requires a later
// GIE, so the module is fetched at this exact version (go mod download: the
// module cache, or the module proxy once).
const ObjectiveCRDVersion = "v1.5.0"

// ObjectiveCRD is the path of the InferenceObjective CRD of GIE
// ObjectiveCRDVersion (group inference.networking.x-k8s.io).
func ObjectiveCRD(t testing.TB) string {
	t.Helper()
	return legacyCRD(t, "inference.networking.x-k8s.io_inferenceobjectives.yaml")
}

// LegacyRewriteCRD is the path of the InferenceModelRewrite CRD of GIE
// ObjectiveCRDVersion (group inference.networking.x-k8s.io).
func LegacyRewriteCRD(t testing.TB) string {
	t.Helper()
	return legacyCRD(t, "inference.networking.x-k8s.io_inferencemodelrewrites.yaml")
}

func legacyCRD(t testing.TB, file string) string {
	t.Helper()
	mod := GIEModule + "@" + ObjectiveCRDVersion
	out, err := exec.Command("go", "mod", "download", "-json", mod).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("go mod download %s: %v", mod, err)
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", mod, err, dl.Error)
	}
	return filepath.Join(dl.Dir, "config", "crd", "bases", file)
}

// llmdCRDs are llm-d-router v0.10.0's InferenceObjective and
// InferenceModelRewrite CRDs (group llm-d.ai), copied from its
// config/crd/bases: the module proxy does not serve llm-d-router.
//
//go:embed testdata/llm-d/*.yaml
var llmdCRDs embed.FS

// LLMDObjectiveCRD and LLMDRewriteCRD are the file names of llm-d-router
// v0.10.0's CRDs in the directory LLMDCRDs returns.
const (
	LLMDObjectiveCRD = "llm-d.ai_inferenceobjectives.yaml"
	LLMDRewriteCRD   = "llm-d.ai_inferencemodelrewrites.yaml"
)

// LLMDCRDs writes llm-d-router v0.10.0's llm-d.ai CRDs (InferenceObjective,
// InferenceModelRewrite) to a directory of t's and returns it; names picks
// some of them (LLMDObjectiveCRD, LLMDRewriteCRD), none means both.
func LLMDCRDs(t testing.TB, names ...string) string {
	t.Helper()
	if len(names) == 0 {
		names = []string{LLMDObjectiveCRD, LLMDRewriteCRD}
	}
	dir := t.TempDir()
	for _, n := range names {
		b, err := llmdCRDs.ReadFile("testdata/llm-d/" + n)
		if err != nil {
			t.Fatalf("llm-d CRD %s: %v", n, err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Impersonate returns a copy of cfg acting as the service account ns/name, so
// a test sees exactly what that account's RBAC allows.
func Impersonate(cfg *rest.Config, ns, name string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name}
	return c
}
