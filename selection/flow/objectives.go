package flow

import (
	"maps"
	"sync"
)

// Objective sources, in the order Objectives.Lookup consults them.
const (
	// SourceKubernetes is the InferenceObjective resources of the pool.
	SourceKubernetes = "kubernetes"
	// SourceFile is the objectives section of kvselect's --config file.
	SourceFile = "file"
)

// Objectives maps InferenceObjective names — what a request names in
// llm-d's x-llm-d-inference-objective header (GIE's older
// x-gateway-inference-objective) — to priorities. Each source replaces
// its whole table at once; a name the Kubernetes source knows wins over the
// same name in the file. Safe for concurrent use; the zero value is empty.
type Objectives struct {
	mu      sync.RWMutex
	sources map[string]map[string]int
}

// Set replaces source's table (a nil or empty table removes it). The map is
// copied.
func (o *Objectives) Set(source string, priorities map[string]int) {
	cp := maps.Clone(priorities)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sources == nil {
		o.sources = make(map[string]map[string]int)
	}
	if len(cp) == 0 {
		delete(o.sources, source)
		return
	}
	o.sources[source] = cp
}

// Lookup returns the priority of the objective name; false when no source
// knows it (or o is nil).
func (o *Objectives) Lookup(name string) (int, bool) {
	if o == nil {
		return 0, false
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, src := range [...]string{SourceKubernetes, SourceFile} {
		if p, ok := o.sources[src][name]; ok {
			return p, true
		}
	}
	return 0, false
}

// File returns a copy of the SourceFile table.
func (o *Objectives) File() map[string]int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return maps.Clone(o.sources[SourceFile])
}

// All returns every known objective and its effective priority.
func (o *Objectives) All() map[string]int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	out := make(map[string]int)
	for _, src := range [...]string{SourceFile, SourceKubernetes} { // the later wins
		maps.Copy(out, o.sources[src])
	}
	return out
}
