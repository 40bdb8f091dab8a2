# shellcheck shell=bash
# Sourced by run-rest.sh and run-epp.sh (from the repository root): builds
# kvselect into a temporary directory and starts servers from it on free
# loopback ports; on exit every server is stopped and the directory removed.
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

# start_kvselect NAME ENV... -- FLAGS...: starts kvselect with KV events off
# and --port 0 (the picker then takes a free port too), waits until both
# listeners are bound (each logs its address once it accepts connections) and
# sets rest and ep to their addresses. Exits with the log if it does not start.
start_kvselect() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local log=$dir/$name.log
  env DYN_ROUTER_USE_KV_EVENTS=false "${envs[@]}" "$bin" --host 127.0.0.1 --port 0 \
    --log-format json "$@" >"$log" 2>&1 &
  pids+=($!)
  rest="" ep=""
  for _ in $(seq 1 100); do
    rest=$(logged "kvselect listening" "$log")
    ep=$(logged "ext_proc listening" "$log")
    [ -n "$rest" ] && [ -n "$ep" ] && return 0
    sleep 0.1
  done
  echo "kvselect ($name) did not start:" >&2
  cat "$log" >&2
  exit 1
}
