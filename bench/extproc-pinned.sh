#!/usr/bin/env bash
# The ext_proc picker's throughput on a two-core machine, measured the way the
# picker is deployed: kvselect in its own process on CPU 0 (GOMAXPROCS=1), the
# Envoy-side load generator (kvbench extproc: envoysim over loopback gRPC) in
# another process on CPU 1 (GOMAXPROCS=1). Per request: headers + a 4 KB body
# (FULL_DUPLEX_STREAMED), the decision, response headers, 20 streamed SSE
# chunks, Envoy's close — 23 messages each way — with 64 concurrent streams.
# The server's CPU per request comes from its own /metrics
# (process_cpu_seconds_total).
#
# The load generator runs with GOGC=400 (LOADGEN_GOGC) so it spends less of
# its core collecting garbage; kvselect runs with the Go defaults unless
# KVSELECT_GOGC is set. Pinning both to one core each keeps Go's schedulers
# from competing for the same two CPUs (docs/benchmarks.md shows both).
#
# Usage: bench/extproc-pinned.sh [runs] [extra kvbench extproc flags...]
# Env: RUNS (3), DURATION (10s), REST_PORT (18092), EXTPROC_PORT (19002),
#      BENCHOUT (bench/out), LOADGEN_GOGC (400), KVSELECT_GOGC (unset: 100),
#      KVSELECT_ENV (more VAR=value words for kvselect's environment, e.g.
#      the OTEL_* variables), JSON_PREFIX (extproc-pinned: the reports are
#      $BENCHOUT/$JSON_PREFIX-<run>.json).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-${RUNS:-3}}
shift || true
duration=${DURATION:-10s}
rest_port=${REST_PORT:-18092}
ep_port=${EXTPROC_PORT:-19002}
out=${BENCHOUT:-bench/out}

if [ "$(nproc)" -lt 2 ]; then
	echo "extproc-pinned: needs at least 2 CPUs (found $(nproc))" >&2
	exit 1
fi
command -v taskset >/dev/null || { echo "extproc-pinned: taskset (util-linux) is required" >&2; exit 1; }
if curl -sf "http://127.0.0.1:$rest_port/health" >/dev/null 2>&1; then
	echo "extproc-pinned: something already answers on 127.0.0.1:$rest_port" >&2
	exit 1
fi

tmp=$(mktemp -d)
server=""
cleanup() {
	if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -tags vtprotobuf -o "$tmp/kvselect" ./cmd/kvselect
go build -tags vtprotobuf -o "$tmp/kvbench" ./cmd/kvbench
mkdir -p "$out"

for run in $(seq "$runs"); do
	# shellcheck disable=SC2086 # KVSELECT_ENV is a list of words
	env ${KVSELECT_GOGC:+GOGC=$KVSELECT_GOGC} ${KVSELECT_ENV:-} GOMAXPROCS=1 taskset -c 0 \
		"$tmp/kvselect" --host 127.0.0.1 --port "$rest_port" --extproc-port "$ep_port" --log-level warn 2>"$tmp/kvselect.log" &
	server=$!
	for _ in $(seq 100); do
		curl -sf "http://127.0.0.1:$rest_port/health" >/dev/null 2>&1 && break
		sleep 0.1
	done
	if ! kill -0 "$server" 2>/dev/null; then
		echo "extproc-pinned: kvselect did not start:" >&2
		cat "$tmp/kvselect.log" >&2
		exit 1
	fi
	echo "== run $run/$runs: kvselect on CPU 0, load generator on CPU 1"
	GOGC=${LOADGEN_GOGC:-400} GOMAXPROCS=1 taskset -c 1 "$tmp/kvbench" extproc \
		-url "http://127.0.0.1:$rest_port" -addr "127.0.0.1:$ep_port" -streams 64 -duration "$duration" \
		-json "$out/${JSON_PREFIX:-extproc-pinned}-$run.json" "$@"
	kill "$server"
	wait "$server" 2>/dev/null || true
	server=""
done
