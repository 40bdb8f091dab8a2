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

// podWorkers builds the records of one ready pod, one per active target
// port.
func podWorkers(pod *corev1.Pod, poolPorts []int32, m Mapping) []catalog.Record {
	c := readPodConfig(pod, poolPorts, m)
	out := make([]catalog.Record, 0, len(c.active))
	for idx, port := range poolPorts {
		if slices.Contains(c.active, port) {
			out = append(out, c.record(pod, idx, port))
		}
	}
	return out
}

// podAnnotations reads a pod's annotations, else its labels of the same key,
// and collects the problems that make its workers incomplete.
type podAnnotations struct {
	pod     *corev1.Pod
	reasons []string
}

func (a *podAnnotations) bad(format string, args ...any) {
	a.reasons = append(a.reasons, fmt.Sprintf(format, args...))
}

func (a *podAnnotations) get(key string) (string, bool) {
	if v, ok := a.pod.Annotations[key]; ok {
		return strings.TrimSpace(v), true
	}
	v, ok := a.pod.Labels[key]
	return strings.TrimSpace(v), ok
}

// num reads an integer from min to max: def when the key is absent (ok
// false), def and a problem when it does not parse (ok true).
func (a *podAnnotations) num(key string, def, min, max uint64) (n uint64, ok bool) {
	v, ok := a.get(key)
	if !ok {
		return def, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < min || n > max {
		a.bad("annotation %s %q: want an integer from %d to %d", key, v, min, max)
		return def, true
	}
	return n, true
}

// podConfig is what a pod's annotations and labels say about its workers,
// read once for all its target ports. A has* flag says the key was set,
// even to a value that did not parse (the value is then the default, and
// reasons says why).
type podConfig struct {
	reasons                    []string
	model, group, role, ip     string
	blockSize, dpSize, dpStart uint64
	kvPort                     uint64
	subscribe                  bool // KV events from the pod's own PUB sockets (else the collector's)
	topic                      string
	replayPort                 uint64 // 0: no replay
	metricsPort                uint64
	hasMetricsPort             bool
	engine                     string
	hasEngine                  bool
	maxTokens, totalBlocks     uint64
	hasMaxTokens, hasTotal     bool
	baseID                     uint64
	hasID                      bool
	active                     []int32 // the target ports the pod serves on
}

func readPodConfig(pod *corev1.Pod, poolPorts []int32, m Mapping) podConfig {
	a := &podAnnotations{pod: pod}
	var c podConfig
	model, ok := a.get(AnnotationModel)
	if !ok || model == "" {
		a.bad("annotation %s is missing: set it to the model name the engine serves (vLLM --served-model-name)", AnnotationModel)
	}
	c.model = model
	c.group, _ = a.get(AnnotationRoutingGroup)
	var roleProblem string
	if c.role, roleProblem = podRole(pod, a.get); roleProblem != "" {
		a.bad("%s", roleProblem)
	}
	c.blockSize, _ = a.num(AnnotationBlockSize, DefaultBlockSize, 1, 1<<31)
	c.dpSize, _ = a.num(AnnotationDPSize, 1, 1, 1024)
	c.dpStart, _ = a.num(AnnotationDPStartRank, 0, 0, 1<<20)
	kvPort, hasKVPort := a.num(AnnotationKVEventsPort, DefaultKVEventsPort, 1, 65535)
	c.kvPort, c.subscribe = kvPort, hasKVPort || !m.Collector
	c.topic, _ = a.get(AnnotationKVEventsTopic)
	c.replayPort, _ = a.num(AnnotationReplayPort, 0, 1, 65535)
	c.metricsPort, c.hasMetricsPort = a.num(AnnotationMetricsPort, 0, 1, 65535)
	c.engine, c.hasEngine = a.get(AnnotationEngine)
	if c.hasEngine && !slices.Contains(catalog.Engines, c.engine) {
		a.bad("annotation %s %q: want one of %s", AnnotationEngine, c.engine, strings.Join(catalog.Engines, ", "))
		c.hasEngine = false
	}
	c.maxTokens, c.hasMaxTokens = a.num(AnnotationMaxBatchedTokens, 0, 1, 1<<40)
	c.totalBlocks, c.hasTotal = a.num(AnnotationTotalKVBlocks, 0, 1, 1<<40)
	c.baseID, c.hasID = a.num(AnnotationWorkerID, 0, 1, 1<<63-1)
	c.active = poolPorts
	if v, ok := pod.Annotations[AnnotationActivePorts]; ok {
		if sel, err := parseActivePorts(v, poolPorts); err != nil {
			a.bad("annotation %s %q: %v", AnnotationActivePorts, v, err)
		} else {
			c.active = sel
		}
	}
	if c.ip = pod.Status.PodIP; c.ip == "" {
		a.bad("pod has no IP address yet")
	}
	c.reasons = a.reasons
	return c
}

// record is the worker behind the pod's idx-th pool target port.
func (c *podConfig) record(pod *corev1.Pod, idx int, port int32) catalog.Record {
	r := catalog.Record{
		WorkerID:        WorkerID(pod.Namespace, pod.Name, port),
		ModelName:       c.model,
		RoutingGroup:    c.group,
		BlockSize:       ptr(uint32(c.blockSize)),
		StableRoutingID: ptr(fmt.Sprintf("%s/%s:%d", pod.Namespace, pod.Name, port)),
		SourceReasons:   slices.Clone(c.reasons),
	}
	if c.role != "" {
		// A prefill pod without a routing-group annotation joins the
		// service's prefill group (catalog.Record.ResolveRole).
		r.Role = ptr(c.role)
	}
	if c.hasID {
		r.WorkerID = (c.baseID + uint64(idx)) & (1<<63 - 1)
	}
	start := c.dpStart + uint64(idx)*c.dpSize
	r.DataParallelStartRank = ptr(uint32(start))
	r.DataParallelSize = ptr(uint32(c.dpSize))
	if c.hasMaxTokens {
		r.MaxNumBatchedTokens = ptr(c.maxTokens)
	}
	if c.hasTotal {
		r.TotalKVBlocks = ptr(c.totalBlocks)
	}
	if c.topic != "" {
		r.KVEventsTopic = ptr(c.topic)
	}
	if c.hasEngine {
		r.Engine = ptr(c.engine)
	}
	if c.ip == "" {
		return r
	}
	if c.hasMetricsPort {
		r.MetricsEndpoint = ptr("http://" + net.JoinHostPort(c.ip, strconv.Itoa(int(c.metricsPort))) + "/metrics")
	}
	r.Endpoint = ptr("http://" + net.JoinHostPort(c.ip, strconv.Itoa(int(port))))
	if c.subscribe {
		c.kvEvents(&r, start)
	}
	return r
}

// kvEvents sets the ZMQ endpoints of the ranks from start that r's engine
// publishes KV events on (port kvPort + rank), and its replay endpoint.
func (c *podConfig) kvEvents(r *catalog.Record, start uint64) {
	r.KVEventsEndpoints = make(map[uint32]string, c.dpSize)
	for rank := start; rank < start+c.dpSize; rank++ {
		p := c.kvPort + rank
		if p > 65535 {
			r.SourceReasons = append(r.SourceReasons, fmt.Sprintf("KV events port %d + dp_rank %d is past 65535", c.kvPort, rank))
			r.KVEventsEndpoints = nil
			break
		}
		r.KVEventsEndpoints[uint32(rank)] = "tcp://" + net.JoinHostPort(c.ip, strconv.FormatUint(p, 10))
	}
	if c.replayPort == 0 {
		return
	}
	// The replay protocol carries no rank, so Dynamo accepts a replay
	// endpoint only for a single-rank worker: a multi-rank worker with one
	// is left for the catalog to flag.
	if p := c.replayPort + start; p <= 65535 {
		r.ReplayEndpoint = ptr("tcp://" + net.JoinHostPort(c.ip, strconv.FormatUint(p, 10)))
	} else {
		r.SourceReasons = append(r.SourceReasons, fmt.Sprintf("replay port %d + dp_rank %d is past 65535", c.replayPort, start))
	}
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
