#!/usr/bin/env bash
# Builds kvselect, then runs the black-box REST conformance suite against real
# kvselect processes on free loopback ports: once with the configuration the
# suite assumes (conformance/rest/README.md), then with session affinity on and
# with queueing on, so the tests that need those settings run instead of
# skipping. Used by `make test` and `make conformance-rest`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
bin=$dir/kvselect
go build -o "$bin" ./cmd/kvselect
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# run NAME ENV... -- FLAGS...: start a server, run the suite against it.
run() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local log=$dir/$name.log
  env DYN_ROUTER_USE_KV_EVENTS=false "${envs[@]}" "$bin" --host 127.0.0.1 --port 0 \
    --selection-cache-ttl-secs 2 --log-format json "$@" >"$log" 2>&1 &
  pids+=($!)
  local addr=""
  for _ in $(seq 1 100); do
    # The address is logged once the listener is bound: connections are accepted from then on.
    addr=$(grep -o '"addr":"[^"]*"' "$log" | head -n1 | cut -d'"' -f4 || true)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "kvselect ($name) did not start:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "conformance/rest ($name) against kvselect at http://$addr"
  KVSELECT_URL="http://$addr" go test -count=1 -v ./conformance/rest | grep -E '^(--- |ok|FAIL|PASS)'
}

run default --
run session-affinity -- --session-affinity-ttl-secs 60
run queueing DYN_ROUTER_QUEUE_THRESHOLD=1 --
