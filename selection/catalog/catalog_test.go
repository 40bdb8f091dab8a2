package catalog

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func TestReasons(t *testing.T) {
	complete := func() *Record {
		return &Record{WorkerID: 1, Endpoint: ptr("http://w:8000"), BlockSize: ptr(uint32(16))}
	}
	for _, tc := range []struct {
		name   string
		edit   func(*Record)
		checks Checks
		want   []string
	}{
		{"complete", func(*Record) {}, Checks{}, nil},
		{"no endpoint, no block size", func(r *Record) { r.Endpoint, r.BlockSize = nil, nil }, Checks{},
			[]string{"endpoint is required", "block_size must be greater than 0"}},
		{"empty endpoint, zero block size", func(r *Record) { r.Endpoint, r.BlockSize = ptr(""), ptr(uint32(0)) }, Checks{},
			[]string{"endpoint is required", "block_size must be greater than 0"}},
		{"zero dp size", func(r *Record) { r.DataParallelSize = ptr(uint32(0)) }, Checks{},
			[]string{"data_parallel_size must be greater than 0"}},
		{"queueing needs max_num_batched_tokens", func(*Record) {}, Checks{Queueing: true},
			[]string{"max_num_batched_tokens is required while queueing is enabled"}},
		{"events need an endpoint per rank", func(r *Record) {
			r.DataParallelStartRank, r.DataParallelSize = ptr(uint32(2)), ptr(uint32(2))
			r.KVEventsEndpoints = map[uint32]string{2: "tcp://w:5557"}
		}, Checks{ConsumesEvents: true}, []string{"kv_events endpoint is required for dp_rank 3"}},
		{"replay needs a single rank", func(r *Record) {
			r.DataParallelSize = ptr(uint32(2))
			r.KVEventsEndpoints = map[uint32]string{0: "tcp://w:5557", 1: "tcp://w:5558"}
			r.ReplayEndpoint = ptr("tcp://w:5600")
		}, Checks{ConsumesEvents: true}, []string{"replay_endpoint is supported only for data_parallel_size 1"}},
		{"legacy single endpoint", func(r *Record) { r.KVEventsEndpoint = ptr("tcp://w:5557") }, Checks{ConsumesEvents: true}, nil},
		{"legacy endpoint ignored for dp 2", func(r *Record) {
			r.DataParallelSize = ptr(uint32(2))
			r.KVEventsEndpoint = ptr("tcp://w:5557")
		}, Checks{ConsumesEvents: true}, []string{"kv_events endpoint is required for dp_rank 0", "kv_events endpoint is required for dp_rank 1"}},
		{"a collector feeds ranks without endpoints", func(r *Record) {
			r.DataParallelSize = ptr(uint32(2))
		}, Checks{ConsumesEvents: true, Collector: true}, nil},
		{"a collector-fed endpoint without host:port needs a topic", func(r *Record) {
			r.Endpoint = ptr("unix:///run/engine.sock")
		}, Checks{ConsumesEvents: true, Collector: true},
			[]string{"dp_rank 0 is fed by the kv events collector but the endpoint has no host:port for its topic; set kv_events_topic"}},
		{"kv_events_topic stands in for host:port", func(r *Record) {
			r.Endpoint, r.KVEventsTopic = ptr("unix:///run/engine.sock"), ptr("engine-1")
		}, Checks{ConsumesEvents: true, Collector: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := complete()
			tc.edit(r)
			if got := r.Reasons(tc.checks); !slices.Equal(got, tc.want) {
				t.Fatalf("reasons = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestKVEndpointsAndRanks(t *testing.T) {
	r := &Record{DataParallelStartRank: ptr(uint32(4)), DataParallelSize: ptr(uint32(2)),
		KVEventsEndpoints: map[uint32]string{4: "tcp://a:1", 5: "tcp://a:2", 9: "tcp://a:9"}}
	if !slices.Equal(r.Ranks(), []uint32{4, 5}) || !r.HasRank(5) || r.HasRank(6) || r.HasRank(3) {
		t.Fatalf("ranks = %v", r.Ranks())
	}
	eps := r.KVEndpoints(false)
	if len(eps) != 2 || eps[5].KVEvents != "tcp://a:2" {
		t.Fatalf("endpoints = %v (ranks outside the range must not appear)", eps)
	}
}

// TestKVEndpointsWithCollector: with a collector bound, ranks without an
// endpoint of their own are fed by it and carry what their topic is matched
// by; ranks with an endpoint keep subscribe mode.
func TestKVEndpointsWithCollector(t *testing.T) {
	r := &Record{Endpoint: ptr("http://10.0.0.7:8000"), DataParallelSize: ptr(uint32(2)),
		ReplayEndpoint: ptr("tcp://10.0.0.7:5558"), KVEventsEndpoints: map[uint32]string{1: "tcp://10.0.0.7:5557"}}
	eps := r.KVEndpoints(true)
	want := map[uint32]RankEndpoints{
		0: {Replay: "tcp://10.0.0.7:5558", HostPort: "10.0.0.7:8000"},
		1: {KVEvents: "tcp://10.0.0.7:5557", Replay: "tcp://10.0.0.7:5558", HostPort: "10.0.0.7:8000"},
	}
	if !maps.Equal(eps, want) {
		t.Fatalf("endpoints = %+v, want %+v", eps, want)
	}
	r.KVEventsTopic = ptr("engine-7")
	if got := r.KVEndpoints(true)[0]; got.Topic != "engine-7" {
		t.Fatalf("rank 0 = %+v, want topic engine-7", got)
	}
	if got := r.KVEndpoints(false); len(got) != 1 || got[1].HostPort != "" {
		t.Fatalf("without a collector: %+v, want rank 1 only", got)
	}
}

func TestHostPort(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{"http://10.0.0.7:8000", "10.0.0.7:8000"},
		{"http://10.0.0.7:8000/v1/completions?x=1", "10.0.0.7:8000"},
		{"HTTP://Pod-A.Example:9000", "pod-a.example:9000"},
		{"http://10.0.0.7", "10.0.0.7:80"},
		{"https://10.0.0.7", "10.0.0.7:443"},
		{"https://user@10.0.0.7:8443/", "10.0.0.7:8443"},
		{"10.0.0.7:8000", "10.0.0.7:8000"},
		{"http://[fd00::7]:8000", "[fd00::7]:8000"},
		{"[FD00::7]:8000", "[fd00::7]:8000"},
		{"fd00::7:8000", "[fd00::7]:8000"},
		{"", ""},
		{"10.0.0.7", ""},
		{"grpc://10.0.0.7", ""},
		{"http://10.0.0.7:0", ""},
		{"http://10.0.0.7:99999", ""},
		{"http://:8000", ""},
		{"[fd00::7", ""},
		{"[fd00::7]x", ""},
	}
	for _, tc := range cases {
		got, ok := HostPort(tc.in)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("HostPort(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}

func TestPatchSemantics(t *testing.T) {
	r := &Record{WorkerID: 3, ModelName: "m", RoutingGroup: "g", Endpoint: ptr("http://a"), TotalKVBlocks: ptr(uint64(10)),
		Taints: []string{"x"}, KVEventsEndpoints: map[uint32]string{0: "tcp://a:1"}}
	var p Patch
	if err := json.Unmarshal([]byte(`{"endpoint":null,"total_kv_blocks":20,"taints":[],"data_parallel_start_rank":1,"worker_id":9,"model_name":"z"}`), &p); err != nil {
		t.Fatal(err)
	}
	got := p.Apply(r)
	if *got.Endpoint != "http://a" || *got.TotalKVBlocks != 20 || len(got.Taints) != 0 || got.StartRank() != 1 ||
		got.WorkerID != 3 || got.ModelName != "m" || got.KVEventsEndpoints[0] != "tcp://a:1" {
		t.Fatalf("patched = %+v", got)
	}
	if *r.TotalKVBlocks != 10 || len(r.Taints) != 1 {
		t.Fatal("Apply modified the original record")
	}
}

func TestRecordJSONShape(t *testing.T) {
	r := &Record{WorkerID: 1, Lifecycle: Incomplete, NotSchedulableReasons: []string{"endpoint is required"}}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(r)
	want := `{"worker_id":1,"model_name":"default","routing_group":"default","lifecycle":"incomplete","endpoint":null,"kv_events_endpoint":null,` +
		`"replay_endpoint":null,"block_size":null,"data_parallel_start_rank":null,"data_parallel_size":null,"max_num_batched_tokens":null,` +
		`"total_kv_blocks":null,"stable_routing_id":null,"is_eagle":null,"taints":[],"topology_domains":{},"kv_transfer_domain":null,` +
		`"kv_transfer_enforcement":null,"kv_transfer_preferred_weight":null,"not_schedulable_reasons":["endpoint is required"]}`
	if string(b) != want {
		t.Fatalf("json =\n%s\nwant\n%s", b, want)
	}
	bad := &Record{KVTransferEnforcement: ptr("maybe")}
	if err := bad.Normalize(); err == nil {
		t.Fatal("bad enforcement accepted")
	}
}

func TestValidateZMQEndpoint(t *testing.T) {
	for ep, want := range map[string]string{
		"tcp://127.0.0.1:5557": "",
		"tcp://*:5557":         "",
		"tcp://worker:5557":    "",
		"tcp://[::1]:5557":     "",
		"ipc:///tmp/kv.sock":   "",
		"inproc://kv":          "",
		"invalid":              "missing scheme",
		"not-a-zmq-endpoint":   "missing scheme",
		"udp://a:1":            "unsupported scheme `udp`",
		"tcp://a":              "missing TCP port",
		"tcp://a:":             "missing TCP port",
		"tcp://:5557":          "missing TCP host",
		"tcp://a:70000":        "invalid TCP port",
		"tcp://a:x":            "invalid TCP port",
		"tcp://::1:5557":       "bracketed",
		"tcp://[::1]5557":      "missing TCP port",
	} {
		err := ValidateZMQEndpoint(ep)
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", ep, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "invalid ZMQ endpoint `"+ep+"`") {
			t.Errorf("%s: err = %v, want it to mention %q", ep, err, want)
		}
	}
}
