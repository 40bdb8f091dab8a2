package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// TestKVEventsBindFromFlagAndEnvironment: --kv-events-bind (repeated and
// comma-separated) binds every collector socket, KVSELECT_KV_EVENTS_BIND does
// when the flag is absent, and GET /kv_events/collector lists them; without
// either the route answers 404 in the error envelope.
func TestKVEventsBindFromFlagAndEnvironment(t *testing.T) {
	cases := []struct {
		name  string
		env   map[string]string
		args  []string
		bound int
	}{
		{"flag", nil, []string{"--kv-events-bind", "tcp://127.0.0.1:0,tcp://127.0.0.1:0", "--kv-events-bind", "tcp://127.0.0.1:0"}, 3},
		{"environment", map[string]string{envKVEventsBind: "tcp://127.0.0.1:0"}, nil, 1},
		{"flag wins", map[string]string{envKVEventsBind: "tcp://127.0.0.1:0,tcp://127.0.0.1:0"}, []string{"--kv-events-bind", "tcp://127.0.0.1:0"}, 1},
		{"none", nil, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			srv := runInBackground(t, lookup, tc.args)
			resp, err := http.Get(srv.rest() + "/kv_events/collector")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Bound []string `json:"bound"`
				Error string   `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if tc.bound == 0 {
				if resp.StatusCode != http.StatusNotFound || !strings.Contains(body.Error, "--kv-events-bind") {
					t.Fatalf("status %d, %+v; want 404 naming --kv-events-bind", resp.StatusCode, body)
				}
				return
			}
			if resp.StatusCode != http.StatusOK || len(body.Bound) != tc.bound {
				t.Fatalf("status %d, bound %v; want %d sockets", resp.StatusCode, body.Bound, tc.bound)
			}
			for _, b := range body.Bound {
				if !strings.HasPrefix(b, "tcp://127.0.0.1:") || strings.HasSuffix(b, ":0") {
					t.Fatalf("bound %q: want a resolved loopback port", b)
				}
			}
		})
	}
}

// TestKVEventsBindBadEnvironment: a bad KVSELECT_KV_EVENTS_BIND stops the
// server with a usage error naming the variable.
func TestKVEventsBindBadEnvironment(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == envKVEventsBind {
			return "ipc:///tmp/x", true
		}
		return "", false
	}
	err := Run(t.Context(), []string{"--port", "0"}, WithEnv(lookup), WithStdout(new(strings.Builder)), WithStderr(new(strings.Builder)))
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), envKVEventsBind) {
		t.Fatalf("Run = %v, want a usage error naming %s", err, envKVEventsBind)
	}
}
