#!/usr/bin/env bash
# Builds kvselect, then runs the black-box EPP (ext_proc, GIE protocol 004)
# conformance suite against real kvselect processes on free loopback ports:
# the default picker, one with fallbacks and GIE's test hooks on, and one with
# a busy threshold for the 429 rule. Used by `make test` and
# `make conformance-epp`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=conformance/servers.sh
. conformance/servers.sh

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
  start_kvselect "$name" "${envs[@]}" -- "${flags[@]}"
  echo "conformance/epp ($name) against kvselect: REST http://$rest, ext_proc $ep"
  env "${envs[@]}" KVSELECT_URL="http://$rest" KVSELECT_EXTPROC="$ep" \
    go test -count=1 -v "$@" ./conformance/epp | grep -E '^(--- |ok|FAIL|PASS|panic)'
}

run default KVSELECT_EXTPROC_MAX_BODY=1048576 -- --extproc-max-body-bytes 1048576
run fallbacks-and-test-hooks KVSELECT_EXTPROC_FALLBACKS=2 KVSELECT_EXTPROC_TEST_PICK=1 -- \
  --extproc-fallbacks 2 --extproc-test-pick-header
run busy DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD=10 KVSELECT_ACTIVE_PREFILL_THRESHOLD=10 -- -- -run 'TestOverloadIs429|TestHealth'
