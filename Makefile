# kvselect — see README.md. Every target runs from a fresh clone with only Go.
GO       ?= go
PKGS     := ./...
BENCHOUT := bench/out

# go-control-plane's vtprotobuf marshal code (the Envoy messages' generated
# encoders) compiles only under this tag; internal/vtcodec uses it for the
# ext_proc picker's messages and falls back to protobuf-go without it. Every
# go command below — and the scripts they start — builds with it.
export GOFLAGS += -tags=vtprotobuf

.PHONY: all build test conformance-rest test-short vet fmt-check bench bench-index bench-peer fuzz demo clean

all: build test

build:
	$(GO) build -o bin/ ./cmd/...

# The default test run (README, .ci/run): formatting, vet, staticcheck,
# race-enabled unit and property tests (internal/layout's among them: the
# folder rules), the side-by-side bench module's tests, the black-box suites
# (kvselect behind NGINX Gateway Fabric among them) and a short fuzz of every
# network decoder.
test: fmt-check vet staticcheck
	$(GO) test -race -count=1 -skip '^(TestObserveCommand|TestNGF.*)$$' $(PKGS)
	$(MAKE) test-observe
	$(MAKE) conformance-gateways
	cd bench/peer && $(GO) vet ./... && $(GO) test -count=1 ./...
	$(MAKE) conformance-rest
	$(MAKE) conformance-epp
	$(MAKE) fuzz-smoke

# The observability stack against a live run (kvbench observe: kvselect and
# mock workers, a real Prometheus, headless Chromium), alone: it runs six
# processes, which next to the parallel package tests would starve them.
.PHONY: test-observe
test-observe:
	$(GO) test -count=1 -run '^TestObserveCommand$$' ./bench/observe

# Soak and chaos (bench/soak, docs/reliability.md): three kvselect replicas,
# eight mock workers and, with KVSELECT_LLMD_SIM, an llm-d-inference-sim,
# under traffic on both fronts and a seeded schedule of worker, publisher,
# replica and client faults; fails when an invariant breaks. soak is the
# hour (plus a 5-minute fault-free baseline); soak-short the 3-minute version
# .ci/run runs.
.PHONY: soak soak-short
soak: build
	bin/kvbench soak -out $(BENCHOUT)/soak

soak-short: build
	bin/kvbench soak -short -out $(BENCHOUT)/soak-short

# kvselect behind a real non-Envoy gateway (conformance/gateways,
# docs/gateways.md): Debian's NGINX with njs running NGINX Gateway Fabric's
# epp.js and shim (KVSELECT_NGF_SHIM_DIR), mock workers and, with
# KVSELECT_LLMD_SIM, llm-d-inference-sim. Alone and without -race: the shim's
# port is fixed (127.0.0.1:54800), so its tests run one at a time, and the
# parallel package run in `test` skips them (TestNGF*), and the demo's own
# NGINX test (bench/demo's TestNGFDemoBothPaths) runs after the suite, not
# beside it. -v: a skip shows its reason.
.PHONY: conformance-gateways
conformance-gateways:
	$(GO) test -count=1 -v ./conformance/gateways
	$(GO) test -count=1 -v -run '^TestNGF' ./bench/demo

# The black-box REST suite against a real kvselect process on loopback.
conformance-rest:
	./conformance/run-rest.sh

# The black-box EPP (ext_proc, GIE protocol 004) suite against real kvselect
# processes on loopback.
.PHONY: conformance-epp
conformance-epp:
	./conformance/run-epp.sh

test-short:
	$(GO) test -count=1 $(PKGS)

vet:
	$(GO) vet $(PKGS)

# staticcheck, pinned, from the Go module proxy (built once, then cached).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: staticcheck
staticcheck:
	$(GO) run $(STATICCHECK) $(PKGS)
	cd bench/peer && $(GO) run $(STATICCHECK) ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Micro-benchmarks with allocation counts; compare runs with benchstat.
bench:
	mkdir -p $(BENCHOUT)
	$(GO) test -run '^$$' -bench . -skip Memory10M -benchmem -count 6 ./selection/... ./engines/... ./replicas/... | tee $(BENCHOUT)/micro.txt
	$(GO) test -run '^$$' -bench Memory10M -benchtime 1x ./selection/index | tee $(BENCHOUT)/memory.txt
	$(MAKE) bench-peer

# KV events through real sockets in both topologies, same run: engines bound
# and dialed by kvselect (subscribe) vs engines dialing kvselect's collector.
# The two modes alternate, 8 rounds, so that whatever else the machine does
# falls on both; benchstat puts them side by side.
.PHONY: bench-ingest
bench-ingest:
	mkdir -p $(BENCHOUT)
	$(GO) test -c -o $(BENCHOUT)/kvlisten.test ./engines/kvlisten
	rm -f $(BENCHOUT)/ingest.txt
	for i in 1 2 3 4 5 6 7 8; do for m in subscribe collector; do \
		$(BENCHOUT)/kvlisten.test -test.run '^$$' -test.bench "Ingest/mode=$$m/publishers=/lanes=4" \
			-test.benchtime 40000x | grep '^Benchmark' | tee -a $(BENCHOUT)/ingest.txt; \
	done; done
	$(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da -col /mode $(BENCHOUT)/ingest.txt

# Mooncake trace replay against kvselect's index and, in the same run, against
# llm-d-kv-cache-manager's in-memory index (nested module, not in go.mod).
bench-peer:
	mkdir -p $(BENCHOUT)
	cd bench/peer && $(GO) run . -workers 16 -blocks 4096 -json ../out/peer-evicting.json | tee ../out/peer-evicting.txt
	cd bench/peer && $(GO) run . -workers 64 -blocks 16384 -dup 4 -json ../out/peer-large.json | tee ../out/peer-large.txt

# The fleet curve (docs/scale.md), in process: selection on one core from 64
# to 16,384 engine ranks with an index fed through the KV-event decoder,
# ingest CPU per engine, and the replica mesh from 1 to 8 replicas at 1k-20k
# requests/s. Tables on stdout, scale.json and one SVG per curve in
# bench/out/scale. About 4 minutes on 2 cores; not part of `make test`.
.PHONY: scale
scale:
	mkdir -p $(BENCHOUT)/scale
	$(GO) run ./cmd/kvbench scale -out $(BENCHOUT)/scale | tee $(BENCHOUT)/scale/scale.txt

# Closed-loop HTTP load on the REST API (select_and_reserve + delete) against an
# in-process server on 127.0.0.1, for both prompt forms.
# What REST authentication and TLS cost, side by side in one run
# (docs/benchmarks.md "Authentication and TLS").
.PHONY: bench-rest-auth
bench-rest-auth:
	mkdir -p $(BENCHOUT)
	$(GO) run ./cmd/kvbench rest -auth off,token,tls,tls+token -rounds 5 -duration 10s -warmup 2s -json $(BENCHOUT)/rest-auth.json | tee $(BENCHOUT)/rest-auth.txt

.PHONY: bench-rest
bench-rest:
	mkdir -p $(BENCHOUT)
	$(GO) run ./cmd/kvbench rest -clients 32 -workers 64 -duration 10s -prompt tokens -json $(BENCHOUT)/rest-tokens.json | tee $(BENCHOUT)/rest-tokens.txt
	$(GO) run ./cmd/kvbench rest -clients 32 -workers 64 -duration 10s -prompt hashes -json $(BENCHOUT)/rest-hashes.json | tee $(BENCHOUT)/rest-hashes.txt

# The picker's throughput as deployed: kvselect on CPU 0, the Envoy-side load
# generator on CPU 1, each GOMAXPROCS=1 (docs/benchmarks.md). RUNS=3.
.PHONY: bench-extproc-pinned
bench-extproc-pinned:
	BENCHOUT=$(BENCHOUT) ./bench/extproc-pinned.sh

# What OpenTelemetry tracing costs the picker: the pinned setup above with
# tracing off, sampled out, 1 in 10 and every trace, exporting to a real
# OTLP receiver (docs/observability.md).
.PHONY: bench-tracing
bench-tracing:
	BENCHOUT=$(BENCHOUT) ROUNDS=5 ./bench/tracing-overhead.sh

# The observability stack against a live run: a real Prometheus (Debian's
# prometheus) scraping kvselect and mock workers with the alert rules loaded,
# every Grafana dashboard query checked, the status page in headless Chromium
# (Debian's chromium); screenshots in bench/out/observe (docs/observability.md).
.PHONY: observe
observe:
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench observe -requests 4000 -compress 15 -out $(BENCHOUT)/observe

# kvbench route's bypass scenario (docs/benchmarks.md, "Engine metrics:
# traffic that bypasses kvselect"): 30 % of the trace straight to 2 of 8
# workers, kv-cost with and without engine metrics, at 1x, 1.5x and 2x load.
.PHONY: bench-route-bypass
bench-route-bypass:
	mkdir -p $(BENCHOUT)
	for s in 1 1.5 2; do \
		$(GO) run ./cmd/kvbench route -quiet -policies kv-cost -capacity 16384,4096 -speedup $$s \
			-bypass 0,0.3 -bypass-workers 2 -engine-metrics off,on -engine-request-weight 0,2,4,8,16,32 \
			-json $(BENCHOUT)/route-bypass-$$s.json | tee $(BENCHOUT)/route-bypass-$$s.txt || exit 1; \
	done

# Per-request overhead of the ext_proc picker (headers + 4 KB body + response
# headers + 20 streamed chunks), 64 concurrent streams, and the same lifecycle
# over REST (docs/extproc.md).
.PHONY: bench-extproc
bench-extproc:
	mkdir -p $(BENCHOUT)
	$(GO) run ./cmd/kvbench extproc -streams 64 -duration 10s -json $(BENCHOUT)/extproc.json | tee $(BENCHOUT)/extproc.txt
	$(GO) run ./cmd/kvbench extproc -streams 64 -duration 10s -rate 1000 -json $(BENCHOUT)/extproc-1k.json | tee $(BENCHOUT)/extproc-1k.txt
	$(GO) run ./cmd/kvbench extproc -front rest -streams 64 -duration 10s -json $(BENCHOUT)/extproc-rest.json | tee $(BENCHOUT)/extproc-rest.txt

# The demo (README's "run it"): builds, starts kvselect and 4 mock workers on
# loopback, replays a slice of the Mooncake conversation trace through the
# ext_proc picker and then round-robin, prints the table and writes
# bench/out/demo/demo.{json,svg}. DEMO_ARGS go to kvbench demo, e.g.
# make demo-nginx DEMO_ARGS='-rate 60' sends the requests evenly spaced.
DEMO_ARGS ?=
demo:
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench demo $(DEMO_ARGS) -out $(BENCHOUT)/demo

# The demo with a third phase through NGINX Gateway Fabric's endpoint-picker
# path (bench/ngf, docs/gateways.md): NGINX running NGF's epp.js, NGF's shim on
# its fixed 127.0.0.1:54800, kvselect's picker; one table, a row per path.
# DEMO_ARGS='-gateway-floor' adds the floor picker on both paths: what NGINX's
# path adds to a picker that does nothing.
# Needs KVSELECT_NGF_SHIM_DIR and nginx-light + libnginx-mod-http-js.
.PHONY: demo-nginx
demo-nginx:
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench demo -gateway nginx $(DEMO_ARGS) -out $(BENCHOUT)/demo-nginx

# The demo over a third-party engine: llm-d-inference-sim processes whose KV
# events dial kvselect's collector (--kv-events-bind). Needs KVSELECT_LLMD_SIM.
.PHONY: demo-llmd-sim
demo-llmd-sim:
	@if [ -z "$$KVSELECT_LLMD_SIM" ]; then \
		echo "demo-llmd-sim: skipped: set KVSELECT_LLMD_SIM to an llm-d-inference-sim binary (github.com/llm-d/llm-d-inference-sim)"; \
	else \
		$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvbench && \
		bin/kvbench demo -engine-family llmd-sim -out $(BENCHOUT)/demo-llmd-sim; \
	fi

# kvselect's picker and llm-d's endpoint picker side by side: same engines,
# same trace, plaintext and TLS (docs/vs-epp.md). Needs KVSELECT_LLMD_SIM and
# KVSELECT_LLMD_EPP.
.PHONY: bench-vs-epp
bench-vs-epp:
	@if [ -z "$$KVSELECT_LLMD_SIM" ] || [ -z "$$KVSELECT_LLMD_EPP" ]; then \
		echo "bench-vs-epp: skipped: set KVSELECT_LLMD_SIM and KVSELECT_LLMD_EPP (docs/vs-epp.md)"; \
	else \
		$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench && \
		bin/kvbench vs-epp -transports plain,tls -out $(BENCHOUT)/vs-epp; \
	fi

# The same comparison over kvselect's mock workers (needs only the EPP).
.PHONY: bench-vs-epp-mock
bench-vs-epp-mock:
	@if [ -z "$$KVSELECT_LLMD_EPP" ]; then \
		echo "bench-vs-epp-mock: skipped: set KVSELECT_LLMD_EPP (docs/vs-epp.md)"; \
	else \
		$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench && \
		bin/kvbench vs-epp -engine-family mock -transports plain,tls -out $(BENCHOUT)/vs-epp-mock; \
	fi

# Every picker over every cell: workloads × engine families × engine shapes,
# the first cell three times for the run-to-run spread (docs/selection.md,
# "predicted-latency"). Needs KVSELECT_LLMD_SIM and KVSELECT_LLMD_EPP; about
# an hour and a half on two cores.
.PHONY: bench-suite
bench-suite:
	@if [ -z "$$KVSELECT_LLMD_SIM" ] || [ -z "$$KVSELECT_LLMD_EPP" ]; then \
		echo "bench-suite: skipped: set KVSELECT_LLMD_SIM and KVSELECT_LLMD_EPP (docs/vs-epp.md)"; \
	else \
		$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench && \
		bin/kvbench suite -quiet -out $(BENCHOUT)/suite | tee $(BENCHOUT)/suite.txt; \
	fi

# Text prompts (docs/extproc.md "Exact routing for text"): a seeded multi-turn
# chat workload through the ext_proc picker on 4 mock workers, routed on the
# engine's ids, --tokenize pool, the approximate text index and round-robin.
.PHONY: bench-text
bench-text:
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench text -sessions 160 -concurrency 24 -pool-blocks 512 -prefill-time-per-token 1ms \
		-phases tokens,pool,text,round-robin,pool-warm,pool-completions,pool-forward -out $(BENCHOUT)/text

# Engine truth on real processes (docs/benchmarks.md, "Engine metrics and
# health on real processes"): kvselect and 4 mock workers, one failing every
# request mid-run (ejection, trials, restoration); then direct traffic that
# bypasses kvselect, with engine metrics off and on.
# Disaggregated prefill/decode: aggregated vs always-remote vs conditional P/D
# (docs/disaggregation.md), in the simulation and with real processes.
.PHONY: bench-pd
bench-pd:
	mkdir -p $(BENCHOUT)
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench pd -json $(BENCHOUT)/pd-sim.json | tee $(BENCHOUT)/pd-sim.txt
	bin/kvbench pd -mode real -sessions 60 -speedup 2 -out $(BENCHOUT)/pd -json $(BENCHOUT)/pd-real.json | tee $(BENCHOUT)/pd-real.txt

# Flow control (docs/flow-control.md): a long-prompt and a short-prompt tenant
# on a saturated pool, flow control off vs count vs cost fairness, in the
# simulation and with real processes (about 3 minutes).
.PHONY: bench-flow
bench-flow:
	mkdir -p $(BENCHOUT)
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench flow -json $(BENCHOUT)/flow-sim.json | tee $(BENCHOUT)/flow-sim.txt
	bin/kvbench flow -mode real -duration 60s -out $(BENCHOUT)/flow -json $(BENCHOUT)/flow-real.json | tee $(BENCHOUT)/flow-real.txt

.PHONY: bench-health
bench-health:
	mkdir -p $(BENCHOUT)
	$(GO) build -o bin/ ./cmd/kvselect ./cmd/kvselect-mockworker ./cmd/kvbench
	bin/kvbench health -out $(BENCHOUT)/health -json $(BENCHOUT)/health-eject.json | tee $(BENCHOUT)/health-eject.txt
	bin/kvbench health -fail-worker 0 -direct-rate 60 -healthy 15s -fault 5s -recover 5s -engine-metrics-interval 0,200ms \
		-out $(BENCHOUT)/health -json $(BENCHOUT)/health-bypass.json | tee $(BENCHOUT)/health-bypass.txt

# Every decoder of bytes from the network, as package:FuzzTarget. `make fuzz`
# runs each for FUZZTIME (60s, or a count such as 100000x); `make test` runs
# each briefly (fuzz-smoke).
FUZZ_TARGETS := \
	./engines/kvevents:FuzzDecode \
	./engines/kvevents:FuzzTopic \
	./engines/kvevents:FuzzBatchRank \
	./engines/kvlisten:FuzzLiveMessage \
	./internal/zmqguard:FuzzFrameGuard \
	./selection/index:FuzzDecodeDump \
	./selection:FuzzAppendJSONString \
	./httpadmin:FuzzSelectBody \
	./extproc:FuzzParseBody \
	./extproc:FuzzScanTokenIDs \
	./extproc:FuzzLiftTokenIDs \
	./extproc:FuzzFlowHeaders \
	./extproc:FuzzParseAnthropicBody \
	./extproc:FuzzParseResponsesBody \
	./extproc:FuzzParseGenerateBody \
	./extproc:FuzzTypedStreamEvents \
	./engines/tokenize:FuzzParseResponse \
	./engines/metrics:FuzzParse \
	./internal/vtcodec:FuzzBodyDecoders \
	./replicas/mesh:FuzzDecode \
	./replicas/mesh:FuzzAuthenticate \
	./internal/access:FuzzParseTokens \
	./internal/access:FuzzBearerToken \
	./mockworker/kvpublish:FuzzParseReplayRequest \
	./discovery/workersfile:FuzzParse \
	./mockworker:FuzzCompletionsBody
FUZZTIME ?= 60s

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

# fuzz-smoke counts executions instead of seconds: with a duration, Go
# 1.26's fuzzing coordinator can report the end of -fuzztime itself as a
# failure ("context deadline exceeded", no crasher; golang/go#75804, fixed in
# Go 1.27). 5,000 runs take 0.3-3 s per target on 2 vCPUs.
.PHONY: fuzz-smoke
fuzz-smoke:
	$(MAKE) fuzz FUZZTIME=5000x

# Kubernetes (docs/kubernetes.md): discovery against a real kube-apiserver
# (built once from k8s.io/kubernetes and cached) and Debian's etcd, the Helm
# chart and every manifest applied with server-side dry-run, the Role checked,
# and the GIE conformance suite compiled with kvselect in place of lwepp.
.PHONY: test-kube
test-kube:
	./conformance/kube/run.sh

# GIE's conformance suite on a kind cluster with kvselect as the endpoint
# picker. Needs Docker, kind, kubectl, helm and internet; ARGS are passed on,
# e.g. make conformance-kind ARGS='--gateway kgateway --keep'.
.PHONY: conformance-kind
conformance-kind:
	./conformance/kind/run.sh $(ARGS)

clean:
	rm -rf bin $(BENCHOUT)
