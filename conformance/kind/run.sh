#!/usr/bin/env bash
# make conformance-kind: GIE's conformance suite (v1.6.0) with kvselect as the
# endpoint picker, on a local kind cluster. Needs Docker, kind, kubectl, helm
# (for the gateway), Go and internet access. docs/kubernetes.md walks through
# it; --dry-run prints every command instead of running it.
#
#   conformance/kind/run.sh [--gateway envoy-gateway|kgateway|istio|none]
#                           [--gateway-class NAME] [--cluster NAME] [--keep]
#                           [--report FILE] [--run-test SHORTNAME] [--dry-run]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

gateway=envoy-gateway
gateway_class=""
cluster=kvselect-conformance
keep=false
report="$repo/conformance/kind/report.yaml"
run_test=""
dry_run=false
image="kvselect:conformance"
mockworker_image="kvselect-mockworker:conformance"
# Versions of what the script installs; override from the environment.
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-}"
ENVOY_GATEWAY_VERSION="${ENVOY_GATEWAY_VERSION:-v1.8.1}"
KGATEWAY_VERSION="${KGATEWAY_VERSION:-v2.1.0}"
ISTIO_VERSION="${ISTIO_VERSION:-1.28.0}"

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
  case "$1" in
    --gateway) gateway="$2"; shift 2 ;;
    --gateway-class) gateway_class="$2"; shift 2 ;;
    --cluster) cluster="$2"; shift 2 ;;
    --keep) keep=true; shift ;;
    --report) report="$2"; shift 2 ;;
    --run-test) run_test="$2"; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

case "$gateway" in
  envoy-gateway) gateway_class="${gateway_class:-eg}" ;;
  kgateway) gateway_class="${gateway_class:-kgateway}" ;;
  istio) gateway_class="${gateway_class:-istio}" ;;
  none)
    if [ -z "$gateway_class" ]; then
      echo "run.sh: --gateway none needs --gateway-class of the gateway you installed" >&2
      exit 2
    fi ;;
  *) echo "run.sh: unknown --gateway $gateway (envoy-gateway, kgateway, istio, none)" >&2; exit 2 ;;
esac

# run prints a step and, unless --dry-run, runs it.
run() {
  echo "+ $*"
  if [ "$dry_run" = false ]; then
    "$@"
  elif [ "${*: -1}" = "-" ]; then
    sed 's/^/  | /' # show the manifest a dry run would have applied
  fi
}

step() { echo; echo "== $*"; }

need() {
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      if [ "$dry_run" = true ]; then
        echo "(dry run: $tool is not installed here)"
      else
        echo "run.sh: $tool is required (see docs/kubernetes.md, 'GIE conformance on kind')" >&2
        exit 1
      fi
    fi
  done
}

need docker kind kubectl go
[ "$gateway" = none ] || need helm

# Module directories of the CRDs, at the versions the suite was built with:
# from the Go module cache, so no release URL can drift from go.mod.
moddir() { (cd "$here" && go list -m -f '{{.Dir}}' "$1"); }

step "kind cluster $cluster"
if [ "$dry_run" = false ] && kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  echo "reusing the existing cluster"
else
  run kind create cluster --name "$cluster" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi
if [ "$keep" = false ]; then
  trap 'echo "+ kind delete cluster --name $cluster"; [ "$dry_run" = true ] || kind delete cluster --name "$cluster"' EXIT
fi
run kubectl config use-context "kind-$cluster"

# Gateways need LoadBalancer addresses: cloud-provider-kind assigns them.
step "LoadBalancer support (cloud-provider-kind)"
if ! command -v cloud-provider-kind >/dev/null 2>&1; then
  run go install sigs.k8s.io/cloud-provider-kind@latest
fi
if [ "$dry_run" = false ]; then
  "$(go env GOPATH)/bin/cloud-provider-kind" >"${TMPDIR:-/tmp}/cloud-provider-kind.log" 2>&1 &
  cpk=$!
  trap 'kill "$cpk" 2>/dev/null || true; [ "$keep" = true ] || kind delete cluster --name "$cluster"' EXIT
else
  echo "+ cloud-provider-kind &"
fi

step "Gateway API and InferencePool CRDs"
gw_dir="$(moddir sigs.k8s.io/gateway-api 2>/dev/null || echo GATEWAY_API_MODULE)"
gie_dir="$(moddir sigs.k8s.io/gateway-api-inference-extension 2>/dev/null || echo GIE_MODULE)"
run kubectl apply --server-side -f "$gw_dir/config/crd/standard/"
run kubectl apply --server-side -f "$gie_dir/config/crd/bases/"

step "gateway implementation: $gateway (GatewayClass $gateway_class)"
case "$gateway" in
  envoy-gateway)
    # InferencePool backends are an Envoy Gateway extension API.
    run helm upgrade --install eg oci://docker.io/envoyproxy/gateway-helm --version "$ENVOY_GATEWAY_VERSION" \
      --namespace envoy-gateway-system --create-namespace --skip-crds \
      --set config.envoyGateway.extensionApis.enableBackend=true \
      --set config.envoyGateway.extensionApis.enableInferencePool=true --wait
    run kubectl apply -f - <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: $gateway_class
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
EOF
    ;;
  kgateway)
    run helm upgrade --install kgateway-crds oci://cr.kgateway.dev/kgateway-dev/charts/kgateway-crds --version "$KGATEWAY_VERSION" \
      --namespace kgateway-system --create-namespace
    run helm upgrade --install kgateway oci://cr.kgateway.dev/kgateway-dev/charts/kgateway --version "$KGATEWAY_VERSION" \
      --namespace kgateway-system --set inferenceExtension.enabled=true --wait
    ;;
  istio)
    run helm repo add istio https://istio-release.storage.googleapis.com/charts
    run helm upgrade --install istio-base istio/base --version "$ISTIO_VERSION" -n istio-system --create-namespace --wait
    run helm upgrade --install istiod istio/istiod --version "$ISTIO_VERSION" -n istio-system \
      --set pilot.env.ENABLE_GATEWAY_API_INFERENCE_EXTENSION=true --wait
    ;;
  none) echo "using the installed gateway's class $gateway_class" ;;
esac

step "kvselect and mock worker images"
run docker build -f "$repo/deploy/Dockerfile" -t "$image" "$repo"
run kind load docker-image "$image" --name "$cluster"

step "GIE conformance suite (v1.6.0), kvselect in place of lwepp"
args=(-gateway-class "$gateway_class" -report-output "$report" -cleanup-base-resources=true)
[ -z "$run_test" ] || args+=(-run-test "$run_test")
echo "+ (cd $here && KVSELECT_IMAGE=$image go test -run TestConformance -timeout 60m -count=1 . -args ${args[*]})"
if [ "$dry_run" = false ]; then
  (cd "$here" && KVSELECT_IMAGE="$image" go test -run TestConformance -timeout 60m -count=1 -v . -args "${args[@]}")
fi

step "smoke test: kvselect over mock workers with KV events, through the gateway"
# The suite's echo servers publish no KV events; this step runs the example
# overlay's shape with kvselect-mockworker pods instead of vLLM, so the
# picker's KV-event listeners and /workers are exercised in a cluster too.
cat >"${TMPDIR:-/tmp}/kvselect-mockworker.Dockerfile" <<'EOF'
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/kvselect-mockworker ./cmd/kvselect-mockworker
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvselect-mockworker /kvselect-mockworker
ENTRYPOINT ["/kvselect-mockworker"]
EOF
run docker build -f "${TMPDIR:-/tmp}/kvselect-mockworker.Dockerfile" -t "$mockworker_image" "$repo"
run kind load docker-image "$mockworker_image" --name "$cluster"
run kubectl create namespace kvselect-smoke
# The chart's secure defaults: the gateway dials the picker with TLS (as it
# dials GIE's picker), and the REST API wants a bearer token (the chart
# generates one; /ready needs none).
run helm upgrade --install kvselect "$repo/deploy/helm/kvselect" -n kvselect-smoke \
  --set image.repository="${image%%:*}" --set image.tag="${image##*:}" \
  --set httpRoute.enabled=true --set httpRoute.gatewayName=smoke --set-string 'extraArgs[0]=--extproc-default-model=mock-model'
run kubectl apply -n kvselect-smoke -f - <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: smoke
spec:
  gatewayClassName: $gateway_class
  listeners:
    - {name: http, protocol: HTTP, port: 80}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: mockworker
spec:
  replicas: 2
  selector: {matchLabels: {app: vllm}}
  template:
    metadata:
      labels: {app: vllm}
      annotations:
        kvselect.io/model: mock-model
        kvselect.io/kv-events-port: "5557"
        kvselect.io/replay-port: "5600"
    spec:
      containers:
        - name: mockworker
          image: $mockworker_image
          args: [--host=0.0.0.0, --port=8000, --model=mock-model, --kv-events-endpoint=tcp://0.0.0.0:5557, --kv-replay-endpoint=tcp://0.0.0.0:5600]
          readinessProbe: {httpGet: {path: /health, port: 8000}}
EOF
run kubectl -n kvselect-smoke rollout status deployment/mockworker --timeout=180s
run kubectl -n kvselect-smoke rollout status deployment/kvselect --timeout=180s
run kubectl -n kvselect-smoke wait gateway/smoke --for=condition=Programmed --timeout=300s
if [ "$dry_run" = false ]; then
  addr="$(kubectl -n kvselect-smoke get gateway smoke -o jsonpath='{.status.addresses[0].value}')"
  for i in $(seq 1 20); do
    curl -sf "http://$addr/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"mock-model\",\"prompt\":\"the same long shared prefix of words number $((i % 2))\",\"max_tokens\":4}" >/dev/null
  done
  kubectl -n kvselect-smoke port-forward svc/kvselect 18092:8092 >/dev/null 2>&1 &
  pf=$!
  sleep 3
  token="$(kubectl -n kvselect-smoke get secret kvselect-auth-tokens -o jsonpath='{.data.token}' | base64 -d)"
  curl -s -H "Authorization: Bearer $token" localhost:18092/workers | tee "${report%.yaml}-smoke-workers.json"
  echo
  curl -sf localhost:18092/ready >/dev/null && echo "smoke: kvselect ready with the mock workers"
  kill "$pf"
fi

echo
echo "conformance report: $report"
