// Package deploy holds kvselect's Kubernetes deliverables (docs/kubernetes.md):
// the container image recipe (Dockerfile), the kustomize base and overlays,
// the Helm chart and example manifests. Its tests run with make test and need
// nothing but Go: the Dockerfile's build recipe is executed as written and its
// binary checked. Rendering, linting and applying the manifests to a real API
// server live in conformance/kube (make test-kube), a module of its own.
package deploy
