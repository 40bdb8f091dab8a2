// Package rewrite is the model-name rewrite of an InferencePool: which model a
// request that names model M is sent to, by the pool's InferenceModelRewrite
// rules (llm-d-router v0.10.0, group llm-d.ai, version v1alpha2; GIE v1.5.0's
// inference.networking.x-k8s.io before it). A rule matches request models
// exactly, or any model when it has no matches, and splits the matching
// requests among weighted target models — a LoRA canary taking 10% of a base
// model's traffic, say.
//
// Precedence follows llm-d-router v0.10.0 (pkg/epp/datastore/
// modelrewritestore.go): a rule that names the model exactly wins over a
// rule without matches; among several, the oldest object's rule wins (then,
// for a deterministic answer where llm-d's sort is unstable, the object's
// name, then the rule's position). Only that one rule applies.
//
// Target weights follow llm-d-router's director (selectWeightedModel): a
// target's share is its weight over the sum; when some targets have weights
// and others not, the unweighted ones get nothing; when none has a weight,
// all share evenly. Unlike llm-d, which draws every request at random, a
// request with a session draws its bucket from a hash of the session id and
// the model, so every request of a session goes to the same target for as
// long as the rule does not change — a multi-turn conversation stays on one
// adapter and its KV cache. Without a session the caller's random draw
// decides.
//
// The package does no I/O: the discovery adapter builds tables from the
// cluster's objects and the front reads them.
package rewrite

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"
)

// Target is one weighted destination of a rule.
type Target struct {
	// Model is the model name the request is rewritten to.
	Model string
	// Weight is the target's share; nil when the object gave none.
	Weight *int32
}

// Rule is one rule of an InferenceModelRewrite.
type Rule struct {
	// Models are the request models the rule matches exactly; none means
	// every model (a generic rule).
	Models []string
	// Targets share the matching requests.
	Targets []Target
}

// Object is one InferenceModelRewrite of the pool.
type Object struct {
	// Name is the object's name (its namespace is the pool's).
	Name string
	// Created is the object's creation time: the older object's rule wins.
	Created time.Time
	Rules   []Rule
}

// entry is a rule with what orders it.
type entry struct {
	rule    *Rule
	object  string
	created time.Time
	index   int // the rule's position in its object
	total   int64
}

// Table answers which rule applies to a model. It is immutable once built;
// the zero value and nil have no rules.
type Table struct {
	exact   map[string]*entry // the winning exact rule per model
	generic *entry            // the winning rule without matches
	objects int
}

// NewTable builds the table of objs. Rules without targets (the CRD asks for
// at least one) and rules whose weights sum to 0 with some weighted targets
// are left out: no target could be drawn.
func NewTable(objs []Object) *Table {
	t := &Table{exact: make(map[string]*entry), objects: len(objs)}
	better := func(a, b *entry) bool { // a takes precedence over b
		if c := a.created.Compare(b.created); c != 0 {
			return c < 0
		}
		if c := cmp.Compare(a.object, b.object); c != 0 {
			return c < 0
		}
		return a.index < b.index
	}
	for i := range objs {
		o := &objs[i]
		for j := range o.Rules {
			r := &o.Rules[j]
			e := &entry{rule: r, object: o.Name, created: o.Created, index: j, total: weightSum(r.Targets)}
			if len(r.Targets) == 0 || (e.total == 0 && weighted(r.Targets)) {
				continue
			}
			if len(r.Models) == 0 {
				if t.generic == nil || better(e, t.generic) {
					t.generic = e
				}
				continue
			}
			for _, m := range r.Models {
				if cur, ok := t.exact[m]; !ok || better(e, cur) {
					t.exact[m] = e
				}
			}
		}
	}
	return t
}

// Objects is how many objects the table was built from.
func (t *Table) Objects() int {
	if t == nil {
		return 0
	}
	return t.objects
}

// Empty reports whether no rule applies to any model.
func (t *Table) Empty() bool { return t == nil || (len(t.exact) == 0 && t.generic == nil) }

// lookup returns the rule that applies to model, or nil.
func (t *Table) lookup(model string) *entry {
	if t == nil {
		return nil
	}
	if e, ok := t.exact[model]; ok {
		return e
	}
	return t.generic
}

// Choice is a rewrite decision.
type Choice struct {
	// Model is the target model.
	Model string
	// Object names the InferenceModelRewrite whose rule decided.
	Object string
	// Sticky: the bucket came from the session, not the random draw.
	Sticky bool
}

// Choose returns the target of a request for model: the bucket is a hash of
// session and model when session is not empty, else draw() (called at most
// once). ok is false when no rule applies to model.
func (t *Table) Choose(model, session string, draw func() uint64) (c Choice, ok bool) {
	e := t.lookup(model)
	if e == nil {
		return Choice{}, false
	}
	c.Object = e.object
	var x uint64
	if session != "" {
		x, c.Sticky = sessionHash(session, model), true
	} else {
		x = draw()
	}
	c.Model = pick(e.rule.Targets, e.total, x)
	return c, true
}

// pick maps x to a target by weight: unweighted targets share evenly when no
// target is weighted, and get nothing otherwise (llm-d-router's rule).
func pick(ts []Target, total int64, x uint64) string {
	if total == 0 {
		return ts[x%uint64(len(ts))].Model
	}
	bucket := int64(x % uint64(total))
	var acc int64
	for _, tg := range ts {
		if tg.Weight != nil && *tg.Weight > 0 {
			acc += int64(*tg.Weight)
		}
		if bucket < acc {
			return tg.Model
		}
	}
	return ts[len(ts)-1].Model // not reached: bucket < total
}

func weightSum(ts []Target) int64 {
	var s int64
	for _, tg := range ts {
		if tg.Weight != nil && *tg.Weight > 0 {
			s += int64(*tg.Weight)
		}
	}
	return s
}

func weighted(ts []Target) bool {
	return slices.ContainsFunc(ts, func(tg Target) bool { return tg.Weight != nil })
}

// sessionHash is FNV-1a over session, a zero byte and model, finished by
// SplitMix64's mixer so every bit of the result depends on every input byte
// (FNV's low bits alone, taken modulo a small weight sum, would not be
// uniform enough). It is stable across processes and releases: replicas
// agree, and a restart keeps sessions where they were.
func sessionHash(session, model string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(session); i++ {
		h = (h ^ uint64(session[i])) * prime
	}
	h *= prime // the separator: a zero byte
	for i := 0; i < len(model); i++ {
		h = (h ^ uint64(model[i])) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// Rules holds the current table, replaced whole by its one writer (the
// discovery adapter) and read per request. Safe for concurrent use; the zero
// value and nil have no rules.
type Rules struct {
	t atomic.Pointer[Table]
}

// Set replaces the table.
func (r *Rules) Set(t *Table) { r.t.Store(t) }

// Table returns the current table (nil before the first Set, or for nil r).
func (r *Rules) Table() *Table {
	if r == nil {
		return nil
	}
	return r.t.Load()
}
