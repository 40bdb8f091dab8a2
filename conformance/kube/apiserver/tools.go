//go:build tools

// Package apiserver pins k8s.io/kubernetes so that `go build
// k8s.io/kubernetes/cmd/kube-apiserver` works from this nested module; see
// build.sh. It is a module of its own so the main go.mod never sees
// k8s.io/kubernetes and its replace directives.
package apiserver

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
