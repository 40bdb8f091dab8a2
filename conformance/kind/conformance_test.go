package kind

import (
	"os"
	"strings"
	"testing"

	"io/fs"
	gieconf "sigs.k8s.io/gateway-api-inference-extension/conformance"
)

// TestConformance runs GIE's suite against a live cluster (run.sh): the
// suite's own flags (-gateway-class, -report-output, -run-test, ...) follow
// -args, and KVSELECT_IMAGE names the kvselect image loaded into the cluster.
func TestConformance(t *testing.T) {
	img := os.Getenv("KVSELECT_IMAGE")
	if img == "" {
		t.Skip("KVSELECT_IMAGE is not set: run conformance/kind/run.sh (make conformance-kind)")
	}
	var extra []string
	if v := os.Getenv("KVSELECT_EXTRA_ARGS"); v != "" {
		extra = strings.Fields(v)
	}
	m, err := Manifests(Options{Image: img, PullPolicy: "IfNotPresent", ExtraArgs: extra})
	if err != nil {
		t.Fatal(err)
	}
	opts := gieconf.DefaultOptions(t)
	opts.ManifestFS = []fs.FS{m}
	gieconf.RunConformanceWithOptions(t, opts)
}
