// Package kind runs the Gateway API Inference Extension conformance suite
// (sigs.k8s.io/gateway-api-inference-extension/conformance, v1.6.0) with
// kvselect standing in for the suite's lwepp endpoint picker. The suite embeds
// its manifests and hard-codes the lwepp image; Manifests serves the same
// files with resources/base.yaml rewritten so every picker Deployment runs
// kvselect (image, flags, probes) and every model-server pod carries the
// kvselect.io/model annotation. run.sh (make conformance-kind) creates the
// kind cluster and runs TestConformance. It is a module of its own: the
// suite's dependencies stay out of kvselect's go.mod.
package kind

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing/fstest"

	gieconf "sigs.k8s.io/gateway-api-inference-extension/conformance"
	"sigs.k8s.io/yaml"
)

// Model is the model name the suite's requests carry.
const Model = "conformance-fake-model"

// LWEPPImage is the picker image base.yaml names.
const LWEPPImage = "registry.k8s.io/gateway-api-inference-extension/lwepp"

// Options say how kvselect replaces lwepp.
type Options struct {
	// Image is the kvselect image loaded into the cluster.
	Image string
	// PullPolicy of that image; IfNotPresent for an image loaded with kind.
	PullPolicy string
	// ExtraArgs are appended to kvselect's flags.
	ExtraArgs []string
}

// Manifests returns the suite's embedded files with base.yaml rewritten for
// kvselect.
func Manifests(o Options) (fs.FS, error) {
	out := fstest.MapFS{}
	err := fs.WalkDir(gieconf.Manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(gieconf.Manifests, path)
		if err != nil {
			return err
		}
		if path == "resources/base.yaml" {
			if b, err = RewriteBase(b, o); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		out[path] = &fstest.MapFile{Data: b, Mode: 0o444}
		return nil
	})
	return out, err
}

// RewriteBase rewrites the suite's base manifests: lwepp Deployments become
// kvselect ones, model-server pods get the kvselect.io/model annotation.
func RewriteBase(base []byte, o Options) ([]byte, error) {
	if o.Image == "" {
		return nil, errors.New("no kvselect image")
	}
	docs := splitDocs(base)
	var out bytes.Buffer
	pickers := 0
	for _, doc := range docs {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, err
		}
		if obj == nil {
			continue
		}
		if obj["kind"] == "Deployment" {
			changed, err := rewriteDeployment(obj, o)
			if err != nil {
				return nil, fmt.Errorf("Deployment %v: %w", dig(obj, "metadata", "name"), err)
			}
			if changed {
				pickers++
			}
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	if pickers == 0 {
		return nil, fmt.Errorf("no %s Deployment found: the suite's base.yaml changed shape", LWEPPImage)
	}
	return out.Bytes(), nil
}

func rewriteDeployment(obj map[string]any, o Options) (bool, error) {
	tmpl, _ := dig(obj, "spec", "template").(map[string]any)
	spec, _ := dig(tmpl, "spec").(map[string]any)
	containers, _ := spec["containers"].([]any)
	for _, c := range containers {
		c := c.(map[string]any)
		img, _ := c["image"].(string)
		if !strings.HasPrefix(img, LWEPPImage+":") {
			continue
		}
		args, err := pickerArgs(c["args"], o)
		if err != nil {
			return false, err
		}
		c["image"] = o.Image
		c["imagePullPolicy"] = o.PullPolicy
		c["args"] = args
		// The suite's echo servers publish no KV events: kvselect learns
		// from its own bookings instead (the approximate index).
		c["env"] = append(asList(c["env"]), map[string]any{"name": "DYN_ROUTER_USE_KV_EVENTS", "value": "false"})
		// lwepp's probes are gRPC health on its plaintext health port 9003.
		// kvselect serves gRPC health on the ext_proc port only, which is
		// TLS here (pickerArgs), and the kubelet's gRPC probes speak no
		// TLS: probe GET /health on the REST port instead, which like the
		// gRPC health names reports serving from the start. Not /ready:
		// it follows the pool's workers, which some of the suite's tests
		// take away, and an unready picker is no picker to the gateway.
		for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
			p, ok := dig(c, probe).(map[string]any)
			if !ok {
				continue
			}
			delete(p, "grpc")
			p["httpGet"] = map[string]any{"path": "/health", "port": 8092}
		}
		c["ports"] = []any{
			map[string]any{"name": "grpc", "containerPort": 9002},
			map[string]any{"name": "http", "containerPort": 8092},
		}
		return true, nil
	}
	// A model server: tell kvselect which model it serves.
	meta, _ := tmpl["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		tmpl["metadata"] = meta
	}
	ann, _ := meta["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
		meta["annotations"] = ann
	}
	ann["kvselect.io/model"] = Model
	return false, nil
}

// pickerArgs maps lwepp's flags to kvselect's: the pool stays, the rest is
// kvselect's ext_proc on 9002 with the conformance hooks on.
//
// TLS on the picker, as lwepp serves it: its --secure-serving defaults to
// true (GIE v1.6.0 pkg/lwepp/server/options.go) and base.yaml does not turn
// it off, so the gateways that pass the suite dial their endpoint pickers
// with TLS (kgateway, for one, dials nothing else:
// kgateway-dev/kgateway#11429).
//
// The REST API: the suite never calls it; only the kubelet's HTTP probes
// (above) need to reach it on the pod IP. kvselect without authentication
// binds it to 127.0.0.1 unless --host is given, and lwepp's ServiceAccount
// in base.yaml has no system:auth-delegator for --auth-kubernetes. So this
// throwaway conformance cluster binds it on all addresses unauthenticated,
// explicitly: --host=0.0.0.0 --auth-allow-unauthenticated. Not a setup to
// copy: deploy/ authenticates.
func pickerArgs(raw any, o Options) ([]any, error) {
	in := asList(raw)
	var pool, ns string
	for i := 0; i < len(in); i++ {
		a := fmt.Sprint(in[i])
		name, val, hasVal := strings.Cut(a, "=")
		if !hasVal && i+1 < len(in) {
			val = fmt.Sprint(in[i+1])
		}
		switch name {
		case "--pool-name":
			pool = val
		case "--pool-namespace":
			ns = val
		}
	}
	if pool == "" || ns == "" {
		return nil, fmt.Errorf("lwepp args %v: no --pool-name/--pool-namespace", in)
	}
	out := []any{
		"--pool-name=" + pool, "--pool-namespace=" + ns,
		"--extproc-port=9002", "--port=8092", "--log-format=json",
		"--extproc-test-pick-header", "--extproc-default-model=" + Model,
		"--extproc-secure-serving",
		"--host=0.0.0.0", "--auth-allow-unauthenticated",
	}
	for _, a := range o.ExtraArgs {
		out = append(out, a)
	}
	return out, nil
}

func splitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(b, []byte("\n---")) {
		d = bytes.TrimPrefix(bytes.TrimSpace(d), []byte("---"))
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}

func dig(m any, keys ...string) any {
	for _, k := range keys {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[k]
	}
	return m
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
