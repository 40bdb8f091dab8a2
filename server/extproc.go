package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvselect/kvselect/extproc"
	"github.com/kvselect/kvselect/internal/servingtls"
	"github.com/kvselect/kvselect/internal/vtcodec"
)

// extprocFlags are the endpoint picker's flags (Envoy ext_proc, GIE protocol
// 004; docs/extproc.md).
type extprocFlags struct {
	port         uint64
	fallbacks    int
	maxBodyBytes int
	testPick     bool
	defaultModel string

	secure     bool   // --extproc-secure-serving
	certPath   string // --extproc-cert-path
	certReload bool   // --extproc-cert-reload
	clientCA   string // --extproc-client-ca

	// --extproc-assume-request-body-mode / -response-: for Envoy releases
	// that send no protocol_config; set says whether either was given.
	assumedRequest, assumedResponse filterv3.ProcessingMode_BodySendMode
	assumeSet                       bool

	// --session-headers (else KVSELECT_SESSION_HEADERS): nil means the
	// picker's defaults; --session-as-fairness-id (else
	// KVSELECT_SESSION_AS_FAIRNESS_ID).
	sessionHeaders  []string
	sessionAsTenant bool
}

// The environment variables of the session flags (a flag given wins).
const (
	envSessionHeaders  = "KVSELECT_SESSION_HEADERS"
	envSessionAsTenant = "KVSELECT_SESSION_AS_FAIRNESS_ID"
)

// defaultExtProcPort is GIE's EPP port.
const defaultExtProcPort = 9002

// maxExtProcFallbacks bounds --extproc-fallbacks: a destination header of a
// few dozen endpoints is already more than any gateway retries.
const maxExtProcFallbacks = 32

func (e *extprocFlags) register(fs *flag.FlagSet) {
	fs.Uint64Var(&e.port, "extproc-port", defaultExtProcPort, "gRPC `port` of the Envoy ext_proc endpoint picker (GIE protocol 004) and its gRPC health service, on --host; 0 disables it. With --port 0 and no --extproc-port, a free port too")
	fs.IntVar(&e.fallbacks, "extproc-fallbacks", 0, "ordered fallback endpoints to append to x-gateway-destination-endpoint after the chosen one (`count`, 0 to 32); only for gateways that retry on them")
	fs.IntVar(&e.maxBodyBytes, "extproc-max-body-bytes", extproc.DefaultMaxBodyBytes, "largest request body the picker buffers, in `bytes`; larger requests get a 413 immediate response")
	fs.BoolVar(&e.testPick, "extproc-test-pick-header", false, "honour GIE conformance's test-epp-endpoint-selection request header and report x-conformance-test-served-endpoint (testing only)")
	fs.StringVar(&e.defaultModel, "extproc-default-model", "", "model (partition) of requests that name none in a header or body, e.g. bodiless requests; empty = \"default\"")
	// TLS as GIE's reference picker serves it (internal/servingtls has what
	// was read in GIE's source), but off by default so that a local Envoy
	// (deploy/envoy/envoy.yaml) and the demo dial plaintext; the Helm chart
	// and the kustomize base turn it on.
	fs.BoolVar(&e.secure, "extproc-secure-serving", false, "serve the picker's gRPC (ext_proc and gRPC health) over TLS 1.2+ with ALPN h2. GIE's reference endpoint picker serves TLS by default (its --secure-serving), so gateways configured for it dial TLS and need this on; the Helm chart and the kustomize base turn it on; a local Envoy such as deploy/envoy/envoy.yaml dials plaintext (deploy/envoy/envoy-tls.yaml dials TLS, envoy-mtls.yaml with a client certificate for --extproc-client-ca). Without --extproc-cert-path the certificate is self-signed, generated at startup. Kubernetes gRPC probes speak no TLS: probe GET /health on --port instead")
	fs.StringVar(&e.certPath, "extproc-cert-path", "", "`directory` holding tls.crt and tls.key (PEM; a mounted Kubernetes TLS Secret) for --extproc-secure-serving, which it requires; empty = a self-signed ECDSA P-256 certificate for localhost, 127.0.0.1, ::1 and the host name, valid one year")
	e.assumedRequest, e.assumedResponse = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	for _, m := range []struct {
		name, what string
		mode       *filterv3.ProcessingMode_BodySendMode
	}{{"extproc-assume-request-body-mode", "request_body_mode", &e.assumedRequest}, {"extproc-assume-response-body-mode", "response_body_mode", &e.assumedResponse}} {
		fs.Func(m.name, "body send `mode` (none, streamed, buffered, buffered_partial or full_duplex_streamed) taken for streams whose first message carries no protocol_config, i.e. from Envoy releases before it existed: set it to the ext_proc filter's processing_mode."+m.what+" (default full_duplex_streamed, GIE's configuration)", func(v string) error {
			mode, err := extproc.ParseBodyMode(v)
			*m.mode, e.assumeSet = mode, true
			return err
		})
	}
	fs.StringVar(&e.clientCA, "extproc-client-ca", "", "PEM `file` of the CAs that sign the gateway's client certificates: with it the picker requires and verifies one at every TLS handshake (mTLS), so only the gateway can book loads. Requires --extproc-secure-serving; re-read with the pair under --extproc-cert-reload, else read at startup")
	fs.Func("session-headers", "comma-separated request `headers` that name the picker's session (session affinity's key, --session-affinity-ttl-secs), in order of precedence: the first one a request sends with a value wins, then the body's nvext session_control.session_id. At most 8, case-insensitive; empty = body sessions only. Default x-kvselect-session-id,x-dynamo-session-id. x-correlation-id (aiperf keeps it constant across a conversation) is opt-in: clients that send a fresh one per request would fill the affinity table with one-request sessions. Overrides "+envSessionHeaders, func(v string) error {
		hs, err := parseSessionHeaders(v)
		e.sessionHeaders = hs
		return err
	})
	fs.BoolVar(&e.sessionAsTenant, "session-as-fairness-id", false, "a picker request that sends no x-llm-d-inference-fairness-id (or its deprecated x-gateway- name) is its session's tenant under flow control, so agent sessions share a priority band fairly; a session id that is no valid tenant (over 256 bytes, unprintable) stays in the default flow. Overrides "+envSessionAsTenant)
	fs.BoolVar(&e.certReload, "extproc-cert-reload", false, "re-read tls.crt and tls.key when their size or modification time changes (checked at new TLS connections, at most once a second); a pair that fails to load is logged and the previous one kept. Requires --extproc-cert-path")
}

func (e *extprocFlags) validate() []error {
	var errs []error
	if e.port > maxPort {
		errs = append(errs, fmt.Errorf("--extproc-port %d: must be between 0 and %d", e.port, maxPort))
	}
	if e.fallbacks < 0 || e.fallbacks > maxExtProcFallbacks {
		errs = append(errs, fmt.Errorf("--extproc-fallbacks %d: must be between 0 and %d", e.fallbacks, maxExtProcFallbacks))
	}
	if e.maxBodyBytes < 1 {
		errs = append(errs, fmt.Errorf("--extproc-max-body-bytes %d: must be at least 1", e.maxBodyBytes))
	}
	// GIE ignores --cert-path without secure serving; here TLS is off by
	// default, so a certificate given without the switch is a mistake to
	// report, not a silent plaintext server.
	if e.certPath != "" && !e.secure {
		errs = append(errs, errors.New("--extproc-cert-path requires --extproc-secure-serving"))
	}
	if e.clientCA != "" && !e.secure {
		errs = append(errs, errors.New("--extproc-client-ca requires --extproc-secure-serving (client certificates are part of TLS)"))
	}
	if e.certReload && e.certPath == "" {
		errs = append(errs, errors.New("--extproc-cert-reload requires --extproc-cert-path (a self-signed certificate has no files to reload)"))
	}
	return errs
}

// parseSessionHeaders reads a --session-headers list: lower-cased (Envoy
// hands the picker lower-case keys), checked by the picker's rules; blank is
// the empty list.
func parseSessionHeaders(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return []string{}, nil
	}
	hs, err := parseList(strings.ToLower(v), func(string) error { return nil })
	if err == nil {
		err = extproc.CheckSessionHeaders(hs)
	}
	return hs, err
}

// sessionsFromEnv reads the session flags' environment variables for the
// flags not given; a malformed value is a usage error.
func (e *extprocFlags) sessionsFromEnv(set map[string]bool, lookup func(string) (string, bool)) error {
	if v, ok := lookup(envSessionHeaders); ok && !set["session-headers"] && strings.TrimSpace(v) != "" {
		hs, err := parseSessionHeaders(v)
		if err != nil {
			return &UsageError{fmt.Errorf("%s: %w", envSessionHeaders, err)}
		}
		e.sessionHeaders = hs
	}
	if v, ok := lookup(envSessionAsTenant); ok && !set["session-as-fairness-id"] && strings.TrimSpace(v) != "" {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return &UsageError{fmt.Errorf("%s: %q is not a boolean", envSessionAsTenant, v)}
		}
		e.sessionAsTenant = b
	}
	return nil
}

// tlsOption is the picker's TLS server credential, or nil for plaintext. The
// key pair is read here, before the picker listens: a missing or unreadable
// file is a configuration error (exit status 2), like a bad key file.
func (e *extprocFlags) tlsOption(host string, log *slog.Logger) (grpc.ServerOption, error) {
	if !e.secure {
		return nil, nil // "ext_proc listening" says tls=false
	}
	cfg, leaf, err := servingtls.ServerConfig(servingtls.Options{CertDir: e.certPath, Reload: e.certReload, Hosts: servingtls.ExtraHosts(host),
		Logger: log, ClientCAFile: e.clientCA, RequireClientCert: e.clientCA != ""})
	switch {
	case errors.Is(err, servingtls.ErrClientCA):
		return nil, &UsageError{fmt.Errorf("--extproc-client-ca: %w", err)}
	case err != nil && e.certPath != "":
		return nil, &UsageError{fmt.Errorf("--extproc-cert-path %s: %w", e.certPath, err)}
	case err != nil:
		return nil, fmt.Errorf("ext_proc TLS: %w", err)
	}
	// Where the certificate comes from; the gateway's TLS settings depend on
	// it (docs/extproc.md "TLS").
	source := []any{"cert", "self-signed, generated at startup"}
	if e.certPath != "" {
		source = []any{"cert", "--extproc-cert-path", "dir", e.certPath, "reload", e.certReload}
	}
	source = append(source, "client_certificates", map[bool]string{true: "required, verified against --extproc-client-ca", false: "not asked for"}[e.clientCA != ""])
	log.Info("ext_proc TLS on", append(source, "subject", leaf.Subject.String(), "dns_names", leaf.DNSNames,
		"ip_addresses", leaf.IPAddresses, "not_after", leaf.NotAfter)...)
	return grpc.Creds(credentials.NewTLS(cfg)), nil
}

// extprocServer is the running picker.
type extprocServer struct {
	picker *extproc.Server
	grpc   *grpc.Server
	addr   net.Addr
	log    *slog.Logger
}

// startExtProc serves the picker on --host:--extproc-port beside the REST
// API, over the same selection.Service, and registers its metrics
// (kvselect_extproc_*); nil when disabled. Serve errors go to f.served; the
// stream limit is --extproc-max-streams' (limits.go).
func startExtProc(o *options, f *fronts, reg prometheus.Registerer) (*extprocServer, error) {
	e, log := o.extproc, f.log
	port := e.port
	switch {
	case o.set["extproc-port"] && port == 0:
		log.Info("ext_proc endpoint picker disabled (--extproc-port 0)")
		return nil, nil
	case !o.set["extproc-port"] && o.port == 0:
		// --port 0 (tests, several processes on one host): a free port here
		// too, named by the startup log, instead of a clash on 9002.
		port = 0
	}
	creds, err := e.tlsOption(o.host, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen(listenNetwork(o.host), net.JoinHostPort(o.host, strconv.FormatUint(port, 10)))
	if err != nil {
		return nil, fmt.Errorf("ext_proc listener: %w", err)
	}
	var assumed *extproc.BodyModes
	if e.assumeSet {
		assumed = &extproc.BodyModes{Request: e.assumedRequest, Response: e.assumedResponse}
	}
	picker := extproc.New(f.svc, extproc.Options{Logger: log, Fallbacks: e.fallbacks, MaxBodyBytes: e.maxBodyBytes,
		TestPickHeader: e.testPick, DefaultModel: e.defaultModel, AssumedModes: assumed,
		Disaggregate: o.disagg.mode == disaggAuto, PrefillHeader: o.disagg.prefillHeader, Objectives: f.objectives, Rewrites: f.rewrites, Tracing: f.tracing,
		SessionHeaders: e.sessionHeaders, SessionAsFairnessID: e.sessionAsTenant, BookingEnd: o.bookEnd.mode})
	if f.tokenizer != nil {
		// Before the listener serves, so that no early text prompt misses it.
		picker.SetTokenizer(f.tokenizer, o.tokenize.forwardIDs)
	}
	opts := append(extproc.ServerOptions(), f.limits.streamOption())
	if creds != nil {
		opts = append(opts, creds)
	}
	g := grpc.NewServer(opts...)
	picker.Register(g)
	encoder := "protobuf-go (built without -tags vtprotobuf)"
	if vtcodec.Fast() {
		encoder = "vtprotobuf"
	}
	log.Info("ext_proc listening", "addr", ln.Addr().String(), "tls", e.secure, "fallbacks", e.fallbacks, "max_body_bytes", e.maxBodyBytes,
		"test_pick_header", e.testPick, "booking_end", o.bookEnd.mode.String(), "assumed_body_modes", e.assumedRequest.String()+"/"+e.assumedResponse.String(), "encoder", encoder,
		"session_headers", strings.Join(picker.SessionHeaders(), ","), "session_as_fairness_id", e.sessionAsTenant)
	go func() {
		if err := g.Serve(ln); err != nil {
			f.served <- fmt.Errorf("ext_proc server: %w", err)
		}
	}()
	reg.MustRegister(picker)
	return &extprocServer{picker: picker, grpc: g, addr: ln.Addr(), log: log}, nil
}

// address is where the picker listens; nil when it is disabled.
func (s *extprocServer) address() net.Addr {
	if s == nil {
		return nil
	}
	return s.addr
}

// shutdown reports NOT_SERVING, lets in-flight streams finish until ctx ends,
// then closes the rest (their bookings are freed by the picker's cleanup).
func (s *extprocServer) shutdown(ctx context.Context) {
	if s == nil {
		return
	}
	s.picker.Shutdown()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		s.log.Warn("ext_proc streams still open at the shutdown timeout were closed")
	}
}
