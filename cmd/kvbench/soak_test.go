package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad soak flags are refused with a message naming the problem, before any
// process starts (the run itself is `make soak-short`).
func TestSoakFlagErrors(t *testing.T) {
	t.Setenv("KVSELECT_LLMD_SIM", "")
	t.Setenv("KVSELECT_REQUIRE_LLMD_SIM", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-expiry", "1500ms"}, "whole seconds"},
		{[]string{"-short", "-replicas", "0"}, "replicas"},
		{[]string{"-proxied-workers", "9"}, "proxied"},
		{[]string{"-sims", "2"}, "simulator"},
		{[]string{"-duration", "1m", "extra"}, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"soak"}, tc.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	t.Setenv("KVSELECT_REQUIRE_LLMD_SIM", "1")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"soak"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "KVSELECT_REQUIRE_LLMD_SIM") {
		t.Errorf("required simulator missing: %v", err)
	}
}
