#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy (k8s.io/kubernetes with its
# staging modules pinned by replace directives in apiserver/go.mod, a module of
# its own so the main go.mod never sees them) and caches the binary:
#   $KVSELECT_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvselect)/kube/kube-apiserver-<version>
# Prints the binary's path on stdout. A cached binary is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/apiserver/go.mod")"
if [ -z "$version" ]; then
  echo "build-apiserver: no k8s.io/kubernetes version in $here/apiserver/go.mod" >&2
  exit 1
fi
cache="${KVSELECT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvselect}/kube"
bin="$cache/kube-apiserver-$version"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
minor="${version#v1.}"
minor="${minor%%.*}"
echo "build-apiserver: building kube-apiserver $version (takes a while on 2 cores; cached afterwards)" >&2
start=$(date +%s)
(
  cd "$here/apiserver"
  # Static, stripped, with the version the server reports (/version).
  CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    k8s.io/kubernetes/cmd/kube-apiserver
)
mv "$bin.tmp" "$bin"
echo "build-apiserver: built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
