package server

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/engines/tokenize"
	"github.com/kvselect/kvselect/internal/memrelease"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/catalog"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// options is the parsed command line. The field defaults are Dynamo's
// (python -m dynamo.select_service); set records which flags were
// given, because a given flag overrides the environment and an absent one
// leaves the DYN_ROUTER_* value (or Dynamo's default) in place.
type options struct {
	host            string
	port            uint64
	shutdownTimeout time.Duration
	logFormat       string
	logLevel        slog.Level

	threads                int
	sessionAffinityTTLSecs uint64
	cacheTTL               time.Duration
	cacheMaxEntries        int
	cacheMaxBytes          int64

	trackingHash    string
	trackingKeyFile string
	trackingKeyID   string
	assumeKVReuse   bool
	noAssumeKVReuse bool

	kvEventsBind     []string // --kv-events-bind; KVSELECT_KV_EVENTS_BIND when not given
	kvEventsMaxFrame int64

	indexerPeers       []string
	replicaSyncPort    uint64
	replicaSyncPeers   []string
	replicaSyncResolve bool
	replicaSyncKeys    []string // --replica-sync-key-file, repeatable: the first signs
	indexerPeersToken  string   // --indexer-peers-token-file

	extproc  extprocFlags
	tokenize tokenizeFlags
	engines  engineFlags // engine metrics, saturation, health (engines.go)

	discovery discoveryFlags  // --workers-file, --pool-name (discovery.go)
	disagg    disaggFlags     // prefill/decode disaggregation (disagg.go)
	flow      flowFlags       // flow control (flow.go)
	latency   latencyFlags    // the online latency model (latency.go)
	bookEnd   bookingEndFlags // bookings whose end the picker cannot see (bookingend.go)
	auth      authFlags       // REST authentication and TLS (auth.go)
	limits    limitFlags      // per-client limits, HTTP timeouts, ext_proc streams (limits.go)

	enablePprof bool

	memoryReleaseInterval time.Duration // --memory-release-interval
	memoryReleaseMinBytes uint64        // --memory-release-min-bytes

	policy     string // --policy
	configFile string // --config

	version bool

	set map[string]bool
}

// errHelp reports that --help was printed: exit status 0.
var errHelp = errors.New("help requested")

// Dynamo's bounds (the session-affinity TTL of its Python frontend, TCP ports).
const (
	maxSessionAffinityTTLSecs = uint64(routerconfig.MaxSessionAffinityTTL / time.Second)
	maxPort                   = math.MaxUint16
)

// newFlagSet registers every flag on a fresh FlagSet bound to o. Usage strings
// name the value in backquotes (flag.UnquoteUsage) for the help text.
func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("kvselect", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse errors are returned; help goes to stdout
	fs.Usage = func() {}

	fs.StringVar(&o.host, "host", "0.0.0.0", "`address` the REST API and the picker bind to; 0.0.0.0 (Dynamo's) is IPv4 only, \"::\" listens on IPv6 and IPv4. When the REST API authenticates nobody (no --auth-token-file, --auth-kubernetes or --tls-client-ca) and --host is not given, the REST API binds 127.0.0.1 only")
	fs.Uint64Var(&o.port, "port", 8092, "HTTP server `port` (0 picks a free port; the startup log names it)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long SIGINT/SIGTERM waits for in-flight requests before closing them (`duration`, > 0)")
	fs.DurationVar(&o.memoryReleaseInterval, "memory-release-interval", memrelease.DefaultInterval, "how often the heap is looked at for memory a finished burst left behind (long prompts' bodies, KV event batches): when it holds at least --memory-release-min-bytes reclaimable and, since the last look, no request came and it allocated less than that and less than a quarter of what it holds, it is collected and its free pages go back to the system (`duration`; 0 leaves it to the Go runtime)")
	fs.Uint64Var(&o.memoryReleaseMinBytes, "memory-release-min-bytes", memrelease.DefaultMinBytes, "the least reclaimable heap memory worth a collection and a release, and the allocation between two looks under which the heap counts as quiet, in `bytes`")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text or json (log/slog, on stderr)")
	fs.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "minimum log `level`: debug, info, warn or error")

	fs.IntVar(&o.threads, "threads", 4, "KV indexer worker `threads` (>= 1); overrides DYN_ROUTER_EVENT_THREADS")
	fs.Uint64Var(&o.sessionAffinityTTLSecs, "session-affinity-ttl-secs", 0, "pin each request session_id to the worker that served it for this many `seconds` after its last request (1 to 31536000); overrides DYN_ROUTER_SESSION_AFFINITY_TTL_SECS. Default: off")
	o.cacheTTL = 120 * time.Second
	fs.Func("selection-cache-ttl-secs", "`seconds` an unclaimed pending selection lives before eviction (float, > 0) (default 120)", func(s string) error {
		d, err := parseSeconds(s)
		o.cacheTTL = d
		return err
	})
	fs.IntVar(&o.cacheMaxEntries, "selection-cache-max-entries", 4096, "maximum resident pending `selections`, evicting oldest first (>= 1)")
	fs.Int64Var(&o.cacheMaxBytes, "selection-cache-max-bytes", 268435456, "approximate byte `budget` across resident pending selections (>= 1)")

	fs.StringVar(&o.trackingHash, "router-tracking-hash", "", "tracking-hash `algorithm`: public-xxh3-v1 or experimental keyed-xxh3-v1; overrides DYN_ROUTER_TRACKING_HASH (default public-xxh3-v1)")
	fs.StringVar(&o.trackingKeyFile, "router-tracking-key-file", "", "`path` of the 32-byte keyed-xxh3-v1 key; overrides DYN_ROUTER_TRACKING_KEY_FILE (an empty value unsets it)")
	fs.StringVar(&o.trackingKeyID, "router-tracking-key-id", "", "provider-managed key `epoch` for keyed-xxh3-v1; overrides DYN_ROUTER_TRACKING_KEY_ID (an empty value unsets it)")
	fs.BoolVar(&o.assumeKVReuse, "router-assume-kv-reuse", false, "derive tracking hashes from content so identical prefixes share active blocks; overrides DYN_ROUTER_ASSUME_KV_REUSE (default true)")
	fs.BoolVar(&o.noAssumeKVReuse, "no-router-assume-kv-reuse", false, "use random tracking hashes instead (mutually exclusive with --router-assume-kv-reuse)")

	fs.Func("kv-events-bind", "ZMQ `endpoints` (tcp://host:port, comma-separated or repeated) where kvselect binds a KV events collector: engines dial it (llm-d's topology; vLLM does when its kv-events endpoint is not a wildcard) and each message's topic names its worker, kv@<host>:<port>@<model> or the worker's kv_events_topic. Workers registered without kv_events_endpoint(s) are fed from it. Overrides KVSELECT_KV_EVENTS_BIND. Default: none (subscribe to each worker's kv_events_endpoint only)", func(s string) error {
		eps, err := parseList(s, validateBindEndpoint)
		o.kvEventsBind = append(o.kvEventsBind, eps...)
		return err
	})
	fs.Int64Var(&o.kvEventsMaxFrame, "kv-events-max-frame-bytes", 64<<20, "largest ZMQ frame a peer may send to a --kv-events-bind socket, in `bytes` (>= 1024); a peer announcing a larger one is disconnected before it is read")
	fs.Func("indexer-peers", "comma-separated HTTP `urls` of selectors or standalone indexers, tried in order at startup: the first /dump that answers seeds the KV index; /ready stays 503 until recovery is over", func(s string) error {
		peers, err := parseList(s, validateHTTPPeer)
		o.indexerPeers = peers
		return err
	})
	fs.Uint64Var(&o.replicaSyncPort, "replica-sync-port", 0, "local ZMQ PUB `port` for admission, prefill-complete and free events and session bindings (binds tcp://*:<port>); enables replica sync and /replica_sync/register_peer")
	fs.Func("replica-sync-peers", "comma-separated ZMQ PUB `endpoints` of selector peers to subscribe to; requires --replica-sync-port", func(s string) error {
		peers, err := parseList(s, catalog.ValidateZMQEndpoint)
		o.replicaSyncPeers = peers
		return err
	})
	fs.BoolVar(&o.replicaSyncResolve, "replica-sync-resolve-peers", false, "subscribe to every address a peer host name resolves to, re-resolved every 10 s, skipping this replica (a Kubernetes headless Service names all replicas); requires --replica-sync-port. Not a Dynamo flag")

	fs.Func("replica-sync-key-file", "`file` of the shared key (>= 32 bytes, hex as `openssl rand -hex 32` writes, or raw) that authenticates every replica-sync message with HMAC-SHA256; unauthenticated, malformed and replayed messages are dropped and counted. Every replica needs the same key. Repeat the flag to rotate without a split: the first key signs, all verify (docs/replicas.md). Requires --replica-sync-port", func(s string) error {
		if s == "" {
			return errors.New("empty path")
		}
		o.replicaSyncKeys = append(o.replicaSyncKeys, s)
		return nil
	})
	fs.StringVar(&o.indexerPeersToken, "indexer-peers-token-file", "", "`file` holding the bearer token sent with each --indexer-peers GET /dump (re-read at every fetch, so a rotated Kubernetes ServiceAccount token works); the peer must grant it the read scope")
	o.extproc.register(fs)
	o.tokenize.register(fs)
	o.engines.register(fs)
	o.discovery.register(fs)
	o.disagg.register(fs)
	o.flow.register(fs)
	o.latency.register(fs)
	o.bookEnd.register(fs)
	o.auth.register(fs)
	o.limits.register(fs)

	fs.StringVar(&o.policy, "policy", scheduler.DefaultPolicyName, "selection `policy` by registered name: "+strings.Join(scheduler.Names(), ", ")+" (a program embedding the server can register more). Overrides KVSELECT_POLICY and the config file's policy.name")
	fs.StringVar(&o.configFile, "config", "", "YAML or JSON `file` with a policy section (name, parameters) and a router section (Dynamo's router knobs by their KvRouterConfig names; docs/configuration.md). The environment and flags win over it. SIGHUP re-reads it and applies the policy parameters; other changes need a restart")
	fs.BoolVar(&o.enablePprof, "enable-pprof", false, "serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ on the REST port, as GIE's endpoint picker does; the admin scope when authentication is on")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	return fs
}

// parseFlags parses args (without the program name). It returns errHelp for
// -h/--help and a *UsageError for every other mistake. The flag package stops
// at the first value it cannot parse; the rules checked after parsing are all
// reported at once, so one run shows every problem.
func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		// The flag package names flags with one dash; the help, Dynamo and
		// every other message here use two.
		msg := strings.NewReplacer("for flag -", "for flag --", "not defined: -", "not defined: --", "an argument: -", "an argument: --").Replace(err.Error())
		return nil, &UsageError{errors.New(msg)}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q (every setting is a --flag)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.version {
		return o, nil
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

// validate checks the rules the flag package cannot express. The router knobs
// the flags override are checked again, together with the environment, by
// routerconfig.Config.Validate.
func (o *options) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if o.port > maxPort {
		add("--port %d: must be between 0 and %d", o.port, maxPort)
	}
	if o.shutdownTimeout <= 0 {
		add("--shutdown-timeout %v: must be greater than zero", o.shutdownTimeout)
	}
	if o.memoryReleaseInterval < 0 {
		add("--memory-release-interval %v: must be 0 (off) or positive", o.memoryReleaseInterval)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		add("--log-format %q: want text or json", o.logFormat)
	}
	if o.threads < 1 {
		add("--threads %d: must be at least 1", o.threads)
	}
	if o.set["session-affinity-ttl-secs"] && (o.sessionAffinityTTLSecs < 1 || o.sessionAffinityTTLSecs > maxSessionAffinityTTLSecs) {
		add("--session-affinity-ttl-secs %d: must be between 1 and %d", o.sessionAffinityTTLSecs, maxSessionAffinityTTLSecs)
	}
	// pending.Config reads zero as "default", so zero is rejected here rather
	// than silently turned into 4096 entries or 256 MiB.
	if o.cacheMaxEntries < 1 {
		add("--selection-cache-max-entries %d: must be at least 1", o.cacheMaxEntries)
	}
	if o.cacheMaxBytes < 1 {
		add("--selection-cache-max-bytes %d: must be at least 1", o.cacheMaxBytes)
	}
	if o.set["router-tracking-hash"] && o.trackingHash != kvhash.AlgorithmPublic && o.trackingHash != kvhash.AlgorithmKeyed {
		add("--router-tracking-hash %q: want %s or %s", o.trackingHash, kvhash.AlgorithmPublic, kvhash.AlgorithmKeyed)
	}
	if o.set["router-assume-kv-reuse"] && o.set["no-router-assume-kv-reuse"] {
		add("the argument '--router-assume-kv-reuse' cannot be used with '--no-router-assume-kv-reuse'")
	}
	switch {
	case !o.set["replica-sync-port"]:
	case o.replicaSyncPort == 0:
		add("--replica-sync-port 0: port must be greater than zero")
	case o.replicaSyncPort > maxPort:
		add("--replica-sync-port %d: must be between 1 and %d", o.replicaSyncPort, maxPort)
	}
	if o.kvEventsMaxFrame < 1024 {
		add("--kv-events-max-frame-bytes %d: must be at least 1024", o.kvEventsMaxFrame)
	}
	if o.set["replica-sync-peers"] && !o.set["replica-sync-port"] {
		add("--replica-sync-peers requires --replica-sync-port")
	}
	if len(o.replicaSyncKeys) > 0 && !o.set["replica-sync-port"] {
		add("--replica-sync-key-file requires --replica-sync-port")
	}
	if o.indexerPeersToken != "" && len(o.indexerPeers) == 0 {
		add("--indexer-peers-token-file requires --indexer-peers")
	}
	if o.replicaSyncResolve && !o.set["replica-sync-port"] {
		add("--replica-sync-resolve-peers requires --replica-sync-port")
	}
	if o.set["policy"] && strings.TrimSpace(o.policy) == "" {
		add("--policy: empty policy name")
	}
	if o.set["config"] && strings.TrimSpace(o.configFile) == "" {
		add("--config: empty path")
	}
	errs = append(errs, o.extproc.validate()...)
	errs = append(errs, o.tokenize.validate(o.set)...)
	errs = append(errs, o.engines.validate(o.set)...)
	errs = append(errs, o.auth.validate()...)
	errs = append(errs, o.limits.validate()...)
	errs = append(errs, o.discovery.validate(o.set)...)
	errs = append(errs, o.disagg.validate()...)
	errs = append(errs, o.flow.validate(o.set)...)
	errs = append(errs, o.latency.validate()...)
	errs = append(errs, o.bookEnd.validate()...)
	if err := errors.Join(errs...); err != nil {
		return &UsageError{err}
	}
	return nil
}

// parseSeconds reads Dynamo's float seconds (--selection-cache-ttl-secs).
func parseSeconds(s string) (time.Duration, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, errors.New("not a number of seconds")
	}
	// The upper bound keeps the conversion inside time.Duration (~292 years).
	if math.IsNaN(v) || v <= 0 || v > float64(math.MaxInt64/int64(time.Second)) {
		return 0, errors.New("must be a finite number of seconds greater than zero")
	}
	return time.Duration(v * float64(time.Second)), nil
}

// parseList splits a comma-separated flag value and checks each element.
func parseList(s string, check func(string) error) ([]string, error) {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("empty element in %q", s)
		}
		if err := check(p); err != nil {
			return nil, err
		}
		parts[i] = p
	}
	return parts, nil
}

// validateBindEndpoint accepts a collector endpoint: tcp only, since the
// socket is bound through a frame guard that speaks TCP.
func validateBindEndpoint(ep string) error {
	if err := catalog.ValidateZMQEndpoint(ep); err != nil {
		return err
	}
	if !strings.HasPrefix(ep, "tcp://") {
		return fmt.Errorf("invalid collector endpoint `%s`: only tcp:// can be bound", ep)
	}
	return nil
}

// validateHTTPPeer accepts an absolute http(s) base URL, as Dynamo's recovery
// client appends /dump to it.
func validateHTTPPeer(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("invalid HTTP URL %q: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("invalid HTTP URL %q: scheme must be http or https", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("invalid HTTP URL %q: missing host", s)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("invalid HTTP URL %q: invalid port %q", s, p)
		}
	}
	return nil
}

// tokenizeFlags are the text-prompt tokenization flags (engines/tokenize;
// docs/extproc.md "Exact routing for text prompts").
type tokenizeFlags struct {
	mode        tokenize.Mode
	endpoints   map[string]string // model → base URL
	timeout     time.Duration
	maxTimeout  time.Duration
	cacheTokens int
	forwardIDs  bool
}

func (t *tokenizeFlags) register(fs *flag.FlagSet) {
	t.mode = tokenize.ModeOff
	fs.Func("tokenize", "how text prompts (no token ids or hashes) are routed (`mode`): off routes them on the approximate character-block text index; pool asks the least-loaded schedulable worker of the partition for the ids its engine will prefill (POST /tokenize; vLLM, SGLang) and routes them on the KV-event index; endpoint asks only --tokenize-endpoint. On timeout or error a request routes on the text index, never fails (default off; --tokenize-endpoint alone implies endpoint)", func(s string) error {
		m, err := tokenize.ParseMode(s)
		t.mode = m
		return err
	})
	fs.Func("tokenize-endpoint", "`model=url` (comma-separated or repeated): the base URL whose POST /tokenize serves that model, e.g. vLLM's render service for a pool; wins over the pool's workers for that model", func(s string) error {
		for _, part := range strings.Split(s, ",") {
			model, u, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || model == "" {
				return fmt.Errorf("%q: want model=url", part)
			}
			if err := tokenize.ValidateEndpoint(u); err != nil {
				return err
			}
			if t.endpoints == nil {
				t.endpoints = map[string]string{}
			}
			t.endpoints[model] = u
		}
		return nil
	})
	fs.DurationVar(&t.timeout, "tokenize-timeout", tokenize.DefaultTimeout, "budget of one text prompt's tokenization (`duration`, > 0); past it the request routes on the text index (the call still completes in the background and fills the cache)")
	fs.DurationVar(&t.maxTimeout, "tokenize-timeout-max", tokenize.DefaultMaxTimeout, "hard cap of the adaptive tokenize budget (`duration`): a text prompt waits for its ids up to the prefill time routing on them is predicted to save (the latency model's fit of its engines), at least --tokenize-timeout and at most this; at or below --tokenize-timeout the budget is --tokenize-timeout alone")
	fs.IntVar(&t.cacheTokens, "tokenize-cache-tokens", tokenize.DefaultCacheTokens, "size of the tokenize cache in token `ids` (4 bytes each; 0 disables it): whole requests, and chat conversation prefixes where the engine's template allows")
	fs.BoolVar(&t.forwardIDs, "tokenize-forward-ids", false, "replace a completions request's prompt string by its token ids in the body the picker forwards (ext_proc FULL_DUPLEX_STREAMED), so the engine skips its own tokenization")
}

// start makes the tokenizer of text prompts both fronts use (engines/
// tokenize) and registers its metrics; nil with --tokenize off.
func (t *tokenizeFlags) start(ctx context.Context, svc *selection.Service, reg prometheus.Registerer, log *slog.Logger) (selection.Tokenizer, error) {
	if t.mode == tokenize.ModeOff {
		return nil, nil
	}
	tk, err := tokenize.New(ctx, tokenize.Config{Mode: t.mode, Endpoints: t.endpoints, Timeout: t.timeout, MaxTimeout: t.maxTimeout,
		CacheTokens: cmp.Or(t.cacheTokens, -1), Logger: log}, svc.Inspect())
	if err != nil {
		return nil, &UsageError{err}
	}
	reg.MustRegister(tk)
	log.Info("text prompts tokenized by the engines", "mode", string(t.mode), "endpoints", t.endpoints,
		"timeout", t.timeout.String(), "timeout_max", t.maxTimeout.String(), "cache_tokens", t.cacheTokens, "forward_ids", t.forwardIDs)
	return tk, nil
}

// inertFlags refuses the flags given on the command line that would tune a
// feature another flag turned off (why names it): accepted and ignored, they
// would read as if they did something.
func inertFlags(set map[string]bool, off bool, why string, names ...string) []error {
	var errs []error
	for _, name := range names {
		if off && set[name] {
			errs = append(errs, fmt.Errorf("--%s has no effect with %s", name, why))
		}
	}
	return errs
}

func (t *tokenizeFlags) validate(set map[string]bool) []error {
	var errs []error
	if len(t.endpoints) > 0 && !set["tokenize"] {
		t.mode = tokenize.ModeEndpoint
	}
	switch {
	case t.mode == tokenize.ModeOff && len(t.endpoints) > 0:
		errs = append(errs, errors.New("--tokenize-endpoint needs --tokenize pool or endpoint (--tokenize off was given)"))
	case t.mode == tokenize.ModeEndpoint && len(t.endpoints) == 0:
		errs = append(errs, errors.New("--tokenize endpoint needs at least one --tokenize-endpoint model=url"))
	}
	if t.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--tokenize-timeout %v: must be greater than zero", t.timeout))
	}
	if t.maxTimeout < 0 {
		errs = append(errs, fmt.Errorf("--tokenize-timeout-max %v: must not be negative", t.maxTimeout))
	}
	if t.cacheTokens < 0 {
		errs = append(errs, fmt.Errorf("--tokenize-cache-tokens %d: must be at least 0", t.cacheTokens))
	}
	if t.forwardIDs && t.mode == tokenize.ModeOff {
		errs = append(errs, errors.New("--tokenize-forward-ids needs --tokenize pool or endpoint"))
	}
	errs = append(errs, inertFlags(set, t.mode == tokenize.ModeOff, "--tokenize off: needs --tokenize pool or endpoint",
		"tokenize-timeout", "tokenize-timeout-max", "tokenize-cache-tokens")...)
	return errs
}
