package extproc

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
)

// TestReadSelectInput: what a request's headers, body and subset hint make
// of its selection request, without a stream: which source identifies the
// prompt, the model's and session's sources, the flow control fields, the
// restriction and the selection id, and the client errors.
func TestReadSelectInput(t *testing.T) {
	objectives := new(flow.Objectives)
	objectives.Set(flow.SourceFile, map[string]int{"interactive": 7})
	str := func(s string) *string { return &s }
	u32 := func(v uint32) *uint32 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	num := func(v int) *int { return &v }
	f64 := func(v float64) *float64 { return &v }
	post := []string{":method", "POST", ":path", "/v1/completions"}

	cases := []struct {
		name    string
		headers []string // key, value, key, value...
		subset  []string // with hasSubset
		body    string
		opts    Options

		want          selection.SelectRequest
		tokenize      bool
		fromRequestID bool
		restrict      *restriction
		unknown       string
		err           string // a fragment of the 400's message
	}{
		{name: "hash headers win over token ids and the body",
			headers: append(post, HeaderModelName, "llama", HeaderBlockHashes, "1,-2", HeaderSequenceHashes, "3,18446744073709551615",
				HeaderISLTokens, "8", HeaderTokenIDs, "9,9"),
			body: `{"model":"other","prompt":[1,2,3]}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{BlockHashes: []int64{1, -2}, SequenceHashes: []int64{3, -1}, ISLTokens: u64(8)}}},
		{name: "any hash header takes the hash path",
			headers: append(post, HeaderISLTokens, "8", HeaderTokenIDs, "9,9"),
			body:    `{"model":"llama","prompt":[1,2,3]}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{ISLTokens: u64(8)}}},
		{name: "token ids header over the body's ids",
			headers: append(post, HeaderTokenIDs, "9, 8,7"),
			body:    `{"model":"llama","prompt":[1,2,3]}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{9, 8, 7}}}},
		{name: "completions prompt ids",
			headers: post, body: `{"model":"llama","prompt":[1,2,3],"nvext":{"token_data":[5]}}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1, 2, 3}}}},
		{name: "nvext token data over the prompt text",
			headers: post, body: `{"model":"llama","prompt":"hello","nvext":{"token_data":[5,6]}}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{5, 6}}}},
		{name: "prompt text, for the tokenizer",
			headers: post, body: `{"model":"llama","prompt":"hello"}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{PromptText: "hello"}},
			tokenize: true},
		{name: "chat text",
			headers: post, body: `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{PromptText: chatText(t, `[{"role":"user","content":"hi"}]`)}},
			tokenize: true},
		{name: "nothing identifies the prompt: method and path",
			headers: []string{":method", "GET", ":path", "/v1/models"},
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{PromptText: "GET /v1/models"}}},
		{name: "model: header over body",
			headers: append(post, HeaderModelName, "from-header"), body: `{"model":"from-body","prompt":[1]}`, opts: Options{DefaultModel: "fallback"},
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "from-header"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}}},
		{name: "model: body over the default",
			headers: post, body: `{"model":"from-body","prompt":[1]}`, opts: Options{DefaultModel: "fallback"},
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "from-body"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}}},
		{name: "model: the default without header or body",
			headers: append(post, HeaderTokenIDs, "1"), opts: Options{DefaultModel: "fallback"},
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "fallback"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}}},
		{name: "session, output length, lora, salt and group from headers",
			headers: append(post, HeaderSessionID, "s-hdr", HeaderExpectedOutputTokens, "64", HeaderLoraName, "adapter",
				HeaderCacheSalt, "salt", HeaderRoutingGroup, "decode"),
			body: `{"model":"llama","prompt":[1],"nvext":{"session_control":{"session_id":"s-body"},"agent_hints":{"osl":9}}}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama", RoutingGroup: "decode"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}, LoraName: str("adapter"), CacheSalt: str("salt")},
				SessionID:     str("s-hdr"), ExpectedOutputTokens: u32(64)}},
		{name: "session and output length from nvext",
			headers: post, body: `{"model":"llama","prompt":[1],"nvext":{"session_control":{"session_id":"s-body"},"agent_hints":{"osl":9}}}`,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, SessionID: str("s-body"), ExpectedOutputTokens: u32(9)}},
		{name: "options: fallbacks and disaggregation",
			headers: append(post, HeaderTokenIDs, "1"), opts: Options{Fallbacks: 2, Disaggregate: true},
			want: selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, Fallbacks: 2, Disaggregated: true}},
		{name: "selection id header over x-request-id",
			headers: append(post, HeaderTokenIDs, "1", HeaderSelectionID, "sel", HeaderRequestID, "req"),
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, SelectionID: str("sel")}},
		{name: "x-request-id as the selection id",
			headers:       append(post, HeaderTokenIDs, "1", HeaderRequestID, "req"),
			want:          selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, SelectionID: str("req")},
			fromRequestID: true},
		{name: "priority header over the objective's",
			headers: append(post, HeaderTokenIDs, "1", HeaderPriority, " -3 ", HeaderObjective, "interactive", HeaderFairnessID, "team-a"),
			opts:    Options{Objectives: objectives},
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, Priority: num(-3), Tenant: "team-a"}},
		{name: "objective's priority",
			headers: append(post, HeaderTokenIDs, "1", HeaderObjective, "interactive"), opts: Options{Objectives: objectives},
			want: selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, Priority: num(7)}},
		{name: "unknown objective: priority 0, reported",
			headers: append(post, HeaderTokenIDs, "1", HeaderObjective, "nobody"), opts: Options{Objectives: objectives},
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}},
			unknown: "nobody"},
		{name: "subset hint",
			headers: append(post, HeaderTokenIDs, "1", HeaderTestPick, "10.0.0.9"), subset: []string{"10.0.0.1:8000"},
			want:     selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}},
			restrict: &restriction{entries: []string{"10.0.0.1:8000"}, what: "subset hint"}},
		{name: "empty subset hint still restricts",
			headers: append(post, HeaderTokenIDs, "1"), subset: []string{},
			want:     selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}},
			restrict: &restriction{entries: []string{}, what: "subset hint"}},
		{name: "test pick header over the subset hint, when enabled",
			headers: append(post, HeaderTokenIDs, "1", HeaderTestPick, "10.0.0.9,10.0.0.8:80"), subset: []string{"10.0.0.1:8000"},
			opts:     Options{TestPickHeader: true},
			want:     selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}},
			restrict: &restriction{entries: []string{"10.0.0.9", "10.0.0.8:80"}, what: HeaderTestPick}},
		{name: "body size counts the whole body",
			headers: post, body: `{"model":"llama", "prompt":[1]}  `,
			want: selection.SelectRequest{PartitionKey: selection.PartitionKey{ModelName: "llama"},
				PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}}},
		{name: "malformed body", headers: post, body: `{"model":`, err: "invalid request body"},
		{name: "prompt of the wrong type", headers: post, body: `{"prompt":{}}`, err: "prompt must be"},
		{name: "priority not an integer", headers: append(post, HeaderPriority, "high"), err: HeaderPriority},
		{name: "latency objectives, llm-d's names",
			headers: append(post, HeaderTokenIDs, "1", HeaderSLOTTFT, "250", HeaderSLOTPOT, " 12.5 "),
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, SLOTTFTMs: f64(250), SLOTPOTMs: f64(12.5)}},
		{name: "latency objectives, the older names",
			headers: append(post, HeaderTokenIDs, "1", HeaderSLOTTFTLegacy, "300", HeaderSLOTPOTLegacy, "20"),
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, SLOTTFTMs: f64(300), SLOTPOTMs: f64(20)}},
		{name: "latency objectives: the current name wins",
			headers: append(post, HeaderTokenIDs, "1", HeaderSLOTTFTLegacy, "300", HeaderSLOTTFT, "100"),
			want:    selection.SelectRequest{PromptRequest: selection.PromptRequest{TokenIDs: []uint32{1}}, SLOTTFTMs: f64(100)}},
		{name: "latency objective not a number", headers: append(post, HeaderSLOTTFT, "fast"), err: HeaderSLOTTFT},
		{name: "latency objective not positive", headers: append(post, HeaderSLOTPOTLegacy, "-1"), err: HeaderSLOTPOTLegacy},
		{name: "latency objective infinite", headers: append(post, HeaderSLOTTFT, "+Inf"), err: "positive number of milliseconds"},
		{name: "priority out of range", headers: append(post, HeaderPriority, "1000000000"), err: "out of range"},
		{name: "tenant with a control character", headers: append(post, HeaderFairnessID, "a\x01b"), err: HeaderFairnessID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var id identity
			if err := readHeaders(headerMap(tc.headers), &id, DefaultSessionHeaders()); err != nil {
				t.Fatalf("headers: %v", err)
			}
			id.subset, id.hasSubset = tc.subset, tc.subset != nil
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			in, err := readSelectInput(&id, body, &tc.opts)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Flow control's byte limits count the whole body, as received.
			want := tc.want
			want.RequestBytes = len(tc.body)
			want.FromPicker = true // the picker front's policy
			if !reflect.DeepEqual(in.req, want) {
				t.Errorf("request\n got %s\nwant %s", describe(&in.req), describe(&want))
			}
			if in.tokenize != tc.tokenize || in.fromRequestID != tc.fromRequestID || in.unknownObjective != tc.unknown {
				t.Errorf("tokenize %v, from x-request-id %v, unknown objective %q; want %v, %v, %q",
					in.tokenize, in.fromRequestID, in.unknownObjective, tc.tokenize, tc.fromRequestID, tc.unknown)
			}
			if !reflect.DeepEqual(in.restrict, tc.restrict) {
				t.Errorf("restriction %+v, want %+v", in.restrict, tc.restrict)
			}
		})
	}
}

func headerMap(kv []string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

func chatText(t *testing.T, messages string) string {
	t.Helper()
	var m []selection.ChatMessage
	if err := json.Unmarshal([]byte(messages), &m); err != nil {
		t.Fatal(err)
	}
	s, err := selection.ChatText(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// describe shows a request's wire fields and the fields the wire leaves out.
func describe(r *selection.SelectRequest) string {
	b, _ := json.Marshal(r)
	return fmt.Sprintf("%s text=%q fallbacks=%d request_bytes=%d", b, r.PromptText, r.Fallbacks, r.RequestBytes)
}
