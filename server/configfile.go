package server

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"sigs.k8s.io/yaml"

	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/selection/flow"
	"github.com/kvselect/kvselect/selection/routerconfig"
	"github.com/kvselect/kvselect/selection/scheduler"
)

// envPolicy names the selection policy in the environment (--policy wins).
const envPolicy = "KVSELECT_POLICY"

// configFile is the --config file, YAML or JSON (JSON is YAML):
//
//	policy:
//	  name: kv-cost               # a registered policy (scheduler.Names)
//	  parameters:                 # the policy's own; reloaded on SIGHUP
//	    router_temperature: 0.1
//	router:                       # Dynamo's router knobs by KvRouterConfig name
//	  router_queue_threshold: 2
//	auth:                         # REST mTLS identities (with --tls-client-ca); reloaded on SIGHUP
//	  client_certificates:
//	    - ou: kvselect-operators
//	      scopes: [read, admin]
//	objectives:                   # InferenceObjective name → priority (flow control); reloaded on SIGHUP
//	  premium: 10
//	  batch: -1
//
// Unknown keys at any level are errors naming the key and the file.
type configFile struct {
	Policy *filePolicy    `json:"policy,omitempty"`
	Router map[string]any `json:"router,omitempty"`
	Auth   *fileAuth      `json:"auth,omitempty"`
	// Objectives are the priorities of the objective names requests give in
	// x-llm-d-inference-objective, for pickers not on Kubernetes (there
	// the pool's InferenceObjectives, which win over these).
	Objectives map[string]int `json:"objectives,omitempty"`

	path string // where it was read from, for messages
}

// fileAuth is the auth section: the scopes of verified client certificates.
type fileAuth struct {
	ClientCertificates []access.CertRule `json:"client_certificates,omitempty"`
}

type filePolicy struct {
	Name       string         `json:"name,omitempty"`
	Parameters map[string]any `json:"parameters,omitempty"`
}

// readConfigFile reads and strictly decodes a config file. Its errors name
// the file; the caller decides whether they stop the server (at startup) or
// keep the running configuration (on reload).
func readConfigFile(path string) (*configFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	f := &configFile{path: path}
	// UnmarshalStrict rejects unknown fields and duplicate keys.
	if err := yaml.UnmarshalStrict(data, f); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return f, nil
}

// objectives returns the file's objectives table, checked: every name
// non-empty, printable and at most flow.MaxTenantLen bytes (it arrives in a
// header), every priority within flow control's bounds.
func (f *configFile) objectives() (map[string]int, error) {
	if f == nil {
		return nil, nil
	}
	for _, name := range slices.Sorted(maps.Keys(f.Objectives)) {
		p := f.Objectives[name]
		switch {
		case name == "" || len(name) > flow.MaxTenantLen:
			return nil, fmt.Errorf("%s: objective name %q: want 1 to %d bytes", f.path, name, flow.MaxTenantLen)
		case strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }):
			return nil, fmt.Errorf("%s: objective name %q: not printable", f.path, name)
		case p < flow.MinPriority || p > flow.MaxPriority:
			return nil, fmt.Errorf("%s: objectives.%s: priority %d is out of range [%d, %d]", f.path, name, p, flow.MinPriority, flow.MaxPriority)
		}
	}
	return f.Objectives, nil
}

// label names a key of the file in messages ("kvselect.yaml: router.x").
func (f *configFile) label(section string) func(key string) string {
	return func(key string) string { return f.path + ": " + section + "." + key }
}

// rawValue writes a decoded YAML/JSON scalar as the environment would hold
// it, so file and environment share one parser per knob. null is blank,
// which every knob reads as unset.
func rawValue(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "", true
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}

// policyChoice is the selection policy the server runs and where its name
// came from.
type policyChoice struct {
	name   string // a registered name; "" for a policy set with WithPolicy
	source string // "--policy", envPolicy, the file, "default", "server.WithPolicy"
	// params are the file's parameters for a policy other than kv-cost, whose
	// parameters are router knobs and travel in the router configuration.
	params scheduler.Params
}

// choosePolicy applies the precedence flag > environment > file > default to
// the policy name. embedded is WithPolicy's policy, which nothing may name.
// The file's parameters of a policy the flag or environment overrode are an
// error.
func choosePolicy(o *options, lookup func(string) (string, bool), file *configFile, embedded bool) (policyChoice, error) {
	var c policyChoice
	var fileName string
	if file != nil && file.Policy != nil {
		fileName = strings.TrimSpace(file.Policy.Name)
		if fileName == "" && len(file.Policy.Parameters) > 0 {
			return c, usagef("%s: policy.parameters needs policy.name", file.path)
		}
	}
	env, _ := lookup(envPolicy)
	env = strings.TrimSpace(env)
	switch {
	case o.set["policy"]:
		c = policyChoice{name: strings.TrimSpace(o.policy), source: "--policy"}
	case env != "":
		c = policyChoice{name: env, source: envPolicy}
	case fileName != "":
		c = policyChoice{name: fileName, source: file.path}
	default:
		c = policyChoice{name: scheduler.DefaultPolicyName, source: "default"}
	}
	if embedded {
		if c.source != "default" {
			return c, usagef("%s names policy %q, but the program set its own (server.WithPolicy)", c.source, c.name)
		}
		return policyChoice{source: "server.WithPolicy"}, nil
	}
	if fileName != "" && len(file.Policy.Parameters) > 0 {
		if fileName != c.name {
			// Parameters the running policy never reads would read as if
			// they tuned it; refused like any setting without effect.
			return c, usagef("%s: policy.parameters of policy %s have no effect: %s chose policy %s; remove them from the file, or run policy %s", file.path, fileName, c.source, c.name, fileName)
		}
		c.params = scheduler.Params(file.Policy.Parameters)
	}
	return c, nil
}

// routerFile turns the file's router section, and the kv-cost policy's
// parameters (Dynamo's cost weights, which are router knobs), into the
// routerconfig.File Load layers under the environment.
func routerFile(file *configFile, choice *policyChoice) (routerconfig.File, error) {
	if file == nil {
		return routerconfig.File{}, nil
	}
	costKeys := scheduler.CostParamNames()
	values, where := map[string]string{}, map[string]string{}
	var errs []string
	// take copies one section's values, refusing the keys refuse has a
	// reason against.
	take := func(section string, m map[string]any, refuse func(key string) string) {
		for _, key := range slices.Sorted(maps.Keys(m)) {
			why := refuse(key)
			raw, ok := rawValue(m[key])
			if why == "" && !ok {
				why = "must be a number, string or boolean"
			}
			if why != "" {
				errs = append(errs, fmt.Sprintf("%s: %s.%s %s", file.path, section, key, why))
				continue
			}
			values[key], where[key] = raw, section
		}
	}
	take("router", file.Router, func(key string) string {
		if slices.Contains(costKeys, key) {
			return "is a parameter of the " + scheduler.DefaultPolicyName + " policy: set it under policy.parameters"
		}
		return ""
	})
	if choice.name == scheduler.DefaultPolicyName {
		take("policy.parameters", choice.params, func(key string) string {
			if !slices.Contains(costKeys, key) {
				return fmt.Sprintf("is not a parameter of policy %s (known: %s)", scheduler.DefaultPolicyName, strings.Join(costKeys, ", "))
			}
			return ""
		})
		choice.params = nil
	}
	if len(errs) > 0 {
		return routerconfig.File{}, usagef("%s", strings.Join(errs, "\n"))
	}
	return routerconfig.File{Values: values, Label: func(key string) string {
		return file.label(where[key])(key)
	}}, nil
}
