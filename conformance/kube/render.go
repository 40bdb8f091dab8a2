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
	"path/filepath"
	"sort"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// RenderChart renders the chart in dir as `helm template` would for a release
// name and namespace, with vals merged over values.yaml, and returns the
// objects in template-file order.
func RenderChart(dir, release, namespace string, vals map[string]any) ([]*unstructured.Unstructured, error) {
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
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
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
