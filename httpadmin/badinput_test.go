package httpadmin

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/routerconfig"
)

// onlyReader hides the length of a body, so the client sends it chunked and the
// 8 MiB limit is enforced while reading rather than from Content-Length.
type onlyReader struct{ io.Reader }

// TestBadInputNeverFailsTheServer throws malformed, truncated, oversized,
// wrongly typed, negative, overflowing and unicode-laden input at every route:
// never a 5xx (beyond Dynamo's 503 for an unknown partition), never a panic
// (the recover in ServeHTTP would turn one into a 500), and a rejected request
// leaves the catalog and the loads exactly as they were.
func TestBadInputNeverFailsTheServer(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	a.addWorker(2, "data_parallel_size", 2)
	a.do("POST", "/workers", `{"worker_id":3,"endpoint":"http://w3:8000","block_size":4}`).want(t, 201, "") // partition "default"
	a.do("POST", "/select_and_reserve", with(sel4, "selection_id", "live")).want(t, 200, "")

	big := append([]byte(`{"model_name":"model","token_ids":[`), bytes.Repeat([]byte("1,"), 4<<20+1)...)
	big = append(big, "1]}"...)

	jsonRoutes := []struct{ method, path string }{
		{"POST", "/select"}, {"POST", "/select_and_reserve"}, {"POST", "/reservations"}, {"POST", "/reservations/live/output_block"},
		{"POST", "/workers"}, {"PATCH", "/workers/1"}, {"POST", "/potential_loads"}, {"POST", "/overlap_scores"},
		{"POST", "/replica_sync/register_peer"}, {"POST", "/replica_sync/deregister_peer"},
	}
	type c struct {
		method, path string
		body         any
		ct           string // "" = application/json; "-" = none
		status       int    // exact status; 0 = any non-5xx (valid but odd input)
		frag         string
	}
	var cases []c
	for _, r := range jsonRoutes {
		for _, b := range []struct {
			body   any
			ct     string
			status int
			frag   string
		}{
			{"", "", 400, "Failed to parse the request body as JSON: EOF while parsing a value at line 1 column 0"},
			{" \n\t", "", 400, "EOF while parsing"},
			{"{", "", 400, "Failed to parse the request body as JSON: "},
			{`{"model_name":`, "", 400, "EOF while parsing"},
			{`{"token_ids":[1,2,`, "", 400, "Failed to parse"},
			{`{"a":1}}`, "", 400, "Failed to parse"},
			{`{"a":1} x`, "", 400, "Failed to parse"},
			{"nul", "", 400, "Failed to parse"},
			{`{'a':1}`, "", 400, "Failed to parse"},
			{"{\"model_name\":\"\xff\xfe\"}", "", 400, "invalid UTF-8"},
			{"\xef\xbb\xbf{}", "", 400, "Failed to parse"}, // a BOM is not JSON
			{"null", "", 422, "Failed to deserialize the JSON body into the target type: invalid type: null"},
			{"[]", "", 422, "invalid type: array"},
			{`"str"`, "", 422, "invalid type: string"},
			{"123", "", 422, "invalid type: number"},
			{"true", "", 422, "invalid type: bool"},
			{`{"model_name":5}`, "", 422, "model_name: invalid type: number, expected a string"},
			{`{"model_name":["m"]}`, "", 422, "Failed to deserialize"},
			{`{}`, "text/plain", 415, "Expected request with `Content-Type: application/json`"},
			{`{}`, "-", 415, "Expected request with `Content-Type: application/json`"},
			{`{}`, "multipart/form-data; boundary=x", 415, ""},
			{big, "", 413, "length limit exceeded"},
			{onlyReader{bytes.NewReader(big)}, "", 413, "length limit exceeded"},
			{`{}`, "", 0, ""},
			{`{"模型":"🚀","model_name":"model","\u0000":"\ud83d\ude80"}`, "", 0, ""},
		} {
			if body, _ := b.body.(string); b.status == 422 && strings.HasPrefix(body, `{"model_name":`) {
				// model_name is an unknown field, ignored, where the body has none.
				switch {
				case strings.Contains(r.path, "replica_sync"):
					b.status, b.frag = 422, "missing field `endpoint`"
				case strings.Contains(r.path, "output_block"), r.method == "PATCH":
					b.status, b.frag = 200, ""
				}
			}
			cases = append(cases, c{r.method, r.path, b.body, b.ct, b.status, b.frag})
		}
	}
	add := func(method, path string, status int, frag string, bodies ...string) {
		for _, b := range bodies {
			cases = append(cases, c{method, path, b, "", status, frag})
		}
	}
	for _, p := range []string{"/select", "/select_and_reserve", "/potential_loads", "/overlap_scores"} {
		add("POST", p, 422, "Failed to deserialize the JSON body into the target type: ",
			`{"model_name":"model","token_ids":"1234"}`,
			`{"model_name":"model","token_ids":[-1]}`,
			`{"model_name":"model","token_ids":[4294967296]}`,
			`{"model_name":"model","token_ids":[1.5]}`,
			`{"model_name":"model","token_ids":[1e3]}`,
			`{"model_name":"model","block_hashes":[9223372036854775808],"sequence_hashes":[1],"isl_tokens":4}`,
			`{"model_name":"model","block_hashes":[1],"sequence_hashes":[-9223372036854775809],"isl_tokens":4}`,
			`{"model_name":"model","block_hashes":[1],"sequence_hashes":[1],"isl_tokens":-4}`,
			`{"model_name":"model","block_hashes":[1],"sequence_hashes":[1],"isl_tokens":18446744073709551616}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"router_config_override":{"overlap_score_credit":-1}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"router_config_override":{"shared_cache_multiplier":2}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"router_config_override":{"router_temperature":"hot"}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"router_config_override":[]}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"lora_name":7}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"mm_routing_info":{"routing_token_ids":[-1]}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"block_mm_infos":[{"mm_objects":[{"mm_hash":-1,"offsets":[]}]}]}`,
		)
		add("POST", p, 400, "", `{"model_name":"model"}`, `{"model_name":"model","block_hashes":[1],"sequence_hashes":[1,2],"isl_tokens":4}`)
		add("POST", p, 503, "no schedulable workers for", `{"model_name":"模型\u0000🚀","token_ids":[1,2,3,4]}`)
	}
	for _, p := range []string{"/select", "/select_and_reserve"} {
		add("POST", p, 422, "Failed to deserialize the JSON body into the target type: ",
			`{"model_name":"model","token_ids":[1,2,3,4],"allowed_worker_ids":[18446744073709551616]}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"allowed_worker_ids":[-1]}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"pinned_worker":{"worker_id":18446744073709551616,"dp_rank":0}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"pinned_worker":{"worker_id":1}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"pinned_worker":{"dp_rank":0}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"pinned_worker":{"worker_id":1,"dp_rank":4294967296}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"affinity_target":{}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"affinity_target":{"worker_id":null}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"session_context":{}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"session_context":{"session_id":null}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"session_context":{"session_id":"s","input_trigger":"bogus"}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"session_context":{"session_id":"s","agent_headers":{"h":"v"}}}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"priority_jump":"soon"}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"strict_priority":-1}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"expected_output_tokens":1.5}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"advisory":"yes"}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"selection_id":5}`,
			`{"model_name":"model","token_ids":[1,2,3,4],"routing_constraints":{"preferred_taints":{"a":"x"}}}`,
		)
	}
	add("POST", "/select_and_reserve", 409, "selection live is already reserved", `{"model_name":"model","token_ids":[1,2,3,4],"selection_id":"live"}`)
	add("POST", "/reservations", 422, "Failed to deserialize the JSON body into the target type: ",
		`{"model_name":"model","worker_id":1}`,
		`{"selection_id":null}`,
		`{"selection_id":5}`,
		`{"selection_id":"x","worker_id":-1}`,
		`{"selection_id":"x","worker_id":18446744073709551616}`,
		`{"selection_id":"x","worker_id":1,"dp_rank":4294967296}`,
		`{"selection_id":"x","worker_id":1,"sequence_hashes":[9223372036854775808],"isl_tokens":4}`,
		`{"selection_id":"x","worker_id":1,"sequence_hashes":[1],"isl_tokens":4,"effective_prefill_tokens":-1}`,
		`{"selection_id":"x","worker_id":1,"sequence_hashes":[1],"isl_tokens":4,"track_prefill_tokens":"no"}`,
		`{"selection_id":"x","worker_id":1,"sequence_hashes":[1],"isl_tokens":4,"router_config_override":{"prefill_load_scale":-0.5}}`,
	)
	add("POST", "/reservations", 400, "must not exceed isl_tokens",
		`{"model_name":"model","selection_id":"x","worker_id":1,"sequence_hashes":[1],"isl_tokens":4,"effective_prefill_tokens":5}`)
	add("POST", "/reservations", 400, "sequence_hashes is required without token_ids", `{"model_name":"model","selection_id":"x","worker_id":1}`)
	add("POST", "/reservations", 404, "", `{"model_name":"model","selection_id":"x","worker_id":99,"sequence_hashes":[1],"isl_tokens":4}`,
		`{"model_name":"model","selection_id":"🚀\u0000"}`, `{"model_name":"model","selection_id":"x","worker_id":1,"dp_rank":7,"sequence_hashes":[1],"isl_tokens":4}`)
	add("POST", "/reservations", 409, "already reserved", `{"model_name":"model","selection_id":"live","worker_id":1,"sequence_hashes":[1],"isl_tokens":4}`)
	add("POST", "/workers", 422, "Failed to deserialize the JSON body into the target type: ",
		`{"model_name":"m"}`, `{"worker_id":null}`, `{"worker_id":"1"}`, `{"worker_id":-1}`, `{"worker_id":18446744073709551616}`,
		`{"worker_id":1.5}`, `{"worker_id":9,"block_size":-4}`, `{"worker_id":9,"block_size":4294967296}`,
		`{"worker_id":9,"data_parallel_size":4294967296}`, `{"worker_id":9,"kv_events_endpoints":{"abc":"tcp://x:1"}}`,
		`{"worker_id":9,"kv_events_endpoints":{"-1":"tcp://x:1"}}`, `{"worker_id":9,"kv_events_endpoints":["tcp://x:1"]}`,
		`{"worker_id":9,"kv_transfer_enforcement":"maybe"}`, `{"worker_id":9,"taints":"a"}`, `{"worker_id":9,"topology_domains":{"a":1}}`,
		`{"worker_id":9,"max_num_batched_tokens":-1}`, `{"worker_id":9,"is_eagle":"true"}`,
	)
	add("PATCH", "/workers/1", 422, "Failed to deserialize the JSON body into the target type: ",
		`{"block_size":"4"}`, `{"kv_transfer_enforcement":"x"}`, `{"data_parallel_size":-1}`, `{"total_kv_blocks":18446744073709551616}`,
		`{"kv_events_endpoints":{"x":"y"}}`)
	add("PATCH", "/workers/abc", 400, "Invalid URL: Cannot parse `abc` to a `u64`", `{}`, `not json`)
	add("PATCH", "/workers/18446744073709551616", 400, "Cannot parse", `{}`)
	add("PATCH", "/workers/99", 404, "worker 99 not found", `{}`)
	add("POST", "/reservations/live/output_block", 422, "decay_fraction: invalid type", `{"decay_fraction":"x"}`, `{"decay_fraction":[]}`)
	add("POST", "/reservations/live/output_block", 400, "decay_fraction must be between 0.0 and 1.0", `{"decay_fraction":1.5}`, `{"decay_fraction":-0.1}`, `{"decay_fraction":1e308}`)
	add("POST", "/reservations/%F0%9F%9A%80/output_block", 404, "reservation 🚀 not found", `{}`)
	for _, p := range []string{"/replica_sync/register_peer", "/replica_sync/deregister_peer"} {
		add("POST", p, 422, "Failed to deserialize", `{}`, `{"endpoint":null}`, `{"endpoint":5}`, `{"endpoint":["tcp://x:1"]}`)
		add("POST", p, 409, "replica sync is disabled", `{"endpoint":"invalid"}`, `{"endpoint":"tcp://🚀:1"}`)
	}
	for _, p := range []string{"/reservations/nope/prefill_complete", "/reservations/%E2%9C%93%00/prefill_complete", "/reservations/..%2F..%2Fworkers/prefill_complete"} {
		cases = append(cases, c{"POST", p, "garbage \xff", "text/plain", 404, "not found"})
	}
	for _, p := range []string{"/reservations/nope", "/reservations/%F0%9F%9A%80", "/workers/abc", "/workers/-1", "/workers/99"} {
		cases = append(cases, c{"DELETE", p, nil, "-", 0, ""})
	}
	for _, p := range []string{"/workers?model_name=%ZZ&routing_group=%F0%9F", "/loads?model_name=%00&model_name=x", "/workers?model_name=" + strings.Repeat("x", 4000),
		"/nope", "/reservations", "/select/", "/workers/1/x"} {
		cases = append(cases, c{"GET", p, nil, "-", 0, ""})
	}

	for i, tc := range cases {
		before := a.state()
		var hdr []string
		switch tc.ct {
		case "":
		case "-":
			hdr = []string{"Content-Type", ""}
		default:
			hdr = []string{"Content-Type", tc.ct}
		}
		body := tc.body
		if r, ok := body.(onlyReader); ok {
			r.Reader.(*bytes.Reader).Seek(0, io.SeekStart)
		}
		r := a.do(tc.method, tc.path, body, hdr...)
		name := func() string {
			s := ""
			switch b := tc.body.(type) {
			case string:
				s = b
			case []byte:
				s = "<" + itoa(uint64(len(b))) + " bytes>"
			case onlyReader:
				s = "<chunked big body>"
			}
			if len(s) > 120 {
				s = s[:120] + "…"
			}
			return tc.method + " " + tc.path + " " + s
		}
		if r.status >= 500 && !(r.status == 503 && tc.status == 503) {
			t.Errorf("case %d %s: %d %s", i, name(), r.status, r.raw)
			continue
		}
		if tc.status != 0 && r.status != tc.status {
			t.Errorf("case %d %s: status %d, want %d (%s)", i, name(), r.status, tc.status, r.raw)
			continue
		}
		if tc.frag != "" && !strings.Contains(r.errText(), tc.frag) {
			t.Errorf("case %d %s: error %q lacks %q", i, name(), r.errText(), tc.frag)
		}
		if r.status >= 400 && r.errText() == "" {
			t.Errorf("case %d %s: %d without an error envelope: %s", i, name(), r.status, r.raw)
		}
		if r.status >= 400 {
			if after := a.state(); after != before {
				t.Errorf("case %d %s: rejected (%d) but state changed:\n%s\n->\n%s", i, name(), r.status, before, after)
			}
		} else if r.status < 300 && (tc.method == "POST" && strings.HasPrefix(tc.path, "/select_and_reserve")) {
			if id, _ := r.obj()["selection_id"].(string); id != "" && id != "live" {
				a.do("DELETE", "/reservations/"+pathEscape(id), nil).want(t, 200, "")
			}
		}
	}
	t.Logf("%d bad-input cases", len(cases))
}

func pathEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(string("0123456789abcdef"[c>>4])+string("0123456789abcdef"[c&15])))
		}
	}
	return b.String()
}

// TestHugeISLIsNotAServerError: isl_tokens is a u64 on the wire (Dynamo's
// usize); values beyond selection's supported maximum are a 400, never a 500.
func TestHugeISLIsNotAServerError(t *testing.T) {
	a := newAPI(t, nil, Options{})
	a.addWorker(1)
	for _, isl := range []string{"9223372036854775808", "18446744073709551615"} {
		r := a.do("POST", "/reservations", `{"model_name":"model","selection_id":"x","worker_id":1,"sequence_hashes":[1],"isl_tokens":`+isl+`}`)
		if r.status >= 500 {
			t.Errorf("isl_tokens %s: %d %s", isl, r.status, r.raw)
		}
	}
}

// TestLongSessionIDOnlyMattersWithAffinity: the 256-byte limit belongs to the
// session affinity table, which only exists when session affinity is on (a
// TTL is configured; a longer id is then a 400, as in Dynamo); without it a
// session id is only policy input.
func TestLongSessionIDOnlyMattersWithAffinity(t *testing.T) {
	body := `{"model_name":"model","token_ids":[1,2,3,4],"session_id":"` + strings.Repeat("é", 129) + `"}`
	on := newAPI(t, func(c *routerconfig.Config) { c.SessionAffinityTTL = routerconfig.Some(time.Minute) }, Options{})
	on.addWorker(1)
	for _, p := range []string{"/select", "/select_and_reserve"} {
		if r := on.do("POST", p, body); r.status != 400 || !strings.Contains(string(r.raw), "session affinity ID must not exceed 256 bytes") {
			t.Fatalf("%s with affinity: %d %s", p, r.status, r.raw)
		}
	}
	off := newAPI(t, nil, Options{})
	off.addWorker(1)
	if r := off.do("POST", "/select", body); r.status != 200 {
		t.Fatalf("/select without affinity: %d %s", r.status, r.raw)
	}
}
