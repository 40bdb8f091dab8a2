package server

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

const helpIntro = `kvselect: KV-cache-aware worker selection, a re-implementation of Dynamo's
standalone selection service (python -m dynamo.select_service).

Usage:
  kvselect [flags]

Serves Dynamo's selection REST API (workers, select, reservations, loads, dump)
on --host:--port, without authentication: run it on a trusted network, and the
Envoy ext_proc endpoint picker on --extproc-port.

Settings come from, in order of precedence: the flags given on the command
line, the environment listed at the end, the --config file, the defaults.
SIGHUP re-reads the --config file and applies its policy parameters.
SIGINT or SIGTERM stops it gracefully: selection calls get 503 "selection
service is shutting down", in-flight requests get --shutdown-timeout to finish.
Exit status: 0 after a clean stop, 2 for an invalid flag, environment value or
config file, 1 for any other failure.
`

// helpSections orders the flags in --help. TestHelpDocumentsEveryFlag keeps it
// in step with newFlagSet.
var helpSections = []struct {
	title string
	flags []string
}{
	{"Server", []string{"host", "port", "shutdown-timeout", "log-format", "log-level", "enable-pprof", "memory-release-interval", "memory-release-min-bytes"}},
	{"Selection", []string{"policy", "config", "threads", "kv-events-bind", "kv-events-max-frame-bytes", "session-affinity-ttl-secs", "selection-cache-ttl-secs", "selection-cache-max-entries", "selection-cache-max-bytes"}},
	{"Tracking hashes", []string{"router-tracking-hash", "router-tracking-key-file", "router-tracking-key-id", "router-assume-kv-reuse", "no-router-assume-kv-reuse"}},
	{"Peers (index recovery over HTTP, replica sync over ZMQ)", []string{"indexer-peers", "indexer-peers-token-file", "replica-sync-port", "replica-sync-peers", "replica-sync-resolve-peers", "replica-sync-key-file"}},
	{"Endpoint picker (Envoy ext_proc, GIE protocol 004)", []string{"extproc-port", "extproc-fallbacks", "extproc-max-body-bytes", "extproc-test-pick-header", "extproc-default-model", "extproc-assume-request-body-mode", "extproc-assume-response-body-mode", "extproc-secure-serving", "extproc-cert-path", "extproc-cert-reload", "extproc-client-ca", "session-headers", "session-as-fairness-id"}},
	{"REST authentication and TLS (docs/security.md)", []string{"auth-token-file", "auth-kubernetes", "auth-kubernetes-namespace", "auth-kubernetes-cache-ttl", "auth-kubernetes-audiences", "auth-allow-unauthenticated", "tls-cert-path", "tls-cert-reload", "tls-client-ca"}},
	{"Limits (per client, HTTP timeouts, picker streams)", []string{"max-conns-per-client", "rate-limit-per-client", "rate-limit-burst", "max-header-bytes", "http-read-timeout", "http-write-timeout", "extproc-max-streams"}},
	{"Text prompts (tokenized by the engines)", []string{"tokenize", "tokenize-endpoint", "tokenize-timeout", "tokenize-timeout-max", "tokenize-cache-tokens", "tokenize-forward-ids"}},
	{"Engine metrics, saturation and health", []string{"engine-metrics-interval", "engine-metrics-timeout", "engine-metrics-concurrency", "engine-metrics-max-bytes", "engine-metrics-stale-after",
		"queue-depth-threshold", "kv-cache-util-threshold", "when-saturated", "engine-request-weight", "engine-kv-usage-weight", "engine-lora-miss-weight",
		"eject-after", "eject-window", "eject-base", "eject-max", "health-probe-interval", "health-probe-timeout"}},
	{"Discovery (workers file, Kubernetes InferencePool)", []string{"workers-file", "pool-name", "pool-namespace", "kubeconfig"}},
	{"Disaggregated prefill/decode (docs/disaggregation.md)", []string{"prefill-routing-group", "disaggregation", "prefill-header"}},
	{"Flow control (docs/flow-control.md)", []string{"flow-control", "flow-queue-ttl", "flow-max-bytes", "flow-max-band-bytes", "flow-max-tenants"}},
	{"Latency model of the predicted-latency policy (docs/selection.md)", []string{"latency-forgetting", "latency-min-observations"}},
	{"Booking end (bookings whose end the picker cannot see, docs/extproc.md)", []string{"booking-end", "rest-booking-end", "booking-estimate-max", "booking-estimate-output-tokens"}},
	{"Other", []string{"version"}},
}

const helpWidth = 80

// writeHelp prints the flags of newFlagSet, section by section, and the
// DYN_ROUTER_* table of routerconfig.EnvTable.
func writeHelp(w io.Writer) {
	fs := newFlagSet(&options{})
	var b strings.Builder
	b.WriteString(helpIntro)
	for _, s := range helpSections {
		fmt.Fprintf(&b, "\n%s:\n", s.title)
		for _, name := range s.flags {
			f := fs.Lookup(name)
			if f == nil {
				panic("help names an unregistered flag --" + name)
			}
			writeFlag(&b, f)
		}
	}
	b.WriteString("  -h, --help\n")
	wrap(&b, "print this help and exit")

	b.WriteString("\nEnvironment (the flag named in a description wins):\n")
	fmt.Fprintf(&b, "  %s (default %s)\n", envPolicy, scheduler.DefaultPolicyName)
	wrap(&b, "selection policy by registered name, as --policy, which wins over it; it wins over the config file's policy.name")
	fmt.Fprintf(&b, "  %s\n", envSessionHeaders)
	wrap(&b, "the picker's session headers, as --session-headers, which wins over it")
	fmt.Fprintf(&b, "  %s\n", envSessionAsTenant)
	wrap(&b, "true or false, as --session-as-fairness-id, which wins over it")
	for _, v := range routerconfig.EnvTable() {
		fmt.Fprintf(&b, "  %s (default %s)\n", v.Name, v.Default)
		wrap(&b, v.Meaning)
	}
	_, _ = io.WriteString(w, b.String())
}

func writeFlag(b *strings.Builder, f *flag.Flag) {
	arg, usage := flag.UnquoteUsage(f)
	if arg != "" {
		fmt.Fprintf(b, "  --%s <%s>\n", f.Name, arg)
	} else {
		fmt.Fprintf(b, "  --%s\n", f.Name)
	}
	switch f.DefValue {
	case "", "0", "false":
	default:
		usage += fmt.Sprintf(" (default %s)", strings.ToLower(f.DefValue))
	}
	wrap(b, usage)
}

// wrap writes text indented by eight spaces, broken at word boundaries.
func wrap(b *strings.Builder, text string) {
	const indent = "        "
	line := indent
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > helpWidth {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
}
