package server

import (
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/engines/tokenize"
)

func TestTokenizeFlags(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		mode     tokenize.Mode
		err      string
		endpoint string
	}{
		{name: "off by default", mode: tokenize.ModeOff},
		{name: "pool", args: []string{"--tokenize", "pool", "--tokenize-timeout", "5ms"}, mode: tokenize.ModePool},
		{name: "an endpoint alone implies endpoint mode", args: []string{"--tokenize-endpoint", "llama=http://render:8000"},
			mode: tokenize.ModeEndpoint, endpoint: "http://render:8000"},
		{name: "pool with an endpoint for one model", args: []string{"--tokenize", "pool", "--tokenize-endpoint", "llama=http://render:8000,qwen=https://r2"},
			mode: tokenize.ModePool, endpoint: "http://render:8000"},
		{name: "unknown mode", args: []string{"--tokenize", "always"}, err: "want off, pool or endpoint"},
		{name: "endpoint mode without endpoints", args: []string{"--tokenize", "endpoint"}, err: "needs at least one --tokenize-endpoint"},
		{name: "endpoints with off", args: []string{"--tokenize", "off", "--tokenize-endpoint", "a=http://x"}, err: "needs --tokenize pool or endpoint"},
		{name: "malformed endpoint", args: []string{"--tokenize-endpoint", "http://x"}, err: "want model=url"},
		{name: "endpoint without scheme", args: []string{"--tokenize-endpoint", "a=render:8000"}, err: "scheme must be http or https"},
		{name: "zero timeout", args: []string{"--tokenize", "pool", "--tokenize-timeout", "0s"}, err: "--tokenize-timeout 0s"},
		{name: "negative cache", args: []string{"--tokenize", "pool", "--tokenize-cache-tokens", "-1"}, err: "--tokenize-cache-tokens -1"},
		{name: "forwarding ids without tokenizing", args: []string{"--tokenize-forward-ids"}, err: "--tokenize-forward-ids needs"},
		{name: "a timeout without tokenizing", args: []string{"--tokenize-timeout", "50ms"}, err: "--tokenize-timeout has no effect with --tokenize off"},
		{name: "a timeout cap without tokenizing", args: []string{"--tokenize", "off", "--tokenize-timeout-max", "1s"}, err: "--tokenize-timeout-max has no effect"},
		{name: "a cache size without tokenizing", args: []string{"--tokenize-cache-tokens", "0"}, err: "--tokenize-cache-tokens has no effect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.tokenize.mode != tc.mode || o.tokenize.endpoints["llama"] != tc.endpoint {
				t.Fatalf("mode %q endpoints %v", o.tokenize.mode, o.tokenize.endpoints)
			}
			if tc.name == "off by default" && (o.tokenize.timeout != 20*time.Millisecond || o.tokenize.forwardIDs) {
				t.Fatalf("defaults %+v", o.tokenize)
			}
		})
	}
}
