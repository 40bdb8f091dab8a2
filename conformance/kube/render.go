// Package kube checks kvselect's Kubernetes deliverables against a real API
// server (make test-kube): it renders the Helm chart (deploy/helm/kvselect,
// with Helm's own engine and linter) and every kustomization under deploy/,
// applies each object with server-side dry-run to a kube-apiserver that has
// the Gateway API and GIE CRDs installed, and checks that the manifests' Role
// lets InferencePool discovery work and denies everything else. It is a
// module of its own so Helm and kustomize stay out of kvselect's go.mod.
package kube

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// RenderChart renders the chart in dir as `helm template` would for a release
// name and namespace, with vals merged over values.yaml, and returns the
// objects in template-file order.
func RenderChart(dir, release, namespace string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	files, err := RenderChartFiles(dir, release, namespace, vals, nil)
	if err != nil {
		return nil, err
	}
	return ChartObjects(files)
}

// RenderChartFiles renders the chart's templates, NOTES.txt included, keyed
// by template path. With cfg, the templates' lookup function reads that API
// server, as `helm install` and `helm upgrade` do; without, lookup finds
// nothing, as in `helm template`.
func RenderChartFiles(dir, release, namespace string, vals map[string]any, cfg *rest.Config) (map[string]string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return nil, err
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	var files map[string]string
	if cfg != nil {
		files, err = engine.RenderWithClient(ch, rv, cfg)
	} else {
		files, err = engine.Render(ch, rv)
	}
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return files, nil
}

// ChartObjects decodes the rendered YAML templates, in template-file order.
func ChartObjects(files map[string]string) ([]*unstructured.Unstructured, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		if filepath.Ext(n) == ".yaml" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, n := range names {
		objs, err := Decode([]byte(files[n]))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// Kustomize builds the kustomization in dir (kubectl kustomize).
func Kustomize(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	y, err := rm.AsYaml()
	if err != nil {
		return nil, err
	}
	return Decode(y)
}

// KustomizeOverlay builds a kustomization made of files (name → content),
// written to a temporary directory: a user's overlay of deploy/. Kustomize
// refuses absolute paths, so "$REPO" in the files is replaced by the relative
// path from that directory to repo, the repository's root.
func KustomizeOverlay(repo string, files map[string]string) ([]*unstructured.Unstructured, error) {
	dir, err := os.MkdirTemp("", "kvselect-overlay-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	abs, err := filepath.Abs(repo)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		return nil, err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.ReplaceAll(content, "$REPO", rel)), 0o644); err != nil {
			return nil, err
		}
	}
	return Kustomize(dir)
}

// Decode splits a multi-document YAML stream into objects, skipping empty
// documents; every object needs apiVersion and kind.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := r.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("object without apiVersion or kind: %v", m)
		}
		out = append(out, u)
	}
}
