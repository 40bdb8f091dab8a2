package server

import (
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/kvhash"
	"github.com/kvselect/kvselect/selection/pending"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// resolved is the configuration Run starts with, and what a reload compares
// the re-read file against.
type resolved struct {
	cfg    selection.Config // cfg.Policy is set
	policy policyChoice
}

// startup is the configuration run starts with.
type startup struct {
	file    *configFile // nil without --config
	initial resolved
	// authz decides who may call the REST API (auth.go); nil when nobody is
	// authenticated. authMetrics are its sources' metrics.
	authz       *access.Chain
	authMetrics []prometheus.Collector
}

// configure reads the --config file, layers it with the environment and the
// flags (resolveConfig), and builds the REST API's authorizer.
func configure(o *options, set *settings, log *slog.Logger) (startup, error) {
	var s startup
	var err error
	if o.configFile != "" {
		if s.file, err = readConfigFile(o.configFile); err != nil {
			return startup{}, &UsageError{err}
		}
	}
	if s.initial, err = resolveConfig(o, set.lookup, s.file, set.policy, log); err != nil {
		return startup{}, err
	}
	if s.authz, s.authMetrics, err = o.auth.authorizer(s.file, o.discovery.poolNamespace, o.discovery.kubeconfig, log); err != nil {
		return startup{}, err
	}
	log.Debug("router configuration", routerAttrs(s.initial.cfg.Router, false)...)
	return s, nil
}

// resolveConfig layers the configuration: defaults, then the --config file
// (nil without one), then the DYN_ROUTER_* and KVSELECT_* environment, then
// every flag given on the command line, as Dynamo layers environment and
// flags. The merged router configuration is validated last, so a flag can
// repair an environment value that only its cross-field rules reject.
// Warnings are logged; every error is a *UsageError (exit status 2).
// embedded is WithPolicy's policy, if any.
func resolveConfig(o *options, lookup func(string) (string, bool), file *configFile, embedded *scheduler.Policy, log *slog.Logger) (resolved, error) {
	choice, err := choosePolicy(o, lookup, file, embedded != nil)
	if err != nil {
		return resolved{}, err
	}
	rf, err := routerFile(file, &choice)
	if err != nil {
		return resolved{}, err
	}
	rc, warnings, err := routerconfig.Load(rf, lookup)
	// Each message names its variable or file key; the prefix only says
	// where to look when there is no file.
	source := "environment"
	if file != nil {
		source = "configuration"
	}
	for _, w := range warnings {
		log.Warn(w, "source", source)
	}
	if err != nil {
		return resolved{}, &UsageError{fmt.Errorf("%s: %w", source, err)}
	}

	applyRouterFlags(o, &rc)
	if err := rc.Validate(); err != nil {
		return resolved{}, &UsageError{err}
	}
	if err := checkReplicaSync(o, rc, lookup, file); err != nil {
		return resolved{}, err
	}
	// Checked after the flags: --session-affinity-ttl-secs turns affinity on.
	if label, _, ok := routerSetting(lookup, file, envSessionAffinityMode, "session_affinity_mode"); ok && !rc.SessionAffinityTTL.IsSet() {
		log.Warn(label+" has no effect: session affinity is off until DYN_ROUTER_SESSION_AFFINITY_TTL_SECS or --session-affinity-ttl-secs is set", "source", source)
	}
	pol, err := newPolicy(choice, rc, file, embedded)
	if err != nil {
		return resolved{}, err
	}
	var pickerPol *scheduler.Policy
	if choice.source == "default" && embedded == nil {
		// No policy named: a default per front. The REST API's callers
		// come from Dynamo and get its cost, bit for bit; the gateway's
		// picker gets the policy that routes better (docs/selection.md,
		// "The default").
		p, err := scheduler.New(scheduler.PredictedLatencyPolicyName, nil)
		if err != nil {
			return resolved{}, err
		}
		pickerPol = &p
	}
	return resolved{policy: choice, cfg: selection.Config{
		Router:       rc,
		Policy:       &pol,
		PickerPolicy: pickerPol,
		// The service builds its tracker from Tracking alone; it must say what
		// the router configuration says. The key itself is read by
		// loadTrackingKey, when the server starts.
		Tracking: kvhash.TrackingConfig{
			Algorithm: string(rc.TrackingHash),
			KeyID:     rc.TrackingKeyID.Or(""),
		},
		SelectionCache: pending.Config{TTL: o.cacheTTL, MaxEntries: o.cacheMaxEntries, MaxBytes: o.cacheMaxBytes},
	}}, nil
}

// applyRouterFlags puts the router flags given on the command line over rc.
func applyRouterFlags(o *options, rc *routerconfig.Config) {
	if o.set["threads"] {
		rc.EventThreads = o.threads
	}
	if o.set["session-affinity-ttl-secs"] {
		rc.SessionAffinityTTL = routerconfig.Some(time.Duration(o.sessionAffinityTTLSecs) * time.Second)
	}
	if o.set["router-tracking-hash"] {
		rc.TrackingHash = routerconfig.TrackingHash(o.trackingHash)
	}
	if o.set["router-tracking-key-file"] {
		rc.TrackingKeyFile = optionalString(o.trackingKeyFile)
	}
	if o.set["router-tracking-key-id"] {
		rc.TrackingKeyID = optionalString(o.trackingKeyID)
	}
	// --router-assume-kv-reuse=false and --no-router-assume-kv-reuse=false are
	// accepted as the Go flag package spells them and mean what they say.
	if o.set["router-assume-kv-reuse"] {
		rc.AssumeKVReuse = o.assumeKVReuse
	}
	if o.set["no-router-assume-kv-reuse"] {
		rc.AssumeKVReuse = !o.noAssumeKVReuse
	}
}

// Router settings the server checks after the flags are applied.
const (
	envReplicaSync         = "DYN_ROUTER_REPLICA_SYNC"
	envSessionAffinityMode = "DYN_ROUTER_SESSION_AFFINITY_MODE"
)

// routerSetting reports whether a router knob was given, by its variable or
// else by its key in the file's router section, as routerconfig.Load reads
// them, and names where it came from.
func routerSetting(lookup func(string) (string, bool), file *configFile, env, key string) (label, raw string, ok bool) {
	if v, set := lookup(env); set && strings.TrimSpace(v) != "" {
		return env, v, true
	}
	if file == nil {
		return "", "", false
	}
	v, set := file.Router[key]
	if raw, _ = rawValue(v); !set || strings.TrimSpace(raw) == "" {
		return "", "", false
	}
	return file.label("router")(key), raw, true
}

// checkReplicaSync gives DYN_ROUTER_REPLICA_SYNC=true (or the file's
// router.router_replica_sync) the meaning it has in Dynamo, share load with
// the other router replicas, which kvselect does only with
// --replica-sync-port: without the port there is nothing to publish on and no
// peer to hear from, so the setting is refused rather than ignored. false
// needs no check: a flag wins over the environment and the file.
func checkReplicaSync(o *options, rc routerconfig.Config, lookup func(string) (string, bool), file *configFile) error {
	if !rc.ReplicaSync || o.set["replica-sync-port"] {
		return nil
	}
	label, raw, _ := routerSetting(lookup, file, envReplicaSync, "router_replica_sync")
	return usagef("%s=%q: not supported by kvselect without --replica-sync-port (replica sync needs a port to publish on and peers to subscribe to); set --replica-sync-port and --replica-sync-peers, or unset it", label, raw)
}

// newPolicy builds the chosen policy: embedded (WithPolicy's) when given;
// kv-cost with the router's cost weights from rc; any other by its name and
// the file's parameters. An error is a *UsageError naming where the
// offending input was.
func newPolicy(choice policyChoice, rc routerconfig.Config, file *configFile, embedded *scheduler.Policy) (scheduler.Policy, error) {
	var pol scheduler.Policy
	var err error
	switch {
	case embedded != nil:
		return *embedded, nil
	case choice.name == scheduler.DefaultPolicyName:
		// kv-cost's parameters are the router's cost weights, layered above.
		pol, err = scheduler.New(choice.name, scheduler.CostParams(selection.CostWeightsOf(rc)))
	default:
		pol, err = scheduler.New(choice.name, choice.params)
	}
	if err != nil {
		// The file's parameters, or whatever named the policy.
		where := choice.source
		if len(choice.params) > 0 {
			where = file.path + ": policy.parameters"
		}
		return scheduler.Policy{}, &UsageError{fmt.Errorf("%s: %w", where, err)}
	}
	return pol, nil
}

// loadTrackingKey reads the keyed-xxh3-v1 key named by the router
// configuration (--router-tracking-key-file, DYN_ROUTER_TRACKING_KEY_FILE)
// into cfg.Tracking. A file that cannot be read is a *UsageError naming it;
// its size is checked by selection.New.
func loadTrackingKey(cfg *selection.Config) error {
	path, ok := cfg.Router.TrackingKeyFile.Get()
	if !ok {
		return nil
	}
	key, err := os.ReadFile(path)
	if err != nil {
		return &UsageError{fmt.Errorf("tracking key file: %w", err)}
	}
	cfg.Tracking.Key = key
	return nil
}

// optionalString maps a flag value to a router knob; the empty string unsets
// it, so a flag can clear a key file or key id inherited from the environment.
func optionalString(s string) routerconfig.Optional[string] {
	if s == "" {
		return routerconfig.Optional[string]{}
	}
	return routerconfig.Some(s)
}

// configAttrs is the effective configuration for the startup log: the service
// settings, then the router knobs that differ from Dynamo's defaults (the full
// set goes to the debug log, see routerAttrs).
func configAttrs(cfg selection.Config) []any {
	sessionTTL := "off"
	if d, ok := cfg.Router.SessionAffinityTTL.Get(); ok {
		sessionTTL = d.String()
	}
	return []any{
		slog.Int("threads", cfg.Router.EventThreads),
		slog.String("session_affinity_ttl", sessionTTL),
		slog.Group("selection_cache",
			slog.String("ttl", cfg.SelectionCache.TTL.String()),
			slog.Int("max_entries", cfg.SelectionCache.MaxEntries),
			slog.Int64("max_bytes", cfg.SelectionCache.MaxBytes)),
		slog.String("tracking_hash", string(cfg.Router.TrackingHash)),
		slog.Bool("assume_kv_reuse", cfg.Router.AssumeKVReuse),
		slog.Bool("use_kv_events", cfg.Router.UseKVEvents),
		slog.Group("router_non_default", routerAttrs(cfg.Router, true)...),
	}
}

// routerAttrs lists the router configuration field by field (the names of
// routerconfig.Config), optionally only the fields that differ from
// routerconfig.Default. Key material is never logged: only the key file path
// and key id, which routerconfig itself prints in errors.
func routerAttrs(c routerconfig.Config, changedOnly bool) []any {
	v, def := reflect.ValueOf(c), reflect.ValueOf(routerconfig.Default())
	var out []any
	for i := range v.NumField() {
		f := v.Field(i)
		if changedOnly && reflect.DeepEqual(f.Interface(), def.Field(i).Interface()) {
			continue
		}
		var val any = f.Interface()
		if s, ok := val.(fmt.Stringer); ok {
			val = s.String()
		}
		out = append(out, slog.Any(v.Type().Field(i).Name, val))
	}
	return out
}
