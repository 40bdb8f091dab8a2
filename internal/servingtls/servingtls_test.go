package servingtls

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvselect/kvselect/internal/testpki"
)

// pemOf encodes cert as the contents of tls.crt and tls.key (PKCS #8).
func pemOf(t *testing.T, cert tls.Certificate) (crt, key []byte) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// writePair writes cert as dir/tls.crt and dir/tls.key and sets both files'
// modification time to mod, so that a rewrite within the file system's
// timestamp granularity still shows as a change.
func writePair(t *testing.T, dir string, cert tls.Certificate, mod time.Time) {
	t.Helper()
	crt, key := pemOf(t, cert)
	writeFile(t, filepath.Join(dir, CertFile), crt, mod)
	writeFile(t, filepath.Join(dir, KeyFile), key, mod)
}

func writeFile(t *testing.T, path string, data []byte, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

func newCert(t *testing.T, hosts ...string) tls.Certificate {
	t.Helper()
	c, err := SelfSigned(hosts, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// served runs one real TLS handshake on loopback against cfg and returns the
// server's certificate and the connection state the client saw. client is
// the client's configuration (ServerName, RootCAs, versions).
func served(t *testing.T, cfg, client *tls.Config) (*x509.Certificate, tls.ConnectionState, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.(*tls.Conn).Handshake()
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err != nil {
		return nil, tls.ConnectionState{}, err
	}
	defer c.Close()
	st := c.ConnectionState()
	return st.PeerCertificates[0], st, nil
}

func insecureClient() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}
}

// The generated certificate is ECDSA P-256, valid about a year, and verifies
// (pinned as its own root) for every loopback name and the host name, over a
// real handshake that negotiates h2 and at least TLS 1.2.
func TestSelfSignedVerifiesForLoopbackAndHostName(t *testing.T) {
	cfg, leaf, err := ServerConfig(Options{Hosts: []string{"picker.llm.svc", "10.1.2.3"}})
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", leaf.PublicKey)
	}
	if v := leaf.NotAfter.Sub(leaf.NotBefore); v < 364*24*time.Hour || v > 367*24*time.Hour {
		t.Errorf("valid for %v, want about a year", v)
	}
	if cfg.MinVersion != tls.VersionTLS12 || len(cfg.NextProtos) != 1 || cfg.NextProtos[0] != "h2" {
		t.Errorf("config MinVersion %x NextProtos %v", cfg.MinVersion, cfg.NextProtos)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	host, _ := os.Hostname()
	names := []string{"localhost", "127.0.0.1", "::1", "picker.llm.svc", "10.1.2.3"}
	if host != "" {
		names = append(names, host)
	}
	for _, name := range names {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("verify for %q: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: roots}); err == nil {
		t.Error("verified for a name it does not carry")
	}

	got, st, err := served(t, cfg, &tls.Config{ServerName: "localhost", RootCAs: roots, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("verified handshake: %v", err)
	}
	if !got.Equal(leaf) || st.NegotiatedProtocol != "h2" || st.Version < tls.VersionTLS12 {
		t.Errorf("served %v, ALPN %q, version %x", got.Subject, st.NegotiatedProtocol, st.Version)
	}
	if _, _, err := served(t, cfg, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Error("a TLS 1.1 client was accepted")
	}
}

// A pair in the directory is what is served, with or without reload.
func TestCertDirIsServed(t *testing.T) {
	dir := t.TempDir()
	want := newCert(t, "picker.test")
	writePair(t, dir, want, time.Now())
	for _, reload := range []bool{false, true} {
		cfg, leaf, err := ServerConfig(Options{CertDir: dir, Reload: reload})
		if err != nil {
			t.Fatalf("reload=%v: %v", reload, err)
		}
		if !leaf.Equal(want.Leaf) {
			t.Errorf("reload=%v: startup leaf %v", reload, leaf.DNSNames)
		}
		got, _, err := served(t, cfg, insecureClient())
		if err != nil || !got.Equal(want.Leaf) {
			t.Errorf("reload=%v: served %v, %v", reload, got, err)
		}
	}
}

// Missing, unreadable or mismatched files fail at startup, naming the problem.
func TestBadCertDirFailsClearly(t *testing.T) {
	a, b := newCert(t, "a"), newCert(t, "b")
	for _, tc := range []struct {
		name     string
		setup    func(t *testing.T, dir string)
		reload   bool
		noDir    bool
		want     string
		notExist bool
	}{
		{name: "empty directory", setup: func(*testing.T, string) {}, want: "TLS certificate: open", notExist: true},
		{name: "missing key", setup: func(t *testing.T, dir string) {
			writePair(t, dir, a, time.Now())
			os.Remove(filepath.Join(dir, KeyFile))
		}, want: "TLS private key: open", notExist: true},
		{name: "missing key with reload", reload: true, setup: func(t *testing.T, dir string) {
			writePair(t, dir, a, time.Now())
			os.Remove(filepath.Join(dir, KeyFile))
		}, want: "TLS private key: open", notExist: true},
		{name: "not PEM", setup: func(t *testing.T, dir string) {
			writePair(t, dir, a, time.Now())
			writeFile(t, filepath.Join(dir, CertFile), []byte("not a certificate"), time.Now())
		}, want: "TLS key pair tls.crt, tls.key in"},
		{name: "key of another certificate", setup: func(t *testing.T, dir string) {
			writePair(t, dir, a, time.Now())
			_, key := pemOf(t, b)
			writeFile(t, filepath.Join(dir, KeyFile), key, time.Now())
		}, want: "private key does not match public key"},
		{name: "directory is a file", setup: func(t *testing.T, dir string) {}, noDir: true, want: "not a directory"},
		{name: "reload without a directory", reload: true, want: "certificate reload needs a certificate directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dir string
			if tc.setup != nil {
				dir = t.TempDir()
				tc.setup(t, dir)
			}
			if tc.noDir {
				f := filepath.Join(dir, "file")
				writeFile(t, f, nil, time.Now())
				dir = f
			}
			_, _, err := ServerConfig(Options{CertDir: dir, Reload: tc.reload})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to mention %q", err, tc.want)
			}
			if tc.notExist != errors.Is(err, fs.ErrNotExist) {
				t.Errorf("errors.Is(%v, fs.ErrNotExist) = %v", err, !tc.notExist)
			}
		})
	}
}

// fakeClock is the reloader's time source.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// Reload serves each new pair after its files change, keeps the last good
// pair (with one warning per change) while the files are broken, missing or
// half-written, and checks the files at most once per interval.
func TestReloadFollowsTheFilesAndKeepsTheLastGoodPair(t *testing.T) {
	dir := t.TempDir()
	a, b, c := newCert(t, "a"), newCert(t, "b"), newCert(t, "c")
	base := time.Now().Add(-time.Hour)
	writePair(t, dir, a, base)
	clock := &fakeClock{t: time.Now()}
	var logs bytes.Buffer
	r, err := newReloader(dir, time.Minute, clock.now, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.getCertificate}

	steps := []struct {
		name     string
		change   func(mod time.Time)
		advance  time.Duration // clock step before the handshake
		want     tls.Certificate
		warnings int // total so far
	}{
		{"unchanged", func(time.Time) {}, time.Minute, a, 0},
		{"new pair, within the interval", func(mod time.Time) { writePair(t, dir, b, mod) }, time.Second, a, 0},
		{"new pair, interval over", func(time.Time) {}, time.Minute, b, 0},
		{"certificate garbled", func(mod time.Time) { writeFile(t, filepath.Join(dir, CertFile), []byte("garbage"), mod) }, time.Minute, b, 1},
		{"still garbled: no second warning", func(time.Time) {}, time.Minute, b, 1},
		{"certificate of c, key still b's", func(mod time.Time) {
			crt, _ := pemOf(t, c)
			writeFile(t, filepath.Join(dir, CertFile), crt, mod)
		}, time.Minute, b, 2},
		{"then c's key", func(mod time.Time) {
			_, key := pemOf(t, c)
			writeFile(t, filepath.Join(dir, KeyFile), key, mod)
		}, time.Minute, c, 2},
		{"files removed", func(time.Time) {
			os.Remove(filepath.Join(dir, CertFile))
			os.Remove(filepath.Join(dir, KeyFile))
		}, time.Minute, c, 3},
		{"pair a back", func(mod time.Time) { writePair(t, dir, a, mod) }, time.Minute, a, 3},
	}
	for i, s := range steps {
		s.change(base.Add(time.Duration(i+1) * time.Second))
		clock.t = clock.t.Add(s.advance)
		got, _, err := served(t, cfg, insecureClient())
		if err != nil {
			t.Fatalf("%s: handshake: %v", s.name, err)
		}
		if !got.Equal(s.want.Leaf) {
			t.Errorf("%s: served %v, want %v", s.name, got.DNSNames, s.want.Leaf.DNSNames)
		}
		if n := strings.Count(logs.String(), "level=WARN"); n != s.warnings {
			t.Errorf("%s: %d warnings, want %d:\n%s", s.name, n, s.warnings, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "TLS certificate reload failed; serving the previous certificate") ||
		!strings.Contains(logs.String(), "TLS certificate reloaded") {
		t.Errorf("logs:\n%s", logs.String())
	}
}

// serverHandshake runs one handshake against cfg presenting cert (nil: none)
// and returns the server side's verdict: with TLS 1.3 the client finishes
// before the server has checked its certificate.
func serverHandshake(t *testing.T, cfg *tls.Config, cert *tls.Certificate) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	verdict := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			verdict <- err
			return
		}
		defer c.Close()
		verdict <- c.(*tls.Conn).Handshake()
	}()
	client := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}
	if cert != nil {
		client.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err == nil {
		_ = c.Handshake()
		defer c.Close()
	}
	return <-verdict
}

// With Reload the client CA bundle follows its file like the pair: a
// certificate of the new CA is accepted once the change is seen, the old
// CA's refused; a broken bundle keeps the previous one.
func TestClientCAReload(t *testing.T) {
	dir := t.TempDir()
	writePair(t, dir, newCert(t, "localhost"), time.Now().Add(-time.Hour))
	oldCA, newCA := testpki.NewCA(t, "old"), testpki.NewCA(t, "new")
	bundle := filepath.Join(dir, "ca.pem")
	oldCA.WritePEM(t, bundle)
	if err := os.Chtimes(bundle, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	clock := &fakeClock{t: time.Now()}
	cfg, _, err := ServerConfig(Options{CertDir: dir, Reload: true, ClientCAFile: bundle, RequireClientCert: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), now: clock.now})
	if err != nil {
		t.Fatal(err)
	}

	oldCert := oldCA.Issue(t, testpki.Leaf{CommonName: "old", Client: true})
	newCert := newCA.Issue(t, testpki.Leaf{CommonName: "new", Client: true})
	if err := serverHandshake(t, cfg, &oldCert); err != nil {
		t.Fatalf("old CA's certificate before the change: %v", err)
	}
	if err := serverHandshake(t, cfg, &newCert); err == nil {
		t.Fatal("new CA's certificate accepted before the change")
	}
	newCA.WritePEM(t, bundle)
	clock.t = clock.t.Add(2 * reloadCheckEvery)
	if err := serverHandshake(t, cfg, &newCert); err != nil {
		t.Fatalf("new CA's certificate after the change: %v", err)
	}
	if err := serverHandshake(t, cfg, &oldCert); err == nil {
		t.Fatal("old CA's certificate accepted after the change")
	}
	writeFile(t, bundle, []byte("not PEM"), time.Now().Add(time.Hour))
	clock.t = clock.t.Add(2 * reloadCheckEvery)
	if err := serverHandshake(t, cfg, &newCert); err != nil {
		t.Fatalf("a broken bundle replaced the good one: %v", err)
	}
	if !strings.Contains(logs.String(), "client CA bundle reloaded") || !strings.Contains(logs.String(), "client CA bundle reload failed") {
		t.Errorf("logs:\n%s", logs.String())
	}
}
