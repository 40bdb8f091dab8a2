package apierr

import (
	"errors"
	"fmt"
	"testing"
)

func TestKindOf(t *testing.T) {
	cause := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want Kind
	}{
		{"new", New(NotFound, "worker %d not found", 3), NotFound},
		{"wrapped by a caller", fmt.Errorf("context: %w", New(Conflict, "taken")), Conflict},
		{"plain error", cause, Internal},
		{"nil", nil, Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := KindOf(tc.err); got != tc.want {
				t.Fatalf("KindOf = %v, want %v", got, tc.want)
			}
		})
	}
	w := Wrap(Overloaded, cause)
	if w.Error() != "boom" || !errors.Is(w, cause) {
		t.Fatalf("Wrap lost the cause or its message: %v", w)
	}
	d := WithDetails(Overloaded, "shed", cause, map[string]any{"flow_outcome": "shed"})
	if d.Error() != "shed" || !errors.Is(d, cause) || d.Details["flow_outcome"] != "shed" {
		t.Fatalf("WithDetails = %+v", d)
	}
}
