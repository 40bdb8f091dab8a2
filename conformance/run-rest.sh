#!/usr/bin/env bash
# Builds kvselect, then runs the black-box REST conformance suite against real
# kvselect processes on free loopback ports: once with the configuration the
# suite assumes (conformance/rest/README.md), then with session affinity on and
# with queueing on, so the tests that need those settings run instead of
# skipping. Used by `make test` and `make conformance-rest`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=conformance/servers.sh
. conformance/servers.sh

# run NAME ENV... -- FLAGS...: start a server, run the suite against it.
run() {
  local name=$1
  shift
  start_kvselect "$name" "$@" --selection-cache-ttl-secs 2
  echo "conformance/rest ($name) against kvselect at http://$rest"
  KVSELECT_URL="http://$rest" go test -count=1 -v ./conformance/rest | grep -E '^(--- |ok|FAIL|PASS)'
}

run default --
run session-affinity -- --session-affinity-ttl-secs 60
run queueing DYN_ROUTER_QUEUE_THRESHOLD=1 --
