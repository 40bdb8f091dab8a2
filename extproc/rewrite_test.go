package extproc_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	json "github.com/goccy/go-json"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/rewrite"
)

// canaryWorkers serve the base model (workers 1, 2) and its LoRA canary
// (3, 4), each model a partition of its own.
func canaryWorkers() []catalog.Record {
	ws := fourWorkers()
	for i := range ws {
		ws[i].ModelName = "llama-base"
		if i >= 2 {
			ws[i].ModelName = "llama-lora-v2"
		}
	}
	return ws
}

// canaryRules split the model "llama" 90/10 between the base and the canary.
func canaryRules() *rewrite.Rules {
	w := func(v int32) *int32 { return &v }
	r := &rewrite.Rules{}
	r.Set(rewrite.NewTable([]rewrite.Object{{Name: "llama-canary", Created: time.Unix(0, 0), Rules: []rewrite.Rule{{
		Models:  []string{"llama"},
		Targets: []rewrite.Target{{Model: "llama-base", Weight: w(90)}, {Model: "llama-lora-v2", Weight: w(10)}},
	}}}}))
	return r
}

func startCanary(t *testing.T) *harness {
	return start(t, setup{workers: canaryWorkers(), opts: extproc.Options{Rewrites: canaryRules(), Rand: rand.New(rand.NewPCG(5, 6))}})
}

// sent is where a decision sends the request: the model of the worker it
// chose, and the model the body forwarded to it names.
func sent(t *testing.T, d *envoysim.Decision) (partition, body string) {
	t.Helper()
	if d.Immediate != nil {
		t.Fatalf("immediate response %d %s", d.Immediate.Status, d.Immediate.Body)
	}
	id, _ := strconv.Atoi(workerIDOf(d))
	partition = "llama-base"
	if id >= 3 {
		partition = "llama-lora-v2"
	}
	var b struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(d.Body, &b); err != nil {
		t.Fatalf("forwarded body %q: %v", d.Body, err)
	}
	if cl := d.SetHeaders["content-length"]; cl != strconv.Itoa(len(d.Body)) {
		t.Fatalf("content-length %q for a body of %d bytes", cl, len(d.Body))
	}
	return partition, b.Model
}

func routeOnce(t *testing.T, h *harness, modes envoysim.Modes, body []byte, headers ...envoysim.Header) *envoysim.Decision {
	t.Helper()
	x, d := h.start(t, &envoysim.Request{Body: body, Modes: modes, Headers: headers})
	x.Close()
	return d
}

// TestModelRewriteCanaryWeights: 1,000 requests for "llama" without a
// session split 90/10 between the base and the canary (within a binomial
// bound), each routed to its target's partition with the body's model
// rewritten and content-length matching.
func TestModelRewriteCanaryWeights(t *testing.T) {
	h := startCanary(t)
	counts := map[string]int{}
	const n = 1000
	for i := range n {
		d := routeOnce(t, h, envoysim.GIE, fmt.Appendf(nil, `{"model": "llama", "prompt": [%d, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 4}`, i))
		partition, model := sent(t, d)
		if partition != model {
			t.Fatalf("request %d: routed to %s, body says %s", i, partition, model)
		}
		counts[model]++
	}
	mean, sd := n*0.1, math.Sqrt(n*0.1*0.9)
	if got := float64(counts["llama-lora-v2"]); counts["llama-base"]+counts["llama-lora-v2"] != n || math.Abs(got-mean) > 5*sd {
		t.Errorf("split %v, want llama-lora-v2 %.0f ± %.0f", counts, mean, 5*sd)
	}
	h.idle(t)
}

// TestModelRewriteStickyPerSession: every request of a session goes to one
// target; the sessions, too, split by the weights.
func TestModelRewriteStickyPerSession(t *testing.T) {
	h := startCanary(t)
	counts := map[string]int{}
	const sessions = 300
	for s := range sessions {
		session := envoysim.Header{Key: extproc.HeaderSessionID, Value: fmt.Sprintf("chat-%d", s)}
		var first string
		for turn := range 3 {
			d := routeOnce(t, h, envoysim.GIE, fmt.Appendf(nil, `{"model":"llama","messages":[{"role":"user","content":"turn %d of %d"}]}`, turn, s), session)
			partition, model := sent(t, d)
			if partition != model || (turn > 0 && model != first) {
				t.Fatalf("session %d turn %d: routed to %s with body model %s, first turn %s", s, turn, partition, model, first)
			}
			first = model
		}
		counts[first]++
	}
	mean, sd := sessions*0.1, math.Sqrt(sessions*0.1*0.9)
	if got := float64(counts["llama-lora-v2"]); math.Abs(got-mean) > 5*sd {
		t.Errorf("sessions %v, want llama-lora-v2 %.0f ± %.0f", counts, mean, 5*sd)
	}
}

// TestModelRewriteHeader: x-llm-d-model-name-rewrite (or GIE's older name)
// names the target of a model no rule matches; a rule that matches wins over
// it, as in llm-d-router v0.10.0's director; both names are stripped, and the
// older one is counted as deprecated.
func TestModelRewriteHeader(t *testing.T) {
	h := startCanary(t)
	header := func(k, v string) envoysim.Header { return envoysim.Header{Key: k, Value: v} }
	for _, tc := range []struct {
		name    string
		model   string
		headers []envoysim.Header
		want    string
	}{
		{"the header, no rule", "mistral", []envoysim.Header{header(extproc.HeaderModelRewrite, "llama-lora-v2")}, "llama-lora-v2"},
		{"the older name", "mistral", []envoysim.Header{header(extproc.HeaderModelRewriteLegacy, "llama-lora-v2")}, "llama-lora-v2"},
		{"the new name over the older", "mistral", []envoysim.Header{
			header(extproc.HeaderModelRewriteLegacy, "llama-lora-v2"), header(extproc.HeaderModelRewrite, "llama-base")}, "llama-base"},
		// The canary's rule sends this draw's session to the base.
		{"a matching rule over the header", "llama", []envoysim.Header{
			header(extproc.HeaderModelRewrite, "llama-lora-v2"), header(extproc.HeaderSessionID, "chat-0")}, "llama-base"},
	} {
		d := routeOnce(t, h, envoysim.GIE, fmt.Appendf(nil, `{"model":%q,"prompt":"hello"}`, tc.model), tc.headers...)
		partition, model := sent(t, d)
		if partition != tc.want || model != tc.want {
			t.Errorf("%s: routed to %s, body model %s, want %s", tc.name, partition, model, tc.want)
		}
		for _, hn := range []string{extproc.HeaderModelRewrite, extproc.HeaderModelRewriteLegacy} {
			if !slices.Contains(d.RemovedHeaders, hn) {
				t.Errorf("%s: %s not stripped (removed %v)", tc.name, hn, d.RemovedHeaders)
			}
		}
	}
	wantSeries(t, h.srv, map[string]float64{`kvselect_extproc_deprecated_headers_total{header=x-gateway-model-name-rewrite}`: 2})
}

// TestModelRewriteBuffered: in BUFFERED mode the rewritten body replaces the
// client's in the body response, with its content-length.
func TestModelRewriteBuffered(t *testing.T) {
	h := startCanary(t)
	body := []byte(`{"model":"mistral","prompt":[1,2,3,4],"stream":false}`)
	d := routeOnce(t, h, envoysim.Modes{Request: envoysim.Buffered, Response: envoysim.Buffered}, body,
		envoysim.Header{Key: extproc.HeaderModelRewrite, Value: "llama-lora-v2"})
	partition, model := sent(t, d)
	if partition != "llama-lora-v2" || model != "llama-lora-v2" || string(d.Body) != `{"model":"llama-lora-v2","prompt":[1,2,3,4],"stream":false}` {
		t.Fatalf("routed to %s, body %s", partition, d.Body)
	}
}

// TestModelRewriteRestoresTheResponseModel: the response the engine writes
// under the target's name reaches the client under the name it asked for, as
// llm-d-router v0.10.0 does.
func TestModelRewriteRestoresTheResponseModel(t *testing.T) {
	h := startCanary(t)
	x, d := h.start(t, &envoysim.Request{Body: []byte(`{"model":"mistral","prompt":"hi","stream":true}`), Modes: envoysim.GIE,
		Headers: []envoysim.Header{{Key: extproc.HeaderModelRewrite, Value: "llama-lora-v2"}}})
	if _, model := sent(t, d); model != "llama-lora-v2" {
		t.Fatalf("body model %s", model)
	}
	chunks := [][]byte{
		[]byte(`data: {"id":"c","model":"llama-lora-v2","choices":[{"text":"a"}]}` + "\n\n"),
		[]byte(`data: {"id":"c","model": "llama-lora-v2","choices":[{"text":"b"}]}` + "\n\n"),
		[]byte("data: [DONE]\n\n"),
	}
	got := string(finish(t, x, d.Endpoint, chunks))
	want := `data: {"id":"c","model":"mistral","choices":[{"text":"a"}]}` + "\n\n" +
		`data: {"id":"c","model": "mistral","choices":[{"text":"b"}]}` + "\n\n" + "data: [DONE]\n\n"
	if got != want {
		t.Fatalf("client got\n%s\nwant\n%s", got, want)
	}
}
