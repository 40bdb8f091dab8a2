#!/usr/bin/env bash
# Builds kvselect, then runs the black-box EPP (ext_proc, GIE protocol 004)
# conformance suite against real kvselect processes on free loopback ports:
# the default picker, one with fallbacks and GIE's test hooks on, and one with
# a busy threshold for the 429 rule. Used by `make test` and
# `make conformance-epp`.
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

# logged MSG LOG: the addr of the JSON log line with that msg, once written.
logged() {
  grep "\"msg\":\"$1\"" "$2" | grep -o '"addr":"[^"]*"' | head -n1 | cut -d'"' -f4 || true
}

# run NAME ENV... -- FLAGS... [-- GOTEST-ARGS...]: start a server, run the suite.
run() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local log=$dir/$name.log
  # --port 0 without --extproc-port puts the picker on a free port as well.
  env DYN_ROUTER_USE_KV_EVENTS=false "${envs[@]}" "$bin" --host 127.0.0.1 --port 0 \
    --log-format json "${flags[@]}" >"$log" 2>&1 &
  pids+=($!)
  local rest="" ep=""
  for _ in $(seq 1 100); do
    rest=$(logged "kvselect listening" "$log")
    ep=$(logged "ext_proc listening" "$log")
    [ -n "$rest" ] && [ -n "$ep" ] && break
    sleep 0.1
  done
  if [ -z "$rest" ] || [ -z "$ep" ]; then
    echo "kvselect ($name) did not start:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "conformance/epp ($name) against kvselect: REST http://$rest, ext_proc $ep"
  env "${envs[@]}" KVSELECT_URL="http://$rest" KVSELECT_EXTPROC="$ep" \
    go test -count=1 -v "$@" ./conformance/epp | grep -E '^(--- |ok|FAIL|PASS|panic)'
}

run default KVSELECT_EXTPROC_MAX_BODY=1048576 -- --extproc-max-body-bytes 1048576
run fallbacks-and-test-hooks KVSELECT_EXTPROC_FALLBACKS=2 KVSELECT_EXTPROC_TEST_PICK=1 -- \
  --extproc-fallbacks 2 --extproc-test-pick-header
run busy DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD=10 KVSELECT_ACTIVE_PREFILL_THRESHOLD=10 -- -- -run 'TestOverloadIs429|TestHealth'
