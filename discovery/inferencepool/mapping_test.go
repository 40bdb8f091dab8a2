package inferencepool

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvselect/kvselect/selection/catalog"
)

func pool(ports ...int32) *giev1.InferencePool {
	p := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool"}}
	p.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "vllm"}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, giev1.Port{Number: giev1.PortNumber(n)})
	}
	return p
}

// pod is a ready pod with the given IP and annotations.
func pod(name, ip string, ann map[string]string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": "vllm"}, Annotations: ann},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		}},
	}
}

func model(extra ...string) map[string]string {
	m := map[string]string{AnnotationModel: "llama"}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return m
}

func TestWorkerIDIsDerivedFromNamesOnly(t *testing.T) {
	a := WorkerID("ns", "vllm-0", 8000)
	if a != WorkerID("ns", "vllm-0", 8000) {
		t.Fatal("not deterministic")
	}
	if a>>63 != 0 || a == 0 {
		t.Fatalf("id %d: want 63 bits, non-zero", a)
	}
	for _, other := range []uint64{WorkerID("ns", "vllm-1", 8000), WorkerID("ns", "vllm-0", 8001), WorkerID("ns2", "vllm-0", 8000)} {
		if other == a {
			t.Fatal("different pods or ports share an id")
		}
	}
	// The documented derivation, pinned so a refactor cannot change every
	// deployed worker's id by accident.
	if got := WorkerID("default", "vllm-0", 8000); got != 0x63dd2700a000b0f2 {
		t.Fatalf("derivation changed: %#x", got)
	}
}

func TestWorkersDefaults(t *testing.T) {
	ws := Workers(pool(8000), []corev1.Pod{pod("vllm-0", "10.1.2.3", model())})
	if len(ws) != 1 {
		t.Fatalf("got %d workers", len(ws))
	}
	w := ws[0]
	want := catalog.Record{
		WorkerID:              WorkerID("ns", "vllm-0", 8000),
		ModelName:             "llama",
		Endpoint:              ptr("http://10.1.2.3:8000"),
		BlockSize:             ptr(uint32(16)),
		DataParallelStartRank: ptr(uint32(0)),
		DataParallelSize:      ptr(uint32(1)),
		KVEventsEndpoints:     map[uint32]string{0: "tcp://10.1.2.3:5557"},
		StableRoutingID:       ptr("ns/vllm-0:8000"),
	}
	if !sameRecord(w, want) {
		t.Fatalf("got  %s\nwant %s", show(w), show(want))
	}
}

func TestWorkersFromAnnotations(t *testing.T) {
	tests := []struct {
		name    string
		ports   []int32
		pod     corev1.Pod
		check   func(t *testing.T, ws []catalog.Record)
		reasons []string // substrings, all workers
	}{
		{
			name:  "one rank per target port: vLLM external DP load balancing",
			ports: []int32{8000, 8001, 8002},
			pod:   pod("dp", "10.0.0.1", model(AnnotationReplayPort, "5600")),
			check: func(t *testing.T, ws []catalog.Record) {
				if len(ws) != 3 {
					t.Fatalf("got %d", len(ws))
				}
				for i, w := range ws {
					port := 8000 + i
					if *w.Endpoint != "http://10.0.0.1:"+itoa(port) || *w.DataParallelStartRank != uint32(i) || *w.DataParallelSize != 1 {
						t.Errorf("worker %d: %s", i, show(w))
					}
					if w.KVEventsEndpoints[uint32(i)] != "tcp://10.0.0.1:"+itoa(5557+i) || *w.ReplayEndpoint != "tcp://10.0.0.1:"+itoa(5600+i) {
						t.Errorf("worker %d events: %s", i, show(w))
					}
					if w.WorkerID != WorkerID("ns", "dp", int32(port)) {
						t.Errorf("worker %d id", i)
					}
				}
			},
		},
		{
			name:  "internal DP: ranks behind one port, one PUB port per rank",
			ports: []int32{8000},
			pod: pod("dp4", "10.0.0.2", model(AnnotationDPSize, "4", AnnotationKVEventsPort, "6000", AnnotationBlockSize, "32",
				AnnotationRoutingGroup, "a100", AnnotationMaxBatchedTokens, "8192", AnnotationTotalKVBlocks, "40000")),
			check: func(t *testing.T, ws []catalog.Record) {
				w := ws[0]
				wantEP := map[uint32]string{0: "tcp://10.0.0.2:6000", 1: "tcp://10.0.0.2:6001", 2: "tcp://10.0.0.2:6002", 3: "tcp://10.0.0.2:6003"}
				if !maps.Equal(w.KVEventsEndpoints, wantEP) || *w.DataParallelSize != 4 || *w.BlockSize != 32 || w.RoutingGroup != "a100" ||
					*w.MaxNumBatchedTokens != 8192 || *w.TotalKVBlocks != 40000 || w.ReplayEndpoint != nil {
					t.Errorf("got %s", show(w))
				}
			},
		},
		{
			name:  "pinned worker id: port i gets id + i",
			ports: []int32{8000, 8001},
			pod:   pod("p", "10.0.0.3", model(AnnotationWorkerID, "100")),
			check: func(t *testing.T, ws []catalog.Record) {
				if ws[0].WorkerID != 100 || ws[1].WorkerID != 101 {
					t.Errorf("ids %d %d", ws[0].WorkerID, ws[1].WorkerID)
				}
			},
		},
		{
			name:  "active ports restrict the workers",
			ports: []int32{8000, 8001, 8002},
			pod:   pod("p", "10.0.0.4", model(AnnotationActivePorts, "8002, 9999,8000")),
			check: func(t *testing.T, ws []catalog.Record) {
				if len(ws) != 2 || *ws[0].Endpoint != "http://10.0.0.4:8000" || *ws[1].Endpoint != "http://10.0.0.4:8002" || *ws[1].DataParallelStartRank != 2 {
					t.Errorf("got %v", showAll(ws))
				}
			},
		},
		{
			name:  "IPv6 pod",
			ports: []int32{8000},
			pod:   pod("v6", "fd00::5", model()),
			check: func(t *testing.T, ws []catalog.Record) {
				if *ws[0].Endpoint != "http://[fd00::5]:8000" || ws[0].KVEventsEndpoints[0] != "tcp://[fd00::5]:5557" {
					t.Errorf("got %s", show(ws[0]))
				}
			},
		},
		{
			name:  "labels work where annotations are absent",
			ports: []int32{8000},
			pod: func() corev1.Pod {
				p := pod("l", "10.0.0.5", nil)
				p.Labels[AnnotationModel] = "qwen"
				p.Labels[AnnotationBlockSize] = "64"
				return p
			}(),
			check: func(t *testing.T, ws []catalog.Record) {
				if ws[0].ModelName != "qwen" || *ws[0].BlockSize != 64 || len(ws[0].SourceReasons) != 0 {
					t.Errorf("got %s", show(ws[0]))
				}
			},
		},
		{name: "missing model", ports: []int32{8000}, pod: pod("m", "10.0.0.6", nil), reasons: []string{"annotation kvselect.io/model is missing"}},
		{name: "malformed block size", ports: []int32{8000}, pod: pod("b", "10.0.0.7", model(AnnotationBlockSize, "sixteen")), reasons: []string{`annotation kvselect.io/block-size "sixteen": want an integer from 1`}},
		{name: "zero dp size", ports: []int32{8000}, pod: pod("z", "10.0.0.8", model(AnnotationDPSize, "0")), reasons: []string{"kvselect.io/data-parallel-size \"0\""}},
		{name: "port out of range", ports: []int32{8000}, pod: pod("o", "10.0.0.9", model(AnnotationKVEventsPort, "70000")), reasons: []string{"kvselect.io/kv-events-port \"70000\""}},
		{name: "rank pushes the PUB port past 65535", ports: []int32{8000}, pod: pod("r", "10.0.0.10", model(AnnotationKVEventsPort, "65535", AnnotationDPSize, "2")), reasons: []string{"KV events port 65535 + dp_rank 1 is past 65535"}},
		{name: "malformed active ports", ports: []int32{8000, 8001}, pod: pod("a", "10.0.0.11", model(AnnotationActivePorts, "8000,http")), reasons: []string{`"http" is not a port`}},
		{name: "no pod IP", ports: []int32{8000}, pod: pod("n", "", model()), reasons: []string{"pod has no IP address yet"}},
		{name: "negative worker id", ports: []int32{8000}, pod: pod("w", "10.0.0.12", model(AnnotationWorkerID, "-3")), reasons: []string{"kvselect.io/worker-id \"-3\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := Workers(pool(tt.ports...), []corev1.Pod{tt.pod})
			if len(ws) == 0 {
				t.Fatal("a ready pod must always yield workers, complete or not")
			}
			if tt.check != nil {
				tt.check(t, ws)
			}
			for _, w := range ws {
				if len(tt.reasons) == 0 && len(w.SourceReasons) != 0 {
					t.Errorf("unexpected reasons %q", w.SourceReasons)
				}
				for _, r := range tt.reasons {
					if !slices.ContainsFunc(w.SourceReasons, func(s string) bool { return strings.Contains(s, r) }) {
						t.Errorf("reasons %q lack %q", w.SourceReasons, r)
					}
				}
			}
		})
	}
}

func TestWorkersSkipNotReadyAndDeletingPods(t *testing.T) {
	notReady := pod("b", "10.0.0.2", model())
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	noCondition := pod("c", "10.0.0.3", model())
	noCondition.Status.Conditions = nil
	deleting := pod("d", "10.0.0.4", model())
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	ws := Workers(pool(8000), []corev1.Pod{notReady, pod("a", "10.0.0.1", model()), noCondition, deleting})
	if len(ws) != 1 || *ws[0].StableRoutingID != "ns/a:8000" {
		t.Fatalf("got %v", showAll(ws))
	}
}

func TestWorkersResolveAPinnedIDClaimedTwice(t *testing.T) {
	pods := []corev1.Pod{
		pod("z-copy", "10.0.0.2", model(AnnotationWorkerID, "7")),
		pod("a-orig", "10.0.0.1", model(AnnotationWorkerID, "7")),
	}
	ws := Workers(pool(8000), pods)
	if len(ws) != 2 {
		t.Fatalf("got %v", showAll(ws))
	}
	if ws[0].WorkerID != 7 || len(ws[0].SourceReasons) != 0 || *ws[0].StableRoutingID != "ns/a-orig:8000" {
		t.Fatalf("the first pod in name order keeps the id: %s", show(ws[0]))
	}
	if ws[1].WorkerID != WorkerID("ns", "z-copy", 8000) || len(ws[1].SourceReasons) != 1 ||
		!strings.Contains(ws[1].SourceReasons[0], "worker id 7 is already used by pod ns/a-orig port 8000") {
		t.Fatalf("the copy gets its derived id and a reason: %s", show(ws[1]))
	}
}

func TestParseActivePorts(t *testing.T) {
	got, err := parseActivePorts(" 8001,,8000,8001,7000", []int32{8000, 8001})
	if err != nil || !slices.Equal(got, []int32{8001, 8000}) {
		t.Fatalf("got %v %v", got, err)
	}
	if got, err := parseActivePorts("", []int32{8000}); err != nil || len(got) != 0 {
		t.Fatalf("empty annotation: %v %v (GIE: the pod serves no port)", got, err)
	}
	for _, bad := range []string{"x", "0", "65536", "-1"} {
		if _, err := parseActivePorts(bad, []int32{8000}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func sameRecord(a, b catalog.Record) bool { return show(a) == show(b) }

func show(r catalog.Record) string {
	s := []string{itoa(int(r.WorkerID)), r.ModelName, r.RoutingGroup, d(r.Endpoint), d(r.StableRoutingID), d(r.ReplayEndpoint)}
	for _, p := range []*uint32{r.BlockSize, r.DataParallelStartRank, r.DataParallelSize} {
		if p == nil {
			s = append(s, "nil")
		} else {
			s = append(s, itoa(int(*p)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.KVEventsEndpoints)) {
		s = append(s, itoa(int(k))+"="+r.KVEventsEndpoints[k])
	}
	return strings.Join(append(s, r.SourceReasons...), " | ")
}

func showAll(ws []catalog.Record) []string {
	var out []string
	for _, w := range ws {
		out = append(out, show(w))
	}
	return out
}

func d(p *string) string {
	if p == nil {
		return "nil"
	}
	return *p
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestWorkersWithCollector: with kvselect's collector bound, a pod without the
// kv-events-port annotation is fed through the collector (no
// kv_events_endpoints; its endpoint carries the host:port of llm-d's topic),
// an annotated pod keeps its subscription, and kv-events-topic is passed on.
func TestWorkersWithCollector(t *testing.T) {
	pods := []corev1.Pod{
		pod("vllm-0", "10.1.2.3", model()),
		pod("vllm-1", "10.1.2.4", model(AnnotationKVEventsPort, "6000")),
		pod("vllm-2", "10.1.2.5", model(AnnotationKVEventsTopic, "engine-2")),
	}
	ws := WorkersFor(pool(8000), pods, Mapping{Collector: true})
	if len(ws) != 3 {
		t.Fatalf("got %d workers", len(ws))
	}
	if ws[0].KVEventsEndpoints != nil || *ws[0].Endpoint != "http://10.1.2.3:8000" || ws[0].KVEventsTopic != nil {
		t.Fatalf("unannotated pod: %s", show(ws[0]))
	}
	if got := ws[1].KVEventsEndpoints[0]; got != "tcp://10.1.2.4:6000" {
		t.Fatalf("annotated pod subscribes to %q, want tcp://10.1.2.4:6000", got)
	}
	if ws[2].KVEventsTopic == nil || *ws[2].KVEventsTopic != "engine-2" || ws[2].KVEventsEndpoints != nil {
		t.Fatalf("pod with a topic: %s", show(ws[2]))
	}
	rec := ws[0]
	if reasons := rec.Reasons(catalog.Checks{ConsumesEvents: true, Collector: true}); len(reasons) != 0 {
		t.Fatalf("a collector-fed pod is not schedulable: %v", reasons)
	}
	if sub := Workers(pool(8000), pods[:1]); sub[0].KVEventsEndpoints[0] != "tcp://10.1.2.3:5557" {
		t.Fatalf("without a collector the default port is subscribed: %s", show(sub[0]))
	}
}

func TestWorkersEngineAnnotations(t *testing.T) {
	pods := []corev1.Pod{
		pod("sglang-0", "10.1.2.3", model(AnnotationEngine, "sglang", AnnotationMetricsPort, "9100")),
		pod("vllm-0", "10.1.2.4", model()),
		pod("odd-0", "10.1.2.5", model(AnnotationEngine, "tgi")),
	}
	byPod := map[string]catalog.Record{}
	for _, w := range Workers(pool(8000), pods) {
		byPod[*w.StableRoutingID] = w
	}
	ws := []catalog.Record{byPod["ns/sglang-0:8000"], byPod["ns/vllm-0:8000"], byPod["ns/odd-0:8000"]}
	if ws[0].EngineName() != "sglang" || ws[0].MetricsEndpoint == nil || *ws[0].MetricsEndpoint != "http://10.1.2.3:9100/metrics" {
		t.Fatalf("annotated pod: %s", show(ws[0]))
	}
	if u, ok := ws[1].MetricsURL(); !ok || u != "http://10.1.2.4:8000/metrics" || ws[1].EngineName() != "vllm" {
		t.Fatalf("default metrics URL %q (%v), engine %s", u, ok, ws[1].EngineName())
	}
	if r := ws[2].Reasons(catalog.Checks{}); len(r) == 0 || !strings.Contains(r[0], "kvselect.io/engine") {
		t.Fatalf("an unknown engine is not a visible reason: %v", r)
	}
}

// llm-d's role label (and kvselect's own annotation) set the worker's role;
// unknown and conflicting values make the worker incomplete with the reason.
func TestWorkersRoles(t *testing.T) {
	for _, tc := range []struct {
		name          string
		label, annot  string // "" = unset
		want, problem string
	}{
		{name: "no role", want: ""},
		{name: "llm-d prefill", label: "prefill", want: "prefill"},
		{name: "llm-d decode", label: "decode", want: "decode"},
		{name: "llm-d prefill-decode is aggregated", label: "prefill-decode", want: "both"},
		{name: "llm-d's deprecated both", label: "both", want: "both"},
		{name: "encode before prefill", label: "encode-prefill", want: "prefill"},
		{name: "encode-only pod", label: "encode", problem: "encode-only pod"},
		{name: "unknown label value", label: "prefiller", problem: `label llm-d.ai/role "prefiller"`},
		{name: "kvselect annotation", annot: "decode", want: "decode"},
		{name: "agreeing label and annotation", label: "prefill-decode", annot: "both", want: "both"},
		{name: "conflicting label and annotation", label: "prefill", annot: "decode", problem: "conflicts with label"},
		{name: "bad annotation", annot: "p", problem: `annotation kvselect.io/role "p"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := model()
			if tc.annot != "" {
				ann[AnnotationRole] = tc.annot
			}
			p := pod("vllm-0", "10.1.2.3", ann)
			if tc.label != "" {
				p.Labels[LabelRole] = tc.label
			}
			ws := Workers(pool(8000), []corev1.Pod{p})
			if len(ws) != 1 {
				t.Fatalf("%d workers", len(ws))
			}
			w := ws[0]
			reasons := strings.Join(w.Reasons(catalog.Checks{}), "; ")
			if tc.problem != "" {
				if !strings.Contains(reasons, tc.problem) {
					t.Fatalf("reasons %q, want %q", reasons, tc.problem)
				}
				return
			}
			got := ""
			if w.Role != nil {
				got = *w.Role
			}
			if got != tc.want || reasons != "" {
				t.Fatalf("role %q reasons %q, want %q", got, reasons, tc.want)
			}
			if w.RoutingGroup != "" {
				t.Fatalf("routing group %q: the service decides a role's group", w.RoutingGroup)
			}
		})
	}
}
