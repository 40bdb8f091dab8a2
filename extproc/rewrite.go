package extproc

import (
	"bytes"
	"cmp"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	json "github.com/goccy/go-json"

	"github.com/kvselect/kvselect/selection/randsrc"
)

// The model-name rewrite header of llm-d-router v0.10.0
// (pkg/epp/metadata/consts.go: ModelNameRewriteKey, and its deprecated alias
// OldModelNameRewriteKey, GIE v1.5.0's name), read when the new name is
// absent. It names the model the request is sent to when no
// InferenceModelRewrite rule matches the body's model: llm-d's director
// (pkg/epp/requestcontrol/director.go, modelRewriteIfNeeded) takes the
// header's name first and lets a matching rule's weighted target replace
// it. Both names are stripped before the worker, as llm-d strips its input
// control headers (pkg/epp/util/request/headers.go).
const (
	HeaderModelRewrite       = "x-llm-d-model-name-rewrite"
	HeaderModelRewriteLegacy = "x-gateway-model-name-rewrite"
)

// modelRewrite is a request's rewrite: the body named from, the worker gets
// to. Zero when the request keeps its model.
type modelRewrite struct {
	from, to string
}

// newRewriteSource is the random source of the rewrite draws of requests
// without a session: Options.Rand when set (tests), else one seeded from
// the system's entropy.
func newRewriteSource(r *rand.Rand) *randsrc.Source {
	if r == nil {
		var seed [32]byte
		_, _ = crand.Read(seed[:]) // never fails (crypto/rand's contract)
		r = rand.New(rand.NewChaCha8(seed))
	}
	return randsrc.New(r)
}

// rewriteModel gives the request the model the pool's InferenceModelRewrite
// rules (Options.Rewrites) or the rewrite header choose for the body's model:
// it names the partition (unless x-kvselect-model-name names one) and
// replaces the body's "model" for the engine. A request with a session (any
// of Options.SessionHeaders, else the body's) draws its rule's target from
// the session id (selection/rewrite), so a conversation stays on one model.
// Only a body the picker holds and sends on can be rewritten
// (FULL_DUPLEX_STREAMED, BUFFERED): without one the request keeps its model
// and the header is only stripped.
func (st *stream) rewriteModel(in *selectInput, withBody bool) error {
	from := in.body.model
	if !withBody || from == "" {
		return nil
	}
	to := cmp.Or(st.id.modelRewrite, st.id.modelRewriteLegacy)
	session := ""
	switch {
	case in.req.SessionID != nil:
		session = *in.req.SessionID
	case in.req.SessionContext != nil: // a session with a parent or a final flag
		session = in.req.SessionContext.SessionID
	}
	if c, ok := st.s.opts.Rewrites.Table().Choose(from, session, st.s.rewriteRand.Uint64); ok {
		to = c.Model
		st.s.log.Debug("extproc: model rewrite", "model", from, "target", to, "rewrite", c.Object, "sticky", c.Sticky)
	}
	if to == "" || to == from {
		return nil
	}
	body, err := withModel(st.body, to)
	if err != nil {
		return immediate(typev3.StatusCode_BadRequest, fmt.Sprintf("%v: rewriting model: %v", errBadBody, err))
	}
	st.body, in.req.RequestBytes = body, len(body)
	if st.id.model == "" {
		in.req.ModelName = to
	}
	st.rewrite = modelRewrite{from: from, to: to}
	return nil
}

// bufferedBody puts a rewritten body into a BUFFERED routing decision, with
// its length: in BUFFERED mode Envoy keeps content-length and rejects a body
// mutation whose length it does not match (BodySendMode's documentation in
// envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto).
// FULL_DUPLEX_STREAMED sends the body itself (pickAndRoute).
func (st *stream) bufferedBody(r *extprocv3.ProcessingResponse, mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	if st.rewrite.to == "" {
		return r
	}
	c := r.GetRequestBody().GetResponse()
	c.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: st.body}}
	mut.SetHeaders = append(mut.SetHeaders, setHeader("content-length", fmt.Sprint(len(st.body))))
	return r
}

// restoreModel puts the client's model name back into a response chunk where
// the engine wrote the rewritten one, as llm-d-router v0.10.0 does
// (pkg/epp/handlers/server.go, rewriteModelName): `"model":"<to>"`, with or
// without a space after the colon. Like llm-d's, a name split across two
// chunks stays as the engine wrote it. Used where the picker echoes the
// response (FULL_DUPLEX_STREAMED), a mode in which Envoy removes
// content-length (processing_mode.proto), so the length may change.
func (st *stream) restoreModel(chunk []byte) []byte {
	if st.rewrite.to == "" || len(chunk) == 0 {
		return chunk
	}
	to, err1 := json.Marshal(st.rewrite.to)
	from, err2 := json.Marshal(st.rewrite.from)
	if err1 != nil || err2 != nil {
		return chunk
	}
	for _, sep := range []string{`"model":`, `"model": `} {
		old := append([]byte(sep), to...)
		if bytes.Contains(chunk, old) {
			chunk = bytes.ReplaceAll(chunk, old, append([]byte(sep), from...))
		}
	}
	return chunk
}

// errNotJSONObject: the body is not the JSON object parseBody accepted.
var errNotJSONObject = errors.New("not a JSON object")

// withModel returns body with the value of every top-level "model" member
// replaced by model as a JSON string; every other byte stays as the client
// sent it (the keys' order, numbers' spelling, whitespace), so the engine
// gets the request it was sent but for the model. One pass over the bytes:
// bodies of token ids run to megabytes.
func withModel(body []byte, model string) ([]byte, error) {
	spans, err := memberValues(body, "model")
	if err != nil {
		return nil, err
	}
	v, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	if len(spans) == 0 {
		return nil, errors.New(`no top-level "model"`)
	}
	out := make([]byte, 0, len(body)+len(v)*len(spans))
	last := 0
	for _, s := range spans {
		out = append(out, body[last:s[0]]...)
		out = append(out, v...)
		last = s[1]
	}
	return append(out, body[last:]...), nil
}

// memberValues returns the [start, end) offsets of the values of the
// top-level members of the JSON object b named key.
func memberValues(b []byte, key string) ([][2]int, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, errNotJSONObject
	}
	var out [][2]int
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, errNotJSONObject
		}
		kEnd, err := stringEnd(b, i)
		if err != nil {
			return nil, err
		}
		k := b[i:kEnd]
		i = skipSpace(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return nil, errNotJSONObject
		}
		i = skipSpace(b, i+1)
		vEnd, err := valueEnd(b, i)
		if err != nil {
			return nil, err
		}
		if keyIs(k, key) {
			out = append(out, [2]int{i, vEnd})
		}
		i = skipSpace(b, vEnd)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return out, nil
		default:
			return nil, errNotJSONObject
		}
	}
}

// keyIs compares a quoted JSON key with key, unescaping only when it must.
func keyIs(quoted []byte, key string) bool {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return string(quoted[1:len(quoted)-1]) == key
	}
	var k string
	return json.Unmarshal(quoted, &k) == nil && k == key
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the offset after the string that opens at b[i].
func stringEnd(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errNotJSONObject
}

// valueEnd returns the offset after the value that starts at b[i].
func valueEnd(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errNotJSONObject
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, err := stringEnd(b, j)
				if err != nil {
					return 0, err
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errNotJSONObject
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return 0, errNotJSONObject
	}
	return j, nil
}
