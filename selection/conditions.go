package selection

// Condition is a readiness input from outside the catalog: a discovery source
// reports whether the catalog it feeds is trustworthy (an InferencePool that
// does not exist, a workers file never read successfully). GET /ready lists
// every condition and stays false while any is not Ready, so an operator reads
// why from the same body a probe sees.
type Condition struct {
	// Name identifies the condition's owner, e.g. "discovery".
	Name string `json:"name"`
	// Ready is false while the owner holds readiness back.
	Ready bool `json:"ready"`
	// Reason is a CamelCase word for machines ("InferencePoolNotFound").
	Reason string `json:"reason,omitempty"`
	// Message is the sentence for people.
	Message string `json:"message,omitempty"`
}

// conditionsReady reports whether every condition in cs is Ready.
func conditionsReady(cs []Condition) bool {
	for _, c := range cs {
		if !c.Ready {
			return false
		}
	}
	return true
}
