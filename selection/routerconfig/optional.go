package routerconfig

import "fmt"

// Optional is a value that may be absent, for the knobs Dynamo models as
// Option<T> (router_queue_threshold, router_predicted_ttl_secs, the busy
// thresholds, ...), where "unset" means "feature off" and differs from every
// value, zero included. The zero Optional is unset. It is a value type so that
// copies of a Config never share state.
type Optional[T any] struct {
	value T
	set   bool
}

// Some returns a set Optional holding v.
func Some[T any](v T) Optional[T] { return Optional[T]{value: v, set: true} }

// Get returns the value and whether it is set.
func (o Optional[T]) Get() (T, bool) { return o.value, o.set }

// IsSet reports whether a value is present.
func (o Optional[T]) IsSet() bool { return o.set }

// Or returns the value if set, fallback otherwise.
func (o Optional[T]) Or(fallback T) T {
	if o.set {
		return o.value
	}
	return fallback
}

// String prints the value, or "unset".
func (o Optional[T]) String() string {
	if !o.set {
		return "unset"
	}
	return fmt.Sprint(o.value)
}
