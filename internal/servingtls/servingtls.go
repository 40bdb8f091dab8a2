// Package servingtls builds the server-side TLS configuration of kvselect's
// gRPC endpoint picker: a key pair read from a directory holding tls.crt and
// tls.key (the layout of a mounted Kubernetes TLS Secret), optionally re-read
// when those files change, or else a self-signed certificate made at startup.
//
// It follows GIE's reference endpoint picker (kubernetes-sigs/
// gateway-api-inference-extension, read at the paths below), which serves
// its ext_proc gRPC with TLS by default:
//
//   - cmd/epp/runner/options.go: --secure-serving (default true), --cert-path
//     (a directory; "tls.crt" and "tls.key" inside it; without it, and with
//     secure serving on, a self-signed certificate), --enable-cert-reload
//     (only for --cert-path). --cert-path is silently ignored without secure
//     serving; kvselect rejects that combination instead.
//   - pkg/epp/server/runserver.go: tls.LoadX509KeyPair(CertPath+"/tls.crt",
//     CertPath+"/tls.key"), else internal/tls.CreateSelfSignedTLSCertificate;
//     grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: ...})), or
//     GetCertificate from the reloader. No MinVersion, no client certificates.
//   - internal/tls/tls.go: the self-signed certificate is RSA 4096, valid 10
//     years, Organization "Inference Ext", with no DNS or IP SANs: nothing can
//     verify it, so gateways dial the picker with TLS and no verification
//     (GIE's own standalone Envoy, config/charts/inferencepool/templates/
//     envoy.yaml, has an UpstreamTlsContext with an empty validation_context).
//   - pkg/common/certs.go: the reloader watches the directory with fsnotify,
//     debounces Write/Create events by 250 ms, reloads the pair, and on an
//     error logs it and keeps serving the previous certificate.
//
// kvselect differs where nothing depends on GIE's choice: the self-signed
// key is ECDSA P-256 (a 4096-bit RSA key takes seconds on a busy core at
// every start), it is valid one year and names localhost, 127.0.0.1, ::1 and
// the host name, so a client that pins it can also verify it; and reloading
// polls the files' size and modification time at new TLS handshakes, at most
// once a second, instead of running an fsnotify watcher goroutine: a
// certificate only matters at a handshake, and the picker's gateways keep
// their HTTP/2 connections open, so the check costs nothing per request.
package servingtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvselect/kvselect/internal/filewatch"
)

// The file names inside the certificate directory: a Kubernetes TLS Secret's
// keys, as GIE's --cert-path expects.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// SelfSignedValidity is how long a generated certificate is valid. A picker
// that runs longer than this needs a restart (or a mounted certificate).
const SelfSignedValidity = 365 * 24 * time.Hour

// reloadCheckEvery bounds how often the files are stat'ed: at most once per
// interval, at a handshake.
const reloadCheckEvery = time.Second

// Options selects where the certificate comes from.
type Options struct {
	// CertDir holds tls.crt and tls.key (PEM). Empty: a self-signed
	// certificate is generated.
	CertDir string
	// Reload re-reads the pair in CertDir when either file changes; a pair
	// that fails to load is logged and the previous one kept. Needs CertDir.
	Reload bool
	// Hosts are names or IP addresses added to the self-signed certificate,
	// after localhost, 127.0.0.1, ::1 and the host name.
	Hosts []string
	// Logger receives reload messages; nil discards them.
	Logger *slog.Logger
	// NextProtos are the ALPN protocols offered; empty means h2 only (gRPC).
	// An HTTP server that also speaks HTTP/1.1 lists both: a client that
	// offers only http/1.1 is refused by a server that offers only h2.
	NextProtos []string
	// ClientCAFile is a PEM bundle of the CAs that sign client certificates.
	// Empty: client certificates are neither asked for nor verified. With
	// Reload it is re-read when it changes, like the pair; a bundle that
	// fails to load is logged and the previous one kept.
	ClientCAFile string
	// RequireClientCert refuses the handshake of a client without a
	// certificate the bundle verifies. Without it a certificate is verified
	// when given (so bearer tokens still work over the same port). Needs
	// ClientCAFile.
	RequireClientCert bool

	now func() time.Time // the reload checks' clock; nil: time.Now (tests set it)
}

// ServerConfig returns the TLS configuration for a gRPC server (TLS 1.2 or
// later, ALPN h2 as gRPC requires) and the certificate it starts with, for
// the caller's startup log. Every error names the file or step that failed.
func ServerConfig(o Options) (*tls.Config, *x509.Certificate, error) {
	now := o.now
	if now == nil {
		now = time.Now
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if len(o.NextProtos) > 0 {
		cfg.NextProtos = slices.Clone(o.NextProtos)
	}
	switch {
	case o.RequireClientCert && o.ClientCAFile == "":
		return nil, nil, errors.New("requiring client certificates needs a client CA bundle")
	case o.ClientCAFile != "":
		pool, err := LoadCAs(o.ClientCAFile)
		if err != nil {
			return nil, nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
		if o.RequireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	switch {
	case o.CertDir == "" && o.Reload:
		return nil, nil, errors.New("certificate reload needs a certificate directory")
	case o.CertDir == "":
		cert, err := SelfSigned(defaultHosts(o.Hosts), time.Now())
		if err != nil {
			return nil, nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
		return cfg, cert.Leaf, nil
	case o.Reload:
		r, err := newReloader(o.CertDir, reloadCheckEvery, now, o.Logger)
		if err != nil {
			return nil, nil, err
		}
		cfg.GetCertificate = r.getCertificate
		if o.ClientCAFile != "" {
			// The bundle is reloaded with the pair: a CA rotation is the
			// same operation as a certificate rotation.
			cfg.GetConfigForClient = newCAReloader(o.ClientCAFile, cfg, reloadCheckEvery, now, o.Logger).configFor
		}
		return cfg, r.cert.Leaf, nil
	default:
		cert, err := LoadPair(o.CertDir)
		if err != nil {
			return nil, nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
		return cfg, cert.Leaf, nil
	}
}

// ErrClientCA is in every error about the client CA bundle (errors.Is), so
// that a caller can name the setting that gave the file.
var ErrClientCA = errors.New("client CA bundle")

// LoadCAs reads a PEM bundle of CA certificates; a file without one is an
// error.
func LoadCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrClientCA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w %s: no PEM certificate in it", ErrClientCA, path)
	}
	return pool, nil
}

// ExtraHosts is what a server bound to host adds to a self-signed
// certificate's names: the host itself, unless it is a wildcard address.
func ExtraHosts(host string) []string {
	if host == "" || host == "0.0.0.0" || host == "::" {
		return nil
	}
	return []string{host}
}

// LoadPair reads dir/tls.crt and dir/tls.key. Its errors say which file could
// not be read, or that the two do not form a key pair.
func LoadPair(dir string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CertFile))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS private key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TLS key pair %s, %s in %s: %w", CertFile, KeyFile, dir, err)
	}
	return cert, nil // X509KeyPair fills Leaf (Go 1.23+)
}

// SelfSigned makes an ECDSA P-256 certificate for hosts (DNS names or IP
// addresses), valid from an hour before now (clock skew) for
// SelfSignedValidity, signed by its own key.
func SelfSigned(hosts []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"kvselect"}, CommonName: "kvselect endpoint picker (self-signed)"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(SelfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// defaultHosts are the self-signed certificate's names: loopback, the host
// name (a pod's name in Kubernetes), then the caller's extra names, without
// duplicates.
func defaultHosts(extra []string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	for _, h := range extra {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// reloader serves the last good pair of dir, re-read when the files' stamps
// change.
type reloader struct {
	dir string
	now func() time.Time
	log *slog.Logger

	mu    sync.Mutex
	cert  *tls.Certificate // last good pair
	watch *filewatch.Watch
}

func newReloader(dir string, every time.Duration, now func() time.Time, log *slog.Logger) (*reloader, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r := &reloader{dir: dir, now: now, log: log,
		watch: filewatch.New(every, now(), filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))}
	cert, err := LoadPair(dir)
	if err != nil {
		return nil, err
	}
	r.cert = &cert
	return r, nil
}

// getCertificate is tls.Config.GetCertificate. It never fails: a pair that
// does not load is reported once per change of the files, and the previous
// one keeps being served.
func (r *reloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.watch.Changed(r.now()) {
		return r.cert, nil
	}
	cert, err := LoadPair(r.dir)
	if err != nil {
		// A writer that replaces the two files one at a time passes through
		// a mismatched pair; the second write changes the stamps again.
		r.log.Warn("TLS certificate reload failed; serving the previous certificate", "dir", r.dir, "err", err.Error(),
			"previous_not_after", r.cert.Leaf.NotAfter)
		return r.cert, nil
	}
	r.cert = &cert
	r.log.Info("TLS certificate reloaded", "dir", r.dir, "subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter)
	return r.cert, nil
}

// caReloader serves handshakes a configuration whose ClientCAs is the last
// good version of a CA bundle, re-read when the file's stamp changes (checked
// at most once per interval, at a handshake).
type caReloader struct {
	path string
	now  func() time.Time
	log  *slog.Logger

	mu    sync.Mutex
	base  *tls.Config // the server's configuration, ClientCAs the bundle read at start
	cur   *tls.Config // nil: base as it is
	watch *filewatch.Watch
}

func newCAReloader(path string, base *tls.Config, every time.Duration, now func() time.Time, log *slog.Logger) *caReloader {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &caReloader{path: path, now: now, log: log, base: base, watch: filewatch.New(every, now(), path)}
}

// configFor is tls.Config.GetConfigForClient: nil (the server's own
// configuration) until the bundle changes, then a copy with the new pool.
func (c *caReloader) configFor(*tls.ClientHelloInfo) (*tls.Config, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.watch.Changed(c.now()) {
		return c.cur, nil
	}
	pool, err := LoadCAs(c.path)
	if err != nil {
		c.log.Warn("client CA bundle reload failed; verifying against the previous one", "path", c.path, "err", err.Error())
		return c.cur, nil
	}
	next := c.base.Clone()
	next.ClientCAs = pool
	next.GetConfigForClient = nil
	c.cur = next
	c.log.Info("client CA bundle reloaded", "path", c.path)
	return c.cur, nil
}
