package scheduler

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"unicode"
)

// Params are a policy's parameters by name, as a config file gives them: the
// values encoding/json decodes into an any (float64, string, bool, nil,
// []any, map[string]any). A Factory rejects a name it does not know.
type Params map[string]any

// Factory builds a policy from its parameters. It validates them and returns
// an error naming the offending parameter; nil or empty Params are the
// policy's defaults. The returned Policy must be safe for concurrent use:
// one value serves every partition of a service.
type Factory func(Params) (Policy, error)

// DefaultPolicyName is the policy a service uses unless told otherwise:
// Dynamo's cost function.
const DefaultPolicyName = "kv-cost"

// registry holds the named policies. Built-ins register in this package's
// init; a program registers its own before building a service, as grpc-go's
// balancer.Register is used. It is written at init time and read afterwards.
var registry = struct {
	sync.RWMutex
	m map[string]Factory
}{m: map[string]Factory{}}

// Register makes a policy available by name (--policy, the config file's
// policy.name). It panics when name is empty, contains a space, a comma or a
// control character (names travel in flags and comma-separated lists), or is
// already registered, or when f is nil: registration is a program's setup,
// and a clash is a programming error.
func Register(name string, f Factory) {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == ',' }) {
		panic(fmt.Sprintf("scheduler: Register with invalid policy name %q", name))
	}
	if f == nil {
		panic("scheduler: Register " + name + " with a nil factory")
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.m[name]; dup {
		panic("scheduler: policy " + name + " registered twice")
	}
	registry.m[name] = f
}

// New builds the policy registered as name with params.
func New(name string, params Params) (Policy, error) {
	registry.RLock()
	f, ok := registry.m[name]
	registry.RUnlock()
	if !ok {
		return Policy{}, fmt.Errorf("unknown policy %q (registered: %s)", name, strings.Join(Names(), ", "))
	}
	p, err := f(params)
	if err != nil {
		return Policy{}, fmt.Errorf("policy %s: %w", name, err)
	}
	if p.Scorer == nil || p.Picker == nil {
		return Policy{}, fmt.Errorf("policy %s: the factory returned a policy without scorer or picker", name)
	}
	return p, nil
}

// Names lists the registered policies, sorted.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	return slices.Sorted(maps.Keys(registry.m))
}

// paramReader reads a Params map once, key by key, and reports what is wrong
// with it: unknown keys and values of the wrong type or range, all of them.
type paramReader struct {
	params Params
	used   map[string]bool
	errs   []string
}

func readParams(p Params) *paramReader { return &paramReader{params: p, used: map[string]bool{}} }

// float reads a number in [lo, hi]; ok is false when the key is absent or
// invalid.
func (r *paramReader) float(key string, lo, hi float64) (v float64, ok bool) {
	raw, present := r.params[key]
	r.used[key] = true
	if !present {
		return 0, false
	}
	switch n := raw.(type) {
	case float64:
		v = n
	case int:
		v = float64(n)
	default:
		r.errs = append(r.errs, fmt.Sprintf("parameter %s: %v is not a number", key, raw))
		return 0, false
	}
	if !(v >= lo && v <= hi) { // also rejects NaN
		r.errs = append(r.errs, fmt.Sprintf("parameter %s: %v is outside [%v, %v]", key, v, lo, hi))
		return 0, false
	}
	return v, true
}

// err reports the problems found, unknown keys included; nil when none.
func (r *paramReader) err() error {
	known := slices.Sorted(maps.Keys(r.used))
	for _, k := range slices.Sorted(maps.Keys(r.params)) {
		switch {
		case r.used[k]:
		case len(known) == 0:
			r.errs = append(r.errs, fmt.Sprintf("unknown parameter %q: the policy takes none", k))
		default:
			r.errs = append(r.errs, fmt.Sprintf("unknown parameter %q (known: %s)", k, strings.Join(known, ", ")))
		}
	}
	if len(r.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(r.errs, "; "))
}
