package tokenize

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/kvselect/kvselect/selection"
)

// Template probe states.
const (
	tplProbing = iota
	tplUsable
	tplUnusable
)

// template is what the probe learned of one chat template (package doc).
type template struct {
	mu     sync.Mutex
	state  int
	head   []uint32 // ids a conversation starts with whatever its messages
	gen    []uint32 // ids add_generation_prompt appends
	reason string   // why it is unusable
	// retryAt: a probe the engine could not answer is tried again after it.
	retryAt time.Time
}

// probeRetry is how long a template whose probe failed on an engine error
// waits before the next probe.
const probeRetry = 10 * time.Second

// usable returns the head and generation prompt when conversation prefixes
// may be reused; a nil template is not usable.
func (p *template) usable() (head, gen []uint32, ok bool) {
	if p == nil {
		return nil, nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.head, p.gen, p.state == tplUsable
}

func (p *template) fail(reason string) {
	p.mu.Lock()
	p.state, p.reason = tplUnusable, reason
	p.mu.Unlock()
}

func (t *Tokenizer) lookupTemplate(rk reqKeys) *template {
	if !rk.chat {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.templates[rk.tmpl]
}

// template returns the request's template, starting its probe the first
// time it is seen.
func (t *Tokenizer) template(req *selection.TokenizeRequest, rk reqKeys) *template {
	t.mu.Lock()
	p, ok := t.templates[rk.tmpl]
	if ok {
		p.mu.Lock()
		retry := !p.retryAt.IsZero() && time.Now().After(p.retryAt)
		if retry {
			p.state, p.retryAt = tplProbing, time.Time{}
		}
		p.mu.Unlock()
		if !retry {
			t.mu.Unlock()
			return p
		}
	} else if len(t.templates) >= maxTemplates {
		t.mu.Unlock()
		return nil
	} else {
		p = &template{state: tplProbing}
		t.templates[rk.tmpl] = p
	}
	t.mu.Unlock()
	var opts []selection.TokenizeOption
	for _, o := range req.Options {
		if o.Name != "add_generation_prompt" && o.Name != "continue_final_message" {
			opts = append(opts, o)
		}
	}
	go t.probe(p, req.PartitionKey, opts)
	return p
}

// probeContents provoke merges at message borders: whitespace and newlines
// on either side, punctuation, digits, quotes, non-Latin scripts.
var probeContents = [...]string{
	"Hello there.", "line one\nline two\n", "  leading spaces", "trailing space ", "ends with blank lines\n\n",
	"12345", "\"quoted\"", "数字とテキスト", "a", "end.\n",
}

var probeRoles = [...]string{"system", "user", "assistant", "user", "assistant", "user"}

// probe checks the template (package doc) with two conversations whose
// contents differ at every border.
func (t *Tokenizer) probe(p *template, part selection.PartitionKey, opts []selection.TokenizeOption) {
	head, gen, err := t.probeTemplate(part, opts)
	p.mu.Lock()
	defer p.mu.Unlock()
	if fe, ok := errors.AsType[*FallbackError](err); ok {
		p.state, p.reason, p.retryAt = tplUnusable, err.Error(), time.Now().Add(probeRetry)
		t.log.Warn("tokenize: chat template probe could not ask the engine; retrying later", "model", part.ModelName, "reason", fe.Reason, "err", fe.Err)
		return
	}
	if err != nil {
		p.state, p.reason = tplUnusable, err.Error()
		t.log.Info("tokenize: chat template not reusable at message borders; whole-request cache only",
			"model", part.ModelName, "reason", err.Error())
		return
	}
	p.state, p.head, p.gen = tplUsable, head, gen
	t.log.Info("tokenize: chat template reusable at message borders", "model", part.ModelName,
		"head_tokens", len(head), "generation_prompt_tokens", len(gen))
}

func (t *Tokenizer) probeTemplate(part selection.PartitionKey, opts []selection.TokenizeOption) (head, gen []uint32, err error) {
	ask := func(msgs [][]byte, addGen bool) ([]uint32, error) {
		o := append(append([]selection.TokenizeOption(nil), opts...),
			selection.TokenizeOption{Name: "add_generation_prompt", Value: []byte(strconv.FormatBool(addGen))})
		ctx, cancel := context.WithTimeout(t.ctx, probeTimeout)
		defer cancel()
		t.m.probeCalls.Add(1)
		return t.engine(ctx, &selection.TokenizeRequest{PartitionKey: part, Messages: msgs, Options: o})
	}
	first := true
	for round := range 2 {
		msgs := make([][]byte, len(probeRoles))
		for i, role := range probeRoles {
			content := probeContents[(i+round*len(probeRoles)/2+round)%len(probeContents)]
			msgs[i] = []byte(`{"role":` + jsonString(role) + `,"content":` + jsonString(content) + `}`)
		}
		whole, err := ask(msgs, false)
		if err != nil {
			return nil, nil, err
		}
		withGen, err := ask(msgs, true)
		if err != nil {
			return nil, nil, err
		}
		if len(withGen) < len(whole) || !equal(withGen[:len(whole)], whole) {
			return nil, nil, fmt.Errorf("the generation prompt is not a suffix")
		}
		g := withGen[len(whole):]
		if !first && !equal(g, gen) {
			return nil, nil, fmt.Errorf("the generation prompt depends on the conversation")
		}
		gen = g
		for j := 1; j < len(msgs); j++ {
			a, err := ask(msgs[:j], false)
			if err != nil {
				return nil, nil, err
			}
			b, err := ask(msgs[j:], false)
			if err != nil {
				return nil, nil, err
			}
			h := len(a) + len(b) - len(whole)
			switch {
			case h < 0 || h > len(b) || len(a) > len(whole):
				return nil, nil, fmt.Errorf("split at message %d changes the length", j)
			case !equal(a, whole[:len(a)]) || !equal(b[h:], whole[len(a):]):
				return nil, nil, fmt.Errorf("split at message %d changes the ids", j)
			case !first && !equal(b[:h], head):
				return nil, nil, fmt.Errorf("the head differs between splits")
			}
			head, first = b[:h], false
			if j == len(msgs)-1 {
				bg, err := ask(msgs[j:], true)
				if err != nil {
					return nil, nil, err
				}
				if !equal(bg, append(append([]uint32(nil), b...), gen...)) {
					return nil, nil, fmt.Errorf("the generation prompt differs on a tail")
				}
			}
		}
	}
	return head, gen, nil
}
