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
# kvbench extproc starts each run's kvselect itself (-kvselect, on CPU 0
# with -kvselect-cpu), on free loopback ports; its log is
# $BENCHOUT/extproc-kvselect.log.
#
# Usage: bench/extproc-pinned.sh [runs] [extra kvbench extproc flags...]
# Env: RUNS (3), DURATION (10s), BENCHOUT (bench/out), LOADGEN_GOGC (400),
#      KVSELECT_GOGC (unset: 100), KVSELECT_ENV (more VAR=value words for
#      kvselect's environment, e.g. the OTEL_* variables), JSON_PREFIX
#      (extproc-pinned: the reports are $BENCHOUT/$JSON_PREFIX-<run>.json).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-${RUNS:-3}}
shift || true
duration=${DURATION:-10s}
out=${BENCHOUT:-bench/out}

if [ "$(nproc)" -lt 2 ]; then
	echo "extproc-pinned: needs at least 2 CPUs (found $(nproc))" >&2
	exit 1
fi
command -v taskset >/dev/null || { echo "extproc-pinned: taskset (util-linux) is required" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

go build -tags vtprotobuf -o "$tmp/kvselect" ./cmd/kvselect
go build -tags vtprotobuf -o "$tmp/kvbench" ./cmd/kvbench
mkdir -p "$out"

for run in $(seq "$runs"); do
	echo "== run $run/$runs: kvselect on CPU 0, load generator on CPU 1"
	# The load generator's GOGC must not reach kvselect: its environment
	# names its own.
	GOGC=${LOADGEN_GOGC:-400} GOMAXPROCS=1 taskset -c 1 "$tmp/kvbench" extproc \
		-kvselect "$tmp/kvselect" -kvselect-cpu 0 -kvselect-env "GOGC=${KVSELECT_GOGC:-100} ${KVSELECT_ENV:-} GOMAXPROCS=1" \
		-streams 64 -duration "$duration" -json "$out/${JSON_PREFIX:-extproc-pinned}-$run.json" "$@"
done
