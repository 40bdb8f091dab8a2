package inferencepool

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
	corev1 "k8s.io/api/core/v1"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvselect/kvselect/selection/catalog"
)

// Pod annotations (or labels, where the value fits a label) that describe a
// model server to kvselect. Annotations win over labels of the same key.
const (
	Prefix = "kvselect.io/"

	// AnnotationModel is the model name the engine serves (vLLM
	// --served-model-name): the partition requests are matched against.
	// Required: without it the worker is incomplete.
	AnnotationModel = Prefix + "model"
	// AnnotationRoutingGroup is the routing group; default "default".
	AnnotationRoutingGroup = Prefix + "routing-group"
	// AnnotationBlockSize is the engine's KV block size in tokens (vLLM
	// --block-size); default 16, vLLM's default.
	AnnotationBlockSize = Prefix + "block-size"
	// AnnotationDPSize is how many data-parallel ranks sit behind one target
	// port (vLLM --data-parallel-size with internal load balancing); default 1.
	AnnotationDPSize = Prefix + "data-parallel-size"
	// AnnotationDPStartRank is the first global rank behind the pool's first
	// target port; the i-th target port starts at start + i × size. Default 0,
	// so with one rank per port (vLLM external DP load balancing, GIE's
	// data-parallel pools) port i is rank i.
	AnnotationDPStartRank = Prefix + "data-parallel-start-rank"
	// AnnotationKVEventsPort is the ZMQ PUB port of rank 0's KV events
	// (vLLM --kv-events-config endpoint tcp://*:5557); rank r publishes on
	// port + r, as vLLM offsets its publisher by the data-parallel rank.
	// Default 5557, unless kvselect binds a collector (--kv-events-bind):
	// then a pod without it is fed through the collector, its engine dialing
	// kvselect with llm-d's topic kv@<pod-ip>:<target-port>@<model>.
	AnnotationKVEventsPort = Prefix + "kv-events-port"
	// AnnotationKVEventsTopic is the topic a pod's engine publishes under
	// when it dials the collector with a topic of its own (kv_events_topic);
	// optional, llm-d's convention is matched without it.
	AnnotationKVEventsTopic = Prefix + "kv-events-topic"
	// AnnotationEngine names the pod's inference engine, which decides the
	// metric names its Prometheus endpoint is read with: vllm (default),
	// sglang or trtllm.
	AnnotationEngine = Prefix + "engine"
	// AnnotationMetricsPort is the port of the pod's Prometheus metrics
	// (http://<pod-ip>:<port>/metrics) when they are not served on the
	// target port; optional.
	AnnotationMetricsPort = Prefix + "metrics-port"
	// AnnotationReplayPort is the ZMQ ROUTER port of rank 0's KV-event replay
	// (vLLM --kv-events-config replay_endpoint); rank r answers on port + r.
	// Optional: without it gaps are not replayed.
	AnnotationReplayPort = Prefix + "replay-port"
	// AnnotationMaxBatchedTokens is max_num_batched_tokens (vLLM
	// --max-num-batched-tokens); required only when queueing is enabled.
	AnnotationMaxBatchedTokens = Prefix + "max-num-batched-tokens"
	// AnnotationTotalKVBlocks is total_kv_blocks, the capacity for
	// decode_busy; optional.
	AnnotationTotalKVBlocks = Prefix + "total-kv-blocks"
	// AnnotationWorkerID pins the worker id of the pool's first target port;
	// the i-th port gets id + i. Optional: ids are derived otherwise (WorkerID).
	AnnotationWorkerID = Prefix + "worker-id"

	// AnnotationRole is the worker's part in disaggregated prefill/decode
	// serving, in kvselect's words: prefill, decode or both (the default).
	// LabelRole, llm-d's label, says the same; when both are set they must
	// agree. A prefill pod joins the prefill routing group unless
	// kvselect.io/routing-group names another (which is a conflict: the
	// worker is incomplete).
	AnnotationRole = Prefix + "role"

	// LabelRole is llm-d's role label (the value set its P/D guides put on
	// vLLM pods and its scheduler's by-label role filters read):
	// prefill, decode, prefill-decode, both (deprecated), and the encode
	// stages encode, encode-prefill and encode-prefill-decode.
	LabelRole = "llm-d.ai/role"

	// AnnotationActivePorts is GIE's: a comma-separated subset of the pool's
	// target ports that this pod serves on. Absent means all of them.
	AnnotationActivePorts = "inference.networking.k8s.io/active-ports"
)

// Defaults of the optional annotations (vLLM's).
const (
	DefaultBlockSize    = 16
	DefaultKVEventsPort = 5557
)

// WorkerID is the derived id of the worker serving namespace/pod on port: the
// low 63 bits of xxh3-64 of "<namespace>/<pod>/<port>" (never 0). It depends
// only on names, so a pod that restarts in place, or a StatefulSet pod that is
// recreated under its name, keeps its id; 63 bits keep it positive for clients
// that read ids as signed 64-bit integers.
func WorkerID(namespace, pod string, port int32) uint64 {
	id := xxh3.HashString(namespace+"/"+pod+"/"+strconv.FormatInt(int64(port), 10)) & (1<<63 - 1)
	if id == 0 {
		id = 1
	}
	return id
}

// IsReady reports whether a pod should serve: condition Ready=True and not
// being deleted (the rule GIE's endpoint pickers apply).
func IsReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Workers maps a pool and its pods to worker records: one per ready pod ×
// active target port. Pods must already match the pool's selector; pods that
// are not ready are skipped. A pod whose annotations do not parse still yields
// its workers, incomplete, with the problem in SourceReasons. The result is
// sorted by (namespace, pod, port) and its ids are unique.
func Workers(pool *giev1.InferencePool, pods []corev1.Pod) []catalog.Record {
	return WorkersFor(pool, pods, Mapping{})
}

// Mapping is what the records depend on besides the pool and its pods.
type Mapping struct {
	// Collector: kvselect binds a KV events collector (--kv-events-bind), so a
	// pod without the kv-events-port annotation gets no kv_events_endpoints
	// and is fed through the collector by its topic.
	Collector bool
}

// WorkersFor is Workers under the given mapping.
func WorkersFor(pool *giev1.InferencePool, pods []corev1.Pod, m Mapping) []catalog.Record {
	ports := make([]int32, 0, len(pool.Spec.TargetPorts))
	for _, p := range pool.Spec.TargetPorts {
		ports = append(ports, int32(p.Number))
	}
	sorted := slices.Clone(pods)
	slices.SortFunc(sorted, func(a, b corev1.Pod) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var out []catalog.Record
	owner := map[uint64]string{} // id → "pod port" that took it
	for i := range sorted {
		pod := &sorted[i]
		if !IsReady(pod) {
			continue
		}
		for _, w := range podWorkers(pod, ports, m) {
			where := fmt.Sprintf("pod %s/%s port %s", pod.Namespace, pod.Name, portOf(w))
			if prev, taken := owner[w.WorkerID]; taken {
				// Two pods claim one id (a copied worker-id annotation): the
				// first in name order keeps it; this one gets its derived id
				// and stays incomplete until the conflict is fixed.
				w.SourceReasons = append(w.SourceReasons, fmt.Sprintf("worker id %d is already used by %s", w.WorkerID, prev))
				w.WorkerID = freeID(pod, portNumber(w), owner)
			}
			owner[w.WorkerID] = where
			out = append(out, w)
		}
	}
	return out
}

// freeID is the pod's derived id for port, re-hashed past any id in use.
func freeID(pod *corev1.Pod, port int32, used map[uint64]string) uint64 {
	id := WorkerID(pod.Namespace, pod.Name, port)
	for n := 1; ; n++ {
		if _, taken := used[id]; !taken {
			return id
		}
		id = WorkerID(pod.Namespace, pod.Name+"#"+strconv.Itoa(n), port)
	}
}

// podWorkers builds the records of one ready pod.
func podWorkers(pod *corev1.Pod, poolPorts []int32, m Mapping) []catalog.Record {
	var reasons []string
	bad := func(format string, args ...any) { reasons = append(reasons, fmt.Sprintf(format, args...)) }
	get := func(key string) (string, bool) {
		if v, ok := pod.Annotations[key]; ok {
			return strings.TrimSpace(v), true
		}
		v, ok := pod.Labels[key]
		return strings.TrimSpace(v), ok
	}
	num := func(key string, def, min, max uint64) (uint64, bool) {
		v, ok := get(key)
		if !ok {
			return def, false
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n < min || n > max {
			bad("annotation %s %q: want an integer from %d to %d", key, v, min, max)
			return def, true
		}
		return n, true
	}

	model, ok := get(AnnotationModel)
	if !ok || model == "" {
		bad("annotation %s is missing: set it to the model name the engine serves (vLLM --served-model-name)", AnnotationModel)
	}
	group, _ := get(AnnotationRoutingGroup)
	role, roleProblem := podRole(pod, get)
	if roleProblem != "" {
		bad("%s", roleProblem)
	}
	blockSize, _ := num(AnnotationBlockSize, DefaultBlockSize, 1, 1<<31)
	dpSize, _ := num(AnnotationDPSize, 1, 1, 1024)
	dpStart, _ := num(AnnotationDPStartRank, 0, 0, 1<<20)
	kvPort, hasKVPort := num(AnnotationKVEventsPort, DefaultKVEventsPort, 1, 65535)
	subscribe := hasKVPort || !m.Collector
	topic, hasTopic := get(AnnotationKVEventsTopic)
	replayPort, hasReplay := num(AnnotationReplayPort, 0, 1, 65535)
	metricsPort, hasMetricsPort := num(AnnotationMetricsPort, 0, 1, 65535)
	engine, hasEngine := get(AnnotationEngine)
	if hasEngine && !slices.Contains(catalog.Engines, engine) {
		bad("annotation %s %q: want one of %s", AnnotationEngine, engine, strings.Join(catalog.Engines, ", "))
		hasEngine = false
	}
	maxTokens, hasMaxTokens := num(AnnotationMaxBatchedTokens, 0, 1, 1<<40)
	totalBlocks, hasTotalBlocks := num(AnnotationTotalKVBlocks, 0, 1, 1<<40)
	baseID, hasID := num(AnnotationWorkerID, 0, 1, 1<<63-1)

	active := poolPorts
	if v, ok := pod.Annotations[AnnotationActivePorts]; ok {
		sel, err := parseActivePorts(v, poolPorts)
		if err != nil {
			bad("annotation %s %q: %v", AnnotationActivePorts, v, err)
		} else {
			active = sel
		}
	}
	ip := pod.Status.PodIP
	if ip == "" {
		bad("pod has no IP address yet")
	}

	out := make([]catalog.Record, 0, len(active))
	for idx, port := range poolPorts {
		if !slices.Contains(active, port) {
			continue
		}
		r := catalog.Record{
			WorkerID:        WorkerID(pod.Namespace, pod.Name, port),
			ModelName:       model,
			RoutingGroup:    group,
			BlockSize:       ptr(uint32(blockSize)),
			StableRoutingID: ptr(fmt.Sprintf("%s/%s:%d", pod.Namespace, pod.Name, port)),
			SourceReasons:   slices.Clone(reasons),
		}
		if role != "" {
			// A prefill pod without a routing-group annotation joins the
			// service's prefill group (catalog.Record.ResolveRole).
			r.Role = ptr(role)
		}
		if hasID {
			r.WorkerID = (baseID + uint64(idx)) & (1<<63 - 1)
		}
		start := dpStart + uint64(idx)*dpSize
		r.DataParallelStartRank = ptr(uint32(start))
		r.DataParallelSize = ptr(uint32(dpSize))
		if hasMaxTokens {
			r.MaxNumBatchedTokens = ptr(maxTokens)
		}
		if hasTotalBlocks {
			r.TotalKVBlocks = ptr(totalBlocks)
		}
		if hasTopic && topic != "" {
			r.KVEventsTopic = ptr(topic)
		}
		if hasEngine {
			r.Engine = ptr(engine)
		}
		if hasMetricsPort && ip != "" {
			r.MetricsEndpoint = ptr("http://" + net.JoinHostPort(ip, strconv.Itoa(int(metricsPort))) + "/metrics")
		}
		if ip != "" {
			r.Endpoint = ptr("http://" + net.JoinHostPort(ip, strconv.Itoa(int(port))))
		}
		if ip != "" && subscribe {
			r.KVEventsEndpoints = make(map[uint32]string, dpSize)
			for rank := start; rank < start+dpSize; rank++ {
				p := kvPort + rank
				if p > 65535 {
					r.SourceReasons = append(r.SourceReasons, fmt.Sprintf("KV events port %d + dp_rank %d is past 65535", kvPort, rank))
					r.KVEventsEndpoints = nil
					break
				}
				r.KVEventsEndpoints[uint32(rank)] = "tcp://" + net.JoinHostPort(ip, strconv.FormatUint(p, 10))
			}
			if hasReplay && replayPort != 0 {
				// The replay protocol carries no rank, so Dynamo accepts a
				// replay endpoint only for a single-rank worker: a multi-rank
				// worker with one is left for the catalog to flag.
				if p := replayPort + start; p <= 65535 {
					r.ReplayEndpoint = ptr("tcp://" + net.JoinHostPort(ip, strconv.FormatUint(p, 10)))
				} else {
					r.SourceReasons = append(r.SourceReasons, fmt.Sprintf("replay port %d + dp_rank %d is past 65535", replayPort, start))
				}
			}
		}
		out = append(out, r)
	}
	return out
}

// llmdRoles maps llm-d's role label values to kvselect's roles. An encode
// stage before prefill changes nothing for text routing; an encode-only pod
// serves no text and is not mapped.
var llmdRoles = map[string]string{
	"prefill": catalog.RolePrefill, "encode-prefill": catalog.RolePrefill,
	"decode":         catalog.RoleDecode,
	"prefill-decode": catalog.RoleBoth, "both": catalog.RoleBoth, "encode-prefill-decode": catalog.RoleBoth,
}

// podRole is the pod's role from kvselect's annotation and llm-d's label
// ("" when neither is set), or a problem that makes the worker incomplete.
func podRole(pod *corev1.Pod, get func(string) (string, bool)) (role, problem string) {
	own, hasOwn := get(AnnotationRole)
	if hasOwn && !slices.Contains(catalog.Roles, own) {
		return "", fmt.Sprintf("annotation %s %q: want one of %s", AnnotationRole, own, strings.Join(catalog.Roles, ", "))
	}
	label, hasLabel := pod.Labels[LabelRole]
	label = strings.TrimSpace(label)
	mapped, known := llmdRoles[label]
	switch {
	case hasLabel && label == "encode":
		return "", fmt.Sprintf("label %s=encode: an encode-only pod serves no text prompts", LabelRole)
	case hasLabel && !known:
		return "", fmt.Sprintf("label %s %q: want prefill, decode, prefill-decode or both (or an encode- stage)", LabelRole, label)
	case hasOwn && hasLabel && own != mapped:
		return "", fmt.Sprintf("annotation %s %q conflicts with label %s %q", AnnotationRole, own, LabelRole, label)
	case hasOwn:
		return own, ""
	case hasLabel:
		return mapped, ""
	}
	return "", ""
}

// parseActivePorts reads GIE's active-ports annotation: target ports the pod
// serves on, comma-separated. Ports outside the pool are ignored, as GIE does.
func parseActivePorts(v string, poolPorts []int32) ([]int32, error) {
	var out []int32
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a port", f)
		}
		if slices.Contains(poolPorts, int32(n)) && !slices.Contains(out, int32(n)) {
			out = append(out, int32(n))
		}
	}
	return out, nil
}

func portOf(r catalog.Record) string {
	s := deref(r.StableRoutingID)
	return s[strings.LastIndexByte(s, ':')+1:]
}

func portNumber(r catalog.Record) int32 {
	n, _ := strconv.ParseInt(portOf(r), 10, 32)
	return int32(n)
}

func ptr[T any](v T) *T { return &v }

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
