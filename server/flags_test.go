package server

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/selection/routerconfig"
)

func noEnv(string) (string, bool) { return "", false }

// runArgs runs the program in-process with no environment and returns the
// exit status and what it wrote.
func runArgs(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	status = ExitStatus(runWith(context.Background(), args, noEnv, &out, &errb), &errb)
	return status, out.String(), errb.String()
}

func TestParseFlagsDefaultsAreDynamos(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"host", o.host, "0.0.0.0"},
		{"port", o.port, uint64(8092)},
		{"shutdown-timeout", o.shutdownTimeout, 10 * time.Second},
		{"memory-release-interval", o.memoryReleaseInterval, 10 * time.Second},
		{"memory-release-min-bytes", o.memoryReleaseMinBytes, uint64(16 << 20)},
		{"log-format", o.logFormat, "text"},
		{"log-level", o.logLevel, slog.LevelInfo},
		{"threads", o.threads, 4},
		{"selection-cache-ttl-secs", o.cacheTTL, 120 * time.Second},
		{"selection-cache-max-entries", o.cacheMaxEntries, 4096},
		{"selection-cache-max-bytes", o.cacheMaxBytes, int64(268435456)},
		{"router-tracking-hash", o.trackingHash, ""}, // environment, else public-xxh3-v1
		// Plaintext, unlike GIE's picker: deploy/envoy/envoy.yaml dials plaintext.
		{"extproc-secure-serving", o.extproc.secure, false},
		{"extproc-cert-path", o.extproc.certPath, ""},
		{"extproc-cert-reload", o.extproc.certReload, false},
		{"extproc-assume-*-body-mode given", o.extproc.assumeSet, false},
		{"extproc-assume-request-body-mode", o.extproc.assumedRequest.String(), "FULL_DUPLEX_STREAMED"},
		{"extproc-assume-response-body-mode", o.extproc.assumedResponse.String(), "FULL_DUPLEX_STREAMED"},
		{"flags given", len(o.set), 0},
	} {
		if c.got != c.want {
			t.Errorf("--%s default = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestParseFlagsAcceptsValidValues(t *testing.T) {
	o, err := parseFlags([]string{
		"--host", "127.0.0.1", "--port", "0", "--shutdown-timeout", "2s", "--log-format", "json", "--log-level", "debug",
		"--threads", "8", "--session-affinity-ttl-secs", "31536000", "--selection-cache-ttl-secs", "0.25",
		"--selection-cache-max-entries", "1", "--selection-cache-max-bytes", "1",
		"--router-tracking-hash", "keyed-xxh3-v1", "--router-tracking-key-file", "/k", "--router-tracking-key-id", "e1",
		"--no-router-assume-kv-reuse", "--extproc-assume-request-body-mode", "Buffered",
	})
	if err != nil {
		t.Fatal(err)
	}
	if e := o.extproc; !e.assumeSet || e.assumedRequest.String() != "BUFFERED" || e.assumedResponse.String() != "FULL_DUPLEX_STREAMED" {
		t.Errorf("assumed body modes %v/%v (given %v), want BUFFERED/FULL_DUPLEX_STREAMED", e.assumedRequest, e.assumedResponse, e.assumeSet)
	}
	if o.host != "127.0.0.1" || o.port != 0 || o.shutdownTimeout != 2*time.Second || o.logFormat != "json" ||
		o.logLevel != slog.LevelDebug || o.threads != 8 || o.sessionAffinityTTLSecs != 31536000 ||
		o.cacheTTL != 250*time.Millisecond || o.cacheMaxEntries != 1 || o.cacheMaxBytes != 1 ||
		o.trackingHash != "keyed-xxh3-v1" || o.trackingKeyFile != "/k" || o.trackingKeyID != "e1" || !o.noAssumeKVReuse {
		t.Errorf("parsed %+v", *o)
	}
}

// TestParseFlagsRejects covers every rule: each case must fail with exit
// status 2 and a message naming the problem.
func TestParseFlagsRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--bogus"}, "flag provided but not defined: --bogus"},
		{"positional argument", []string{"serve"}, `unexpected argument "serve"`},
		{"missing value", []string{"--port"}, "flag needs an argument: --port"},
		{"port not a number", []string{"--port", "http"}, `invalid value "http" for flag --port`},
		{"port negative", []string{"--port", "-1"}, `invalid value "-1" for flag --port`},
		{"port too large", []string{"--port", "65536"}, "--port 65536: must be between 0 and 65535"},
		{"shutdown timeout zero", []string{"--shutdown-timeout", "0s"}, "--shutdown-timeout 0s: must be greater than zero"},
		{"shutdown timeout negative", []string{"--shutdown-timeout", "-1s"}, "--shutdown-timeout -1s: must be greater than zero"},
		{"shutdown timeout unitless", []string{"--shutdown-timeout", "10"}, `invalid value "10" for flag --shutdown-timeout`},
		{"memory release interval negative", []string{"--memory-release-interval", "-1s"}, "--memory-release-interval -1s: must be 0 (off) or positive"},
		{"log format", []string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{"log level", []string{"--log-level", "loud"}, `invalid value "loud" for flag --log-level`},
		{"threads zero", []string{"--threads", "0"}, "--threads 0: must be at least 1"},
		{"threads negative", []string{"--threads", "-3"}, "--threads -3: must be at least 1"},
		{"session ttl zero", []string{"--session-affinity-ttl-secs", "0"}, "--session-affinity-ttl-secs 0: must be between 1 and 31536000"},
		{"session ttl above a year", []string{"--session-affinity-ttl-secs", "31536001"}, "--session-affinity-ttl-secs 31536001: must be between 1 and 31536000"},
		{"session ttl fractional", []string{"--session-affinity-ttl-secs", "1.5"}, `invalid value "1.5" for flag --session-affinity-ttl-secs`},
		{"cache ttl zero", []string{"--selection-cache-ttl-secs", "0"}, "greater than zero"},
		{"cache ttl negative", []string{"--selection-cache-ttl-secs", "-1"}, "greater than zero"},
		{"cache ttl NaN", []string{"--selection-cache-ttl-secs", "NaN"}, "finite"},
		{"cache ttl Inf", []string{"--selection-cache-ttl-secs", "+Inf"}, "finite"},
		{"cache ttl overflows a Duration", []string{"--selection-cache-ttl-secs", "1e300"}, "finite"},
		{"cache ttl trailing junk", []string{"--selection-cache-ttl-secs", "120s"}, "not a number of seconds"},
		{"cache entries zero", []string{"--selection-cache-max-entries", "0"}, "--selection-cache-max-entries 0: must be at least 1"},
		{"cache bytes zero", []string{"--selection-cache-max-bytes", "0"}, "--selection-cache-max-bytes 0: must be at least 1"},
		{"cache bytes negative", []string{"--selection-cache-max-bytes", "-5"}, "--selection-cache-max-bytes -5: must be at least 1"},
		{"tracking hash", []string{"--router-tracking-hash", "sha256"}, `--router-tracking-hash "sha256": want public-xxh3-v1 or keyed-xxh3-v1`},
		{"assume kv reuse both ways", []string{"--router-assume-kv-reuse", "--no-router-assume-kv-reuse"}, "'--router-assume-kv-reuse' cannot be used with '--no-router-assume-kv-reuse'"},
		{"collector not tcp", []string{"--kv-events-bind", "ipc:///tmp/kv"}, "only tcp:// can be bound"},
		{"collector without port", []string{"--kv-events-bind", "tcp://*"}, "missing TCP port"},
		{"collector empty element", []string{"--kv-events-bind", "tcp://*:5557,"}, "empty element"},
		{"collector frame cap too small", []string{"--kv-events-max-frame-bytes", "100"}, "--kv-events-max-frame-bytes 100: must be at least 1024"},
		{"replica peers without port", []string{"--replica-sync-peers", "tcp://b:9092"}, "--replica-sync-peers requires --replica-sync-port"},
		{"replica port zero", []string{"--replica-sync-port", "0"}, "--replica-sync-port 0: port must be greater than zero"},
		{"replica port too large", []string{"--replica-sync-port", "70000"}, "--replica-sync-port 70000: must be between 1 and 65535"},
		{"replica peer without scheme", []string{"--replica-sync-port", "9092", "--replica-sync-peers", "b:9092"}, "invalid ZMQ endpoint `b:9092`: missing scheme"},
		{"replica peer without port", []string{"--replica-sync-port", "9092", "--replica-sync-peers", "tcp://b"}, "invalid ZMQ endpoint `tcp://b`: missing TCP port"},
		{"replica peer bad scheme", []string{"--replica-sync-port", "9092", "--replica-sync-peers", "udp://b:1"}, "unsupported scheme `udp`"},
		{"replica peer empty element", []string{"--replica-sync-port", "9092", "--replica-sync-peers", "tcp://b:1,"}, "empty element"},
		{"indexer peer not http", []string{"--indexer-peers", "tcp://b:8092"}, `invalid HTTP URL "tcp://b:8092": scheme must be http or https`},
		{"indexer peer without host", []string{"--indexer-peers", "http://:8092"}, "missing host"},
		{"indexer peer relative", []string{"--indexer-peers", "selector-b:8092"}, "invalid HTTP URL"},
		{"indexer peer bad port", []string{"--indexer-peers", "http://b:0"}, `invalid port "0"`},
		{"indexer peer unparsable", []string{"--indexer-peers", "http://b:80/%zz"}, "invalid HTTP URL"},
		{"indexer peer empty element", []string{"--indexer-peers", "http://a:1,,http://b:1"}, "empty element"},
		{"resolve peers without port", []string{"--replica-sync-resolve-peers"}, "--replica-sync-resolve-peers requires --replica-sync-port"},
		{"cert path without secure serving", []string{"--extproc-cert-path", "/etc/tls"}, "--extproc-cert-path requires --extproc-secure-serving"},
		{"cert path with secure serving off", []string{"--extproc-secure-serving=false", "--extproc-cert-path", "/etc/tls"}, "--extproc-cert-path requires --extproc-secure-serving"},
		{"cert reload without cert path", []string{"--extproc-secure-serving", "--extproc-cert-reload"}, "--extproc-cert-reload requires --extproc-cert-path"},
		{"cert reload alone", []string{"--extproc-cert-reload"}, "--extproc-cert-reload requires --extproc-cert-path"},
		{"unknown body mode", []string{"--extproc-assume-request-body-mode", "duplex"}, `body send mode "duplex": want none, streamed, buffered, buffered_partial or full_duplex_streamed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args)
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("parseFlags(%q) = %v, want a usage error", tc.args, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			status, stdout, stderr := runArgs(t, tc.args...)
			if status != 2 || stdout != "" || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "--help") {
				t.Errorf("run: status %d, stdout %q, stderr %q; want 2 and the message with a --help hint", status, stdout, stderr)
			}
		})
	}
}

func TestParseFlagsReportsEveryRuleAtOnce(t *testing.T) {
	_, err := parseFlags([]string{"--threads", "0", "--selection-cache-max-entries", "0", "--replica-sync-peers", "tcp://b:1"})
	for _, want := range []string{"--threads 0", "--selection-cache-max-entries 0", "--replica-sync-peers requires --replica-sync-port"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

// The peer planes (Dynamo's "Peer Planes": --indexer-peers, --replica-sync-*) parse as Dynamo's CLI does; lists
// are trimmed.
func TestParseFlagsAcceptsPeerPlanes(t *testing.T) {
	o, err := parseFlags([]string{"--indexer-peers", "http://selector-b:8092, https://[::1]:9000",
		"--replica-sync-port", "9092", "--replica-sync-peers", "tcp://b:9092,ipc:///tmp/s,tcp://[::1]:5557",
		"--replica-sync-resolve-peers"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.indexerPeers, []string{"http://selector-b:8092", "https://[::1]:9000"}) ||
		o.replicaSyncPort != 9092 || !o.replicaSyncResolve ||
		!slices.Equal(o.replicaSyncPeers, []string{"tcp://b:9092", "ipc:///tmp/s", "tcp://[::1]:5557"}) {
		t.Fatalf("parsed %+v", o)
	}
}

func TestHelpDocumentsEveryFlagAndTheEnvironment(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		status, stdout, stderr := runArgs(t, arg)
		if status != 0 || stderr != "" {
			t.Fatalf("%s: status %d, stderr %q", arg, status, stderr)
		}
		var names []string
		newFlagSet(&options{}).VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		for _, name := range names {
			if !strings.Contains(stdout, "\n  --"+name+" ") && !strings.Contains(stdout, "\n  --"+name+"\n") {
				t.Errorf("%s does not document --%s", arg, name)
			}
		}
		for _, v := range routerconfig.EnvTable() {
			if !strings.Contains(stdout, "\n  "+v.Name+" (default "+v.Default+")") {
				t.Errorf("%s does not list %s", arg, v.Name)
			}
		}
		for _, want := range []string{"DYN_ROUTER_TEMPERATURE", "(default 8092)", "(default 120)", "(default 4096)", "(default 268435456)", "-h, --help"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s output lacks %q", arg, want)
			}
		}
	}
}

func TestHelpSectionsNameEachFlagOnce(t *testing.T) {
	seen := map[string]bool{}
	fs := newFlagSet(&options{})
	for _, s := range helpSections {
		for _, name := range s.flags {
			if seen[name] {
				t.Errorf("--%s listed twice", name)
			}
			seen[name] = true
			if fs.Lookup(name) == nil {
				t.Errorf("help lists unregistered --%s", name)
			}
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !seen[f.Name] {
			t.Errorf("--%s is in no help section", f.Name)
		}
	})
}

func TestVersionPrintsAndExits(t *testing.T) {
	// --version wins over everything else, including flags that would fail.
	for _, args := range [][]string{{"--version"}, {"-version", "--threads", "0"}} {
		status, stdout, stderr := runArgs(t, args...)
		if status != 0 || stderr != "" || !strings.HasPrefix(stdout, "kvselect ") || !strings.Contains(stdout, "go1.") {
			t.Errorf("%q: status %d, stdout %q, stderr %q", args, status, stdout, stderr)
		}
	}
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{usagef("bad"), 2},
		{errors.New("listen tcp: address already in use"), 1},
	} {
		var b bytes.Buffer
		if got := ExitStatus(tc.err, &b); got != tc.want {
			t.Errorf("ExitStatus(%v) = %d, want %d", tc.err, got, tc.want)
		}
		if (tc.err == nil) != (b.Len() == 0) {
			t.Errorf("ExitStatus(%v) printed %q", tc.err, b.String())
		}
	}
}
