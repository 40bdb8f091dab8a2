#!/usr/bin/env bash
# make test-kube: the tests that need a real Kubernetes API server. Installs
# Debian's etcd-server (and shellcheck) when missing, builds kube-apiserver
# from the Go module proxy once (cached; build-apiserver.sh), then runs with
# KVSELECT_REQUIRE_KUBE=1 so nothing skips:
#   - discovery: InferencePool discovery against the API server (discovery/...),
#     and kvselect itself run with --pool-name/--kubeconfig (server)
#   - conformance/kube: Helm chart lint and rendering, server-side dry-run of
#     every manifest, the Role enough-and-no-more check
#   - conformance/kind: the GIE suite compiled at v1.6.0 with kvselect's
#     manifests, script lint and the kind procedure's dry run
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test-kube: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "test-kube: install ${missing[*]} (Debian: apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

t0=$(date +%s)
KVSELECT_KUBE_APISERVER="$(./conformance/kube/build-apiserver.sh)"
KVSELECT_ETCD="$(command -v etcd)"
export KVSELECT_KUBE_APISERVER KVSELECT_ETCD KVSELECT_REQUIRE_KUBE=1
t1=$(date +%s)
echo "test-kube: kube-apiserver ready in $((t1 - t0)) s: $KVSELECT_KUBE_APISERVER ($("$KVSELECT_KUBE_APISERVER" --version))"
echo "test-kube: $("$KVSELECT_ETCD" --version | head -1)"

go test -count=1 ./discovery/...
go test -count=1 -run AgainstARealAPIServer ./server
go test -count=1 ./internal/access/kubeauth/
(cd conformance/kube && go vet ./... && go test -count=1 ./...)
(cd conformance/kind && go vet ./... && go test -count=1 ./... && go test -c -o /dev/null .)
t2=$(date +%s)
echo "test-kube: tests took $((t2 - t1)) s; total $((t2 - t0)) s"
