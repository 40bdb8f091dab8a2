package httpadmin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzSelectBody drives the JSON decoding path of /select_and_reserve with
// arbitrary bodies (in process, no socket, so the fuzzer runs fast): the answer
// is always a JSON object, never a 500, a 5xx only as Dynamo's 503 for an
// unknown partition, and a rejected request books nothing.
//
//	go test -run '^$' -fuzz FuzzSelectBody -fuzztime 30s ./httpadmin/
func FuzzSelectBody(f *testing.F) {
	for _, seed := range []string{
		`{"model_name":"model","token_ids":[1,2,3,4],"selection_id":"s"}`,
		`{"token_ids":[1,2,3,4,5,6,7,8],"session_id":"x","priority_jump":1.5,"strict_priority":2}`,
		`{"model_name":"model","block_hashes":[5,6],"sequence_hashes":[-1,7],"isl_tokens":8}`,
		`{"block_hashes":[9223372036854775808],"sequence_hashes":[1],"isl_tokens":4}`,
		`{"token_ids":[1,2,3,4],"pinned_worker":{"worker_id":1,"dp_rank":0},"allowed_worker_ids":[1]}`,
		`{"token_ids":[1,2,3,4],"affinity_target":{"worker_id":18446744073709551615,"dp_rank":null}}`,
		`{"token_ids":[1,2,3,4],"session_context":{"session_id":"s","input_trigger":"tool_result","agent_headers":{"a":["b"]}}}`,
		`{"token_ids":[1,2,3,4],"router_config_override":{"overlap_score_weight":0,"router_temperature":0.5}}`,
		`{"token_ids":[1,2,3,4],"mm_routing_info":{"routing_token_ids":[1,2,3,4],"block_mm_infos":[{"mm_objects":[{"mm_hash":1,"offsets":[[0,1]]}]}]}}`,
		`{"token_ids":[1,2,3,4],"routing_constraints":{"required_taints":["a"],"preferred_taints":{"b":0.5}}}`,
		`{"token_ids":[],"cache_salt":"🚀","lora_name":"l","is_eagle":true}`,
		`{"token_ids":[1,2,`, `null`, `[]`, ``, "\xff", `{"a":{"b":{"c":[[[[[[]]]]]]}}}`,
	} {
		f.Add([]byte(seed))
	}
	svc := newService(f, nil)
	h := New(svc, Options{Logger: newDiscardLogger()})
	for _, w := range []string{
		`{"worker_id":1,"model_name":"model","endpoint":"http://w1:8000","block_size":4}`,
		`{"worker_id":2,"endpoint":"http://w2:8000","block_size":4,"data_parallel_size":2}`,
	} {
		if rec := serve(h, "POST", "/workers", []byte(w)); rec.Code != http.StatusCreated {
			f.Fatalf("worker: %d %s", rec.Code, rec.Body)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		active := func() uint64 {
			var n uint64
			for _, ml := range svc.Inspect().Loads(nil, nil) {
				for _, l := range ml.Loads {
					n += l.ActiveRequests
				}
			}
			return n
		}
		before := active()
		wd := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("HANG on %q", body)) })
		defer wd.Stop()
		rec := serve(h, "POST", "/select_and_reserve", body)
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%d body is not a JSON object: %q", rec.Code, rec.Body)
		}
		switch {
		case rec.Code == http.StatusOK:
			id, _ := out["selection_id"].(string)
			if id == "" {
				t.Fatalf("booking without selection_id: %s", rec.Body)
			}
			// Free through the API; the id travels in the path escaped.
			req := httptest.NewRequest("DELETE", "/reservations/x", nil)
			req.URL.Path, req.URL.RawPath = "/reservations/"+id, "/reservations/"+pathEscape(id)
			fr := httptest.NewRecorder()
			h.ServeHTTP(fr, req)
			if fr.Code != http.StatusOK {
				t.Fatalf("free %q: %d %s", id, fr.Code, fr.Body)
			}
		case rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable:
			t.Fatalf("%d for %q: %s", rec.Code, body, rec.Body)
		default:
			if _, ok := out["error"].(string); !ok {
				t.Fatalf("%d without an error envelope: %s", rec.Code, rec.Body)
			}
			if after := active(); after != before {
				t.Fatalf("rejected (%d) request changed active requests %d -> %d", rec.Code, before, after)
			}
		}
	})
}

func serve(h http.Handler, method, path string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
