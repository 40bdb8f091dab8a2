package kind

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

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
			for _, want := range []string{"--extproc-test-pick-header", "--extproc-port=9002", "--log-level=debug", "--extproc-default-model=" + Model} {
				if !slices.Contains(args, any(want)) {
					t.Errorf("%v: picker args %v lack %s", dig(obj, "metadata", "name"), args, want)
				}
			}
			if !slices.ContainsFunc(args, func(a any) bool { return strings.HasPrefix(a.(string), "--pool-name=") }) {
				t.Errorf("picker args %v: no pool", args)
			}
			if p := dig(c, "readinessProbe", "grpc", "port"); p != float64(9002) && p != 9002 {
				t.Errorf("readiness probe port %v, want 9002", p)
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
