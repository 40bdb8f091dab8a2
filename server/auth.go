package server

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/discovery/inferencepool"
	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/access/kubeauth"
	"github.com/kvselect/kvselect/internal/servingtls"
)

// authFlags secure the REST port: who may call it (tokens, Kubernetes
// ServiceAccounts, client certificates) and TLS (docs/security.md).
type authFlags struct {
	tokenFile      string        // --auth-token-file
	kubernetes     bool          // --auth-kubernetes
	kubeNamespace  string        // --auth-kubernetes-namespace
	kubeCacheTTL   time.Duration // --auth-kubernetes-cache-ttl
	kubeAudiences  []string      // --auth-kubernetes-audiences
	tlsCertPath    string        // --tls-cert-path
	tlsCertReload  bool          // --tls-cert-reload
	tlsClientCA    string        // --tls-client-ca
	allowOpenAdmin bool          // --auth-allow-unauthenticated (quietens the warning only)
}

// serviceAccountNamespace is where a pod finds its own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// loopbackHost is where the REST API binds when nothing authenticates it and
// --host is not given: a laptop demo works, a network neighbour cannot
// reroute prompts.
const loopbackHost = "127.0.0.1"

func (a *authFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.tokenFile, "auth-token-file", "", "`file` of REST API bearer tokens, one \"<token> <scope>[,<scope>...] [name=<name>] [expires=<RFC 3339>]\" per line; scopes: read (GET routes, /metrics, /dump), select (selections, reservations), admin (workers, replica peers, pprof). Re-read when it changes (a bad version is logged and the previous one kept); only SHA-256 digests are kept in memory. /health and /ready stay open")
	fs.BoolVar(&a.kubernetes, "auth-kubernetes", false, "also accept Kubernetes ServiceAccount bearer tokens: checked with a TokenReview, each scope with a SubjectAccessReview of verb \"use\" on resource \"scopes\" of API group kvselect.io, resource name = the scope, in --auth-kubernetes-namespace (docs/security.md has the RBAC). kvselect's own ServiceAccount needs system:auth-delegator")
	fs.StringVar(&a.kubeNamespace, "auth-kubernetes-namespace", "", "`namespace` of the SubjectAccessReviews (RoleBindings there grant scopes); default: the pod's own namespace, else --pool-namespace")
	fs.DurationVar(&a.kubeCacheTTL, "auth-kubernetes-cache-ttl", 30*time.Second, "how long an allowed Kubernetes review is cached (`duration`; denials 5 s at most; 0 = no cache, every request asks the API server); a revoked binding or deleted ServiceAccount takes effect within it (plus the API server's own token cache, about 10 s)")
	fs.Func("auth-kubernetes-audiences", "comma-separated `audiences` a ServiceAccount token must be issued for (TokenReview spec.audiences); default: the API server's", func(s string) error {
		for aud := range strings.SplitSeq(s, ",") {
			if aud = strings.TrimSpace(aud); aud != "" {
				a.kubeAudiences = append(a.kubeAudiences, aud)
			}
		}
		return nil
	})
	fs.StringVar(&a.tlsCertPath, "tls-cert-path", "", "`directory` holding tls.crt and tls.key (PEM; a mounted Kubernetes TLS Secret): serve the REST API over TLS 1.2+ (HTTP/2 and HTTP/1.1). Default: plaintext")
	fs.BoolVar(&a.tlsCertReload, "tls-cert-reload", false, "re-read --tls-cert-path's tls.crt and tls.key when their size or modification time changes (checked at new TLS connections, at most once a second); a pair that fails to load is logged and the previous one kept")
	fs.StringVar(&a.tlsClientCA, "tls-client-ca", "", "PEM `file` of the CAs that sign REST clients' certificates: a verified certificate is an identity, granted the scopes of the config file's auth.client_certificates rules that match its SAN, OU or CN (mTLS). A client without one may still use a bearer token. Requires --tls-cert-path; re-read with the pair under --tls-cert-reload, else read at startup")
	fs.BoolVar(&a.allowOpenAdmin, "auth-allow-unauthenticated", false, "serve the REST API without authentication on the --host given, without the startup warning (a trusted network, as Dynamo's service assumes)")
}

func (a *authFlags) validate() []error {
	var errs []error
	if a.tlsCertReload && a.tlsCertPath == "" {
		errs = append(errs, errors.New("--tls-cert-reload requires --tls-cert-path"))
	}
	if a.tlsClientCA != "" && a.tlsCertPath == "" {
		errs = append(errs, errors.New("--tls-client-ca requires --tls-cert-path (client certificates are part of TLS)"))
	}
	if a.kubeCacheTTL < 0 {
		errs = append(errs, fmt.Errorf("--auth-kubernetes-cache-ttl %s: must not be negative", a.kubeCacheTTL))
	}
	if !a.kubernetes {
		if a.kubeNamespace != "" {
			errs = append(errs, errors.New("--auth-kubernetes-namespace requires --auth-kubernetes"))
		}
		if len(a.kubeAudiences) > 0 {
			errs = append(errs, errors.New("--auth-kubernetes-audiences requires --auth-kubernetes"))
		}
	}
	if a.allowOpenAdmin && a.enabled() {
		errs = append(errs, errors.New("--auth-allow-unauthenticated contradicts --auth-token-file, --auth-kubernetes and --tls-client-ca"))
	}
	return errs
}

// enabled reports whether the REST API authenticates its callers.
func (a *authFlags) enabled() bool {
	return a.tokenFile != "" || a.kubernetes || a.tlsClientCA != ""
}

// restHost is the REST API's bind address: --host when given; else, without
// authentication, loopback only.
func restHost(o *options) string {
	if o.set["host"] || o.auth.enabled() {
		return o.host
	}
	return loopbackHost
}

// isLoopback reports whether host binds loopback addresses only.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// authorizer builds the REST API's Authorizer from the flags and the config
// file's auth section, and the metrics of its sources beside the chain's
// own; nil when authentication is off. Its errors are usage errors naming
// the flag or file.
func (a *authFlags) authorizer(file *configFile, discoveryNamespace, kubeconfig string, log *slog.Logger) (*access.Chain, []prometheus.Collector, error) {
	rules, err := certRules(file)
	if err != nil {
		return nil, nil, &UsageError{err}
	}
	switch {
	case rules != nil && a.tlsClientCA == "":
		// Without a CA no client certificate is verified, so the rules would
		// grant nothing while the file reads as if they guarded the API.
		return nil, nil, usagef("%s: auth.client_certificates has no effect without --tls-client-ca (no client certificate is verified); set --tls-client-ca with --tls-cert-path, or remove the section", file.path)
	case a.tlsClientCA != "" && (rules == nil || rules.Len() == 0):
		return nil, nil, &UsageError{errors.New("--tls-client-ca is set but the config file has no auth.client_certificates rules: no certificate would be granted a scope")}
	}
	if !a.enabled() {
		return nil, nil, nil
	}
	var tokens *access.TokenFile
	if a.tokenFile != "" {
		if tokens, err = access.OpenTokenFile(a.tokenFile, log, nil); err != nil {
			return nil, nil, &UsageError{fmt.Errorf("--auth-token-file: %w", err)}
		}
		if tokens.Len() == 0 {
			log.Warn("--auth-token-file holds no token yet: no bearer token from it is accepted until one is added", "path", a.tokenFile)
		}
	}
	var checker access.TokenChecker
	var collectors []prometheus.Collector
	if a.kubernetes {
		cfg, err := inferencepool.RESTConfig(kubeconfig)
		if err != nil {
			return nil, nil, &UsageError{fmt.Errorf("--auth-kubernetes: %w", err)}
		}
		// One TokenReview per client token and one SubjectAccessReview per
		// token and scope per cache TTL: client-go's default 5 requests per
		// second would queue a burst of new clients behind each other.
		cfg = rest.CopyConfig(cfg)
		cfg.QPS, cfg.Burst = 50, 100
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, nil, &UsageError{fmt.Errorf("--auth-kubernetes: %w", err)}
		}
		ns := a.kubeNamespace
		if ns == "" {
			ns = discoveryNamespace
			if b, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
				ns = strings.TrimSpace(string(b))
			}
		}
		ttl := a.kubeCacheTTL
		if ttl == 0 {
			ttl = -1 // kubeauth's "no cache"; its zero is the default
		}
		k, err := kubeauth.New(kubeauth.Config{Client: client, Namespace: ns, Audiences: a.kubeAudiences, CacheTTL: ttl, Logger: log})
		if err != nil {
			return nil, nil, &UsageError{fmt.Errorf("--auth-kubernetes: %w", err)}
		}
		checker = k
		collectors = append(collectors, k)
		log.Info("REST authentication: Kubernetes ServiceAccount tokens", "api_server", cfg.Host, "namespace", ns, "cache_ttl", a.kubeCacheTTL.String())
	}
	if a.tlsClientCA == "" {
		rules = nil
	}
	return access.NewChain(tokens, checker, rules), collectors, nil
}

// certRules reads the config file's auth.client_certificates; nil without
// them.
func certRules(file *configFile) (*access.CertRules, error) {
	if file == nil || file.Auth == nil || file.Auth.ClientCertificates == nil {
		return nil, nil
	}
	rules, err := access.NewCertRules(file.Auth.ClientCertificates)
	if err != nil {
		return nil, fmt.Errorf("%s: auth.%w", file.path, err)
	}
	return rules, nil
}

// listen wraps ln in TLS when --tls-cert-path is set.
func (a *authFlags) listen(ln net.Listener, host string, log *slog.Logger) (net.Listener, error) {
	if a.tlsCertPath == "" {
		return ln, nil
	}
	cfg, leaf, err := servingtls.ServerConfig(servingtls.Options{CertDir: a.tlsCertPath, Reload: a.tlsCertReload, Hosts: servingtls.ExtraHosts(host),
		Logger: log, NextProtos: []string{"h2", "http/1.1"}, ClientCAFile: a.tlsClientCA})
	switch {
	case errors.Is(err, servingtls.ErrClientCA):
		return nil, &UsageError{fmt.Errorf("--tls-client-ca: %w", err)}
	case err != nil:
		return nil, &UsageError{fmt.Errorf("--tls-cert-path %s: %w", a.tlsCertPath, err)}
	}
	log.Info("REST TLS on", "dir", a.tlsCertPath, "reload", a.tlsCertReload, "client_ca", a.tlsClientCA,
		"subject", leaf.Subject.String(), "dns_names", leaf.DNSNames, "not_after", leaf.NotAfter)
	return tls.NewListener(ln, cfg), nil
}
