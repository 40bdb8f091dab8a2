package extproc

import (
	"reflect"
	"testing"

	json "github.com/goccy/go-json"
)

// TestWithModelKeepsEverythingElse: only the top-level "model" value changes;
// nested "model" members, strings that contain it, escapes and the layout stay.
func TestWithModelKeepsEverythingElse(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"llama","prompt":[1,2,3]}`, `{"model":"lora \"v2\"","prompt":[1,2,3]}`},
		{"{ \"prompt\" : \"say \\\"model\\\": x\",\n \"model\" :\t\"llama\" , \"n\":1e3}", "{ \"prompt\" : \"say \\\"model\\\": x\",\n \"model\" :\t\"lora \\\"v2\\\"\" , \"n\":1e3}"},
		{`{"messages":[{"role":"user","model":"inner"}],"nvext":{"model":{"a":[1,{"b":"}"}]}},"model":"llama"}`,
			`{"messages":[{"role":"user","model":"inner"}],"nvext":{"model":{"a":[1,{"b":"}"}]}},"model":"lora \"v2\""}`},
		{`{"mod\u0065l":"llama","stream":true}`, `{"mod\u0065l":"lora \"v2\"","stream":true}`},
		{`{"model":null}`, `{"model":"lora \"v2\""}`},
	} {
		got, err := withModel([]byte(tc.in), `lora "v2"`)
		if err != nil || string(got) != tc.want {
			t.Errorf("withModel(%s) = %s, %v\nwant %s", tc.in, got, err, tc.want)
			continue
		}
		// The same document but for the model, as a decoder reads it.
		var a, b map[string]any
		if json.Unmarshal([]byte(tc.in), &a) != nil || json.Unmarshal(got, &b) != nil {
			t.Fatalf("not JSON: %s", got)
		}
		if b["model"] != `lora "v2"` {
			t.Errorf("%s: model %v", got, b["model"])
		}
		delete(a, "model")
		delete(b, "model")
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: other members changed: %v vs %v", got, a, b)
		}
	}
	for _, bad := range []string{`[1,2]`, `{"prompt":"x"}`, `{"model":"x"`, `"model"`} {
		if _, err := withModel([]byte(bad), "m"); err == nil {
			t.Errorf("withModel(%s): no error", bad)
		}
	}
}
