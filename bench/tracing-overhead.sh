#!/usr/bin/env bash
# What tracing costs the ext_proc picker: kvselect's CPU per request with
# tracing off, on with every trace sampled out (OTEL_TRACES_SAMPLER=
# traceidratio, ratio 0), with one trace in ten sampled (ratio 0.1) and with
# every trace sampled (always_on), each
# exporting over OTLP gRPC to a real receiver (kvbench otlp-sink, on the load
# generator's CPU). The pinned ext_proc setup (bench/extproc-pinned.sh): the
# three modes alternate in a rotating order, ROUNDS rounds, so that whatever
# else the machine does falls on all of them; the summary is the median of
# each mode's server_cpu_us_per_request and of its ratio to the same round's
# tracing-off run.
#
# Usage: bench/tracing-overhead.sh   Env: ROUNDS (3), DURATION (10s),
#        BENCHOUT (bench/out), SINK_PORT (14317).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
out=${BENCHOUT:-bench/out}
sink_port=${SINK_PORT:-14317}
command -v jq >/dev/null || { echo "tracing-overhead: jq is required" >&2; exit 1; }
mkdir -p "$out"

tmp=$(mktemp -d)
sink=""
cleanup() {
	if [ -n "$sink" ]; then kill -INT "$sink" 2>/dev/null || true; wait "$sink" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -tags vtprotobuf -o "$tmp/kvbench" ./cmd/kvbench
taskset -c 1 "$tmp/kvbench" otlp-sink -grpc "127.0.0.1:$sink_port" -http "127.0.0.1:$((sink_port + 1))" >"$tmp/sink.out" 2>"$tmp/sink.log" &
sink=$!
sleep 1

otlp="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$sink_port OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
declare -A modes=(
	[off]=""
	[sampled-0]="$otlp OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0"
	[sampled-0.1]="$otlp OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0.1"
	[sampled-1]="$otlp OTEL_TRACES_SAMPLER=always_on"
)
rm -f "$out"/tracing-*.json
order=(off sampled-0 sampled-0.1 sampled-1)
for round in $(seq "$rounds"); do
	# Each round starts with another mode, so none always runs first.
	for k in 0 1 2 3; do
		mode=${order[$(((round + k) % 4))]}
		echo "== round $round/$rounds: tracing $mode"
		RUNS=1 JSON_PREFIX="tracing-$mode-r$round" KVSELECT_ENV="${modes[$mode]}" BENCHOUT="$out" ./bench/extproc-pinned.sh
	done
done
kill -INT "$sink"
wait "$sink" 2>/dev/null || true
sink=""
echo
echo "spans received by the sink: $(tail -1 "$tmp/sink.out")"
printf '%-12s %28s %22s %14s\n' mode "server CPU µs/request (median)" "÷ same round's off" "requests/s"
for mode in "${order[@]}"; do
	cpu=$(jq -s '[.[].server_cpu_us_per_request] | sort | .[length/2|floor]' "$out"/tracing-"$mode"-r*.json)
	rps=$(jq -s '[.[].requests_per_sec] | sort | .[length/2|floor]' "$out"/tracing-"$mode"-r*.json)
	ratios=()
	for round in $(seq "$rounds"); do
		ratios+=("$(jq -s '.[0].server_cpu_us_per_request / .[1].server_cpu_us_per_request' \
			"$out/tracing-$mode-r$round-1.json" "$out/tracing-off-r$round-1.json")")
	done
	ratio=$(printf '%s\n' "${ratios[@]}" | jq -s 'sort | .[length/2|floor]')
	printf '%-12s %28.1f %22.3f %14.0f\n' "$mode" "$cpu" "$ratio" "$rps"
done | tee "$out/tracing-overhead.txt"
