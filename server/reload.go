package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"

	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// reloader re-reads the --config file when told to (SIGHUP, or WithReload's
// channel) and applies what can change while kvselect runs: the selection
// policy's parameters, the client certificate rules and the objectives. Everything else in the file — the policy's name, the
// router knobs outside the policy — is fixed at startup (indexes, trackers
// and listeners are built from it), so a change there is logged as needing a
// restart and not applied. A file that fails to read, parse or validate
// changes nothing: the last good configuration keeps running.
type reloader struct {
	o        *options
	lookup   func(string) (string, bool)
	embedded *scheduler.Policy
	svc      *selection.Service
	log      *slog.Logger
	cur      resolved      // the configuration in force
	auth     *access.Chain // the REST authorizer whose client-certificate rules a reload replaces; nil: none
	// objectives takes the file's objectives table.
	objectives *flow.Objectives
	// sig (SIGHUP) and trigger (WithReload) ask for a reload; either may be
	// nil.
	sig     <-chan os.Signal
	trigger <-chan struct{}
}

// newReloader is the reloader of the configuration run started with (conf),
// asked by hup or the program's trigger; nil without a --config file or a
// trigger.
func newReloader(o *options, set *settings, svc *selection.Service, conf startup, objectives *flow.Objectives, hup <-chan os.Signal, log *slog.Logger) *reloader {
	if o.configFile == "" && set.reload == nil {
		return nil
	}
	return &reloader{o: o, lookup: set.lookup, embedded: set.policy, svc: svc, log: log, cur: conf.initial, auth: conf.authz,
		objectives: objectives, sig: hup, trigger: set.reload}
}

// run reloads whenever asked until ctx ends.
func (r *reloader) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.sig:
		case <-r.trigger:
		}
		r.reload()
	}
}

// reload applies the file as it is now. It reports whether the policy was
// replaced.
func (r *reloader) reload() bool {
	path := r.o.configFile
	if path == "" {
		r.log.Warn("config reload: kvselect runs without --config; nothing to reload")
		return false
	}
	file, err := readConfigFile(path)
	if err != nil {
		r.log.Error("config reload failed; the running configuration stays", "err", err)
		return false
	}
	next, err := resolveConfig(r.o, r.lookup, file, r.embedded, r.log)
	if err != nil {
		r.log.Error("config reload failed; the running configuration stays", "file", path, "err", err)
		return false
	}
	objectives, err := file.objectives()
	if err != nil {
		r.log.Error("config reload failed; the running configuration stays", "err", err)
		return false
	}
	if !r.reloadCertRules(file) {
		return false
	}
	if r.objectives != nil && !maps.Equal(r.objectives.File(), objectives) {
		r.objectives.Set(flow.SourceFile, objectives)
		r.log.Info("config reload: objectives in force", "objectives", len(objectives))
	}
	restart := routerChanges(r.cur.cfg.Router, next.cfg.Router)
	samePolicy := next.policy.name == r.cur.policy.name
	if !samePolicy {
		restart = append([]string{"policy.name"}, restart...)
	}
	if len(restart) > 0 {
		r.log.Warn("config reload: these settings take effect only at startup; restart kvselect to apply them",
			"file", path, "changed", restart)
	}
	switch {
	case r.embedded != nil:
		r.log.Info("config reloaded; the policy is the program's own (server.WithPolicy) and stays", "file", path)
		return false
	case !samePolicy:
		r.log.Warn("config reload: the policy parameters are not applied: they belong to another policy than the running one",
			"file", path, "running", r.cur.policy.name, "file_policy", next.policy.name)
		return false
	}
	if err := r.svc.SetPolicy(*next.cfg.Policy); err != nil {
		r.log.Error("config reload failed; the running configuration stays", "file", path, "err", err)
		return false
	}
	r.cur = next
	r.log.Info("config reloaded", append([]any{"file", path}, policyAttrs(next)...)...)
	return true
}

// reloadCertRules puts the file's auth.client_certificates in force when
// the REST API verifies client certificates; invalid rules fail the reload.
func (r *reloader) reloadCertRules(file *configFile) bool {
	if r.auth == nil || r.o.auth.tlsClientCA == "" {
		return true
	}
	rules, err := certRules(file)
	if err == nil && (rules == nil || rules.Len() == 0) {
		err = errors.New("auth.client_certificates is empty: no client certificate would be granted a scope")
	}
	if err != nil {
		r.log.Error("config reload failed; the running configuration stays", "file", file.path, "err", err)
		return false
	}
	r.auth.SetCertRules(rules)
	r.log.Info("config reload: client certificate rules in force", "rules", rules.Len())
	return true
}

// routerChanges names the router knobs that differ between a and b, by their
// config-file keys, leaving out the cost weights (the kv-cost policy's
// parameters, which a reload applies).
func routerChanges(a, b routerconfig.Config) []string {
	keys := map[string]string{} // Config field → file key
	for _, v := range routerconfig.EnvTable() {
		if v.Field != "" && v.Key != "" {
			keys[v.Field] = v.Key
		}
	}
	costs := scheduler.CostParamNames()
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := range va.NumField() {
		name := va.Type().Field(i).Name
		key, ok := keys[name]
		if !ok {
			key = name
		}
		if slices.Contains(costs, key) || reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			continue
		}
		out = append(out, key)
	}
	return out
}

// policyAttrs describes the policy in force for the logs: its name, where
// the name came from, and its parameters.
func policyAttrs(r resolved) []any {
	name := r.policy.name
	if name == "" {
		name = "custom"
	}
	attrs := []any{slog.String("policy", name), slog.String("policy_source", r.policy.source)}
	switch {
	case r.cfg.Policy != nil && r.cfg.Policy.Costs != nil:
		attrs = append(attrs, slog.Any("policy_parameters", scheduler.CostParams(*r.cfg.Policy.Costs)))
	case len(r.policy.params) > 0:
		attrs = append(attrs, slog.Any("policy_parameters", r.policy.params))
	}
	if r.cfg.PickerPolicy != nil {
		attrs = append(attrs, slog.String("picker_policy", scheduler.PredictedLatencyPolicyName))
	}
	return attrs
}
