package metrics

import (
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/kvselect/kvselect/selection"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDialects(t *testing.T) {
	all := selection.AllRanks
	tests := []struct {
		engine, file string
		ranks        []uint32
		want         map[uint32]selection.EngineRank
		dropped      Dropped
	}{
		{"vllm", "vllm.txt", []uint32{0, 1}, map[uint32]selection.EngineRank{
			0: {Waiting: 2, Running: 3, KVUsage: 0.42, HasKVUsage: true,
				LoRA: &selection.LoRAState{Running: []string{"sql-lora", "chat-lora"}, Waiting: []string{"tool-lora"}, MaxLoRA: 4},
				TTFT: selection.EngineHistogram{Count: 10, Sum: 1.5, Reported: true},
				// inter_token_latency wins over the older name's series.
				ITL: selection.EngineHistogram{Count: 200, Sum: 4, Reported: true}},
			1: {Waiting: 0, Running: 1, KVUsage: 0.07, HasKVUsage: true,
				ITL: selection.EngineHistogram{Count: 50, Sum: 0.75, Reported: true}},
		}, Dropped{}},
		// A worker of ranks 4..5 sees engine 0 and 1 as ranks it does not have.
		{"vllm", "vllm.txt", []uint32{4, 5}, map[uint32]selection.EngineRank{}, Dropped{"unknown_rank": 14}},
		{"sglang", "sglang.txt", []uint32{0}, map[uint32]selection.EngineRank{
			all: {Waiting: 4, Running: 8, KVUsage: 0.52, HasKVUsage: true},
		}, Dropped{}},
		{"trtllm", "trtllm.txt", []uint32{0}, map[uint32]selection.EngineRank{
			all: {Waiting: 1, Running: 6, KVUsage: 0.25, HasKVUsage: true},
		}, Dropped{}},
		// Two data-parallel ranks, each exported by its two tensor-parallel
		// schedulers (--enable-metrics-for-all-schedulers): read once each.
		{"sglang", "sglang-dp.txt", []uint32{0, 1}, map[uint32]selection.EngineRank{
			0: {Waiting: 1, Running: 5, KVUsage: 0.3, HasKVUsage: true, TTFT: selection.EngineHistogram{Count: 20, Sum: 2, Reported: true}},
			1: {Waiting: 0, Running: 7, KVUsage: 0.4, HasKVUsage: true, TTFT: selection.EngineHistogram{Count: 30, Sum: 6, Reported: true}},
		}, Dropped{}},
		{"trtllm", "trtllm-serve.txt", []uint32{0}, map[uint32]selection.EngineRank{
			all: {Waiting: 3, Running: 12, KVUsage: 0.62, HasKVUsage: true,
				TTFT: selection.EngineHistogram{Count: 418, Sum: 83.6, Reported: true},
				ITL:  selection.EngineHistogram{Count: 418, Sum: 8.36, Reported: true}},
		}, Dropped{}},
	}
	for _, tt := range tests {
		t.Run(tt.engine+"/"+tt.file, func(t *testing.T) {
			d, _ := DialectFor(tt.engine)
			dropped := Dropped{}
			got, err := d.Parse(readTestdata(t, tt.file), tt.ranks, dropped)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse = %+v\nwant    %+v", got, tt.want)
			}
			if !reflect.DeepEqual(dropped, tt.dropped) {
				t.Fatalf("dropped = %v, want %v", dropped, tt.dropped)
			}
		})
	}
}

func TestBadPayloads(t *testing.T) {
	vllm, _ := DialectFor("vllm")
	tests := []struct {
		name    string
		body    string
		reason  string // "" = parses
		want    map[uint32]selection.EngineRank
		dropped Dropped
	}{
		{"garbage", "\x00\x01 not prometheus {{{", "missing_series", nil, nil},
		{"broken sample of a read family", "vllm:num_requests_waiting{engine=\"0\" 3\n", "parse_error", nil, nil},
		{"empty", "", "missing_series", nil, nil},
		{"other engine's names", string(readTestdata(t, "sglang.txt")), "missing_series", nil, nil},
		{"NaN and negative", "vllm:num_requests_waiting NaN\nvllm:num_requests_running -4\nvllm:kv_cache_usage_perc +Inf\n", "",
			map[uint32]selection.EngineRank{}, Dropped{"bad_value": 3}},
		{"usage above one", "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 42\n", "",
			map[uint32]selection.EngineRank{selection.AllRanks: {Waiting: 1}}, Dropped{"bad_value": 1}},
		{"older usage name", "vllm:num_requests_running 2\nvllm:gpu_cache_usage_perc 0.5\n", "",
			map[uint32]selection.EngineRank{selection.AllRanks: {Running: 2, KVUsage: 0.5, HasKVUsage: true}}, Dropped{}},
		{"only running", "vllm:num_requests_running 2\n", "",
			map[uint32]selection.EngineRank{selection.AllRanks: {Running: 2}}, Dropped{}},
		{"bad rank label", "vllm:num_requests_running{engine=\"x\"} 2\n", "", map[uint32]selection.EngineRank{}, Dropped{"unknown_rank": 1}},
		{"bad max_lora", "vllm:num_requests_running 1\nvllm:lora_requests_info{max_lora=\"many\",running_lora_adapters=\"a\"} 1\n", "",
			map[uint32]selection.EngineRank{selection.AllRanks: {Running: 1}}, Dropped{"bad_lora_info": 1}},
		{"series of two models summed", "vllm:num_requests_waiting{model_name=\"a\"} 1\nvllm:num_requests_waiting{model_name=\"b\"} 2\n", "",
			map[uint32]selection.EngineRank{selection.AllRanks: {Waiting: 3}}, Dropped{}},
		{"finite series summing past the largest float", "vllm:num_requests_waiting{model_name=\"a\"} 1.7e308\nvllm:num_requests_waiting{model_name=\"b\"} 1.7e308\nvllm:num_requests_running 1\n", "",
			map[uint32]selection.EngineRank{selection.AllRanks: {Running: 1}}, Dropped{"bad_value": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dropped := Dropped{}
			got, err := vllm.Parse([]byte(tt.body), []uint32{0}, dropped)
			if tt.reason != "" {
				pe, ok := err.(*ParseError)
				if !ok || pe.Reason != tt.reason {
					t.Fatalf("err = %v, want reason %s", err, tt.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) || !reflect.DeepEqual(dropped, tt.dropped) {
				t.Fatalf("Parse = %+v dropped %v\nwant    %+v dropped %v", got, dropped, tt.want, tt.dropped)
			}
		})
	}
}

func TestKeepFamilies(t *testing.T) {
	body := "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n" +
		"vllm:num_requests_waiting_total 9\n# some comment vllm:num_requests_waiting\ngo_goroutines 3\n"
	got := string(keepFamilies(nil, []byte(body), []string{"vllm:num_requests_waiting"}))
	want := "vllm:num_requests_waiting 1\n"
	if got != want {
		t.Fatalf("keepFamilies = %q", got)
	}
	if !strings.Contains(string(keepFamilies(nil, readTestdata(t, "vllm.txt"), (&Dialect{Waiting: []series{{name: "go_goroutines"}}}).familyNames())), "go_goroutines 42") {
		t.Fatal("go_goroutines dropped")
	}
}

// FuzzParse: no payload panics the parser, and whatever it returns is safe
// for selection: finite, non-negative counts and a usage in [0, 1].
func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "sglang.txt", "trtllm.txt", "trtllm-serve.txt", "sglang-dp.txt"} {
		f.Add(readTestdata(f, name))
	}
	f.Add([]byte("vllm:num_requests_waiting{engine=\"0\"} NaN\n"))
	f.Add([]byte("vllm:num_requests_waiting{model_name=\"a\"} 1.7e308\nvllm:num_requests_waiting{model_name=\"b\"} 1.7e308\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, engine := range []string{"vllm", "sglang", "trtllm"} {
			d, _ := DialectFor(engine)
			got, err := d.Parse(body, []uint32{0, 1}, Dropped{})
			if err != nil {
				continue
			}
			for r, e := range got {
				ok := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }
				if !ok(e.Waiting) || !ok(e.Running) || (e.HasKVUsage && (e.KVUsage < 0 || e.KVUsage > 1)) {
					t.Fatalf("%s rank %d: unsafe figures %+v", engine, r, e)
				}
			}
		}
	})
}
