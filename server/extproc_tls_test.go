package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvselect/kvselect/envoysim"
	"github.com/kvselect/kvselect/internal/proctest"
	"github.com/kvselect/kvselect/internal/servingtls"
	"github.com/kvselect/kvselect/internal/testpki"
)

// startPicker runs kvselect on loopback with args and one registered worker
// (1, model "m", 10.0.0.1:8000), and returns the REST and ext_proc addresses
// and the logs. The server stops (and must
// stop cleanly) when the test ends.
func startPicker(t *testing.T, args ...string) (rest, addr string, logs *logBuffer) {
	t.Helper()
	srv := runInBackground(t, withoutKVEvents, args)
	rest, addr, logs = srv.addrs.REST.String(), srv.addrs.ExtProc.String(), srv.logs
	res, err := http.Post("http://"+rest+"/workers", "application/json",
		strings.NewReader(`{"worker_id":1,"model_name":"m","endpoint":"http://10.0.0.1:8000","block_size":4}`))
	if err != nil || res.StatusCode/100 != 2 {
		t.Fatalf("register: %v %v", res, err)
	}
	res.Body.Close()
	return rest, addr, logs
}

// dialPicker connects as Envoy does (envoysim.DialOptions) with creds.
func dialPicker(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(envoysim.DialOptions(), grpc.WithTransportCredentials(creds))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func healthCheck(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	if err == nil && r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health status %v", r.GetStatus())
	}
	return err
}

// exchange runs one GIE request through the picker and checks the decision.
func exchange(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	x, d, err := envoysim.New(conn).Start(t.Context(), &envoysim.Request{Modes: envoysim.GIE, Body: []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`)})
	if err != nil {
		t.Fatal(err)
	}
	if d.Immediate != nil || d.Endpoint != "10.0.0.1:8000" {
		t.Fatalf("decision %+v", d)
	}
	x.Close()
}

// writeCertDir writes a key pair for loopback names into a new directory and
// returns the directory and a pool that trusts the certificate.
func writeCertDir(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	cert, err := servingtls.SelfSigned([]string{"localhost", "127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	// Write beside, then rename: a reader never sees half a file (as a
	// Kubernetes Secret volume's symlink swap).
	for name, data := range map[string][]byte{
		servingtls.CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		servingtls.KeyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
	} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	return pool
}

// With --extproc-secure-serving and no certificate, the picker serves gRPC
// health and ext_proc over TLS with a self-signed certificate (clients that
// cannot pin it skip verification, as GIE gateways do), says so at startup,
// and a plaintext client gets nothing.
func TestExtProcServesTLSWithASelfSignedCertificate(t *testing.T) {
	_, addr, logs := startPicker(t, "--extproc-secure-serving")
	conn := dialPicker(t, addr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
	if err := healthCheck(t.Context(), conn); err != nil {
		t.Fatalf("health over TLS: %v", err)
	}
	exchange(t, conn)

	// The certificate names the loopback address the picker listens on.
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	st := c.ConnectionState()
	c.Close()
	leaf := st.PeerCertificates[0]
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: roots}); err != nil || st.NegotiatedProtocol != "h2" || st.Version < tls.VersionTLS12 {
		t.Errorf("self-signed certificate for 127.0.0.1: %v; ALPN %q, version %x", err, st.NegotiatedProtocol, st.Version)
	}

	if err := healthCheck(t.Context(), dialPicker(t, addr, insecure.NewCredentials())); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext client against the TLS picker: %v, want Unavailable", err)
	}

	var sawTLS, sawListening bool
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var rec struct {
			Msg, Cert string
			TLS       bool
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		sawTLS = sawTLS || rec.Msg == "ext_proc TLS on" && strings.Contains(rec.Cert, "self-signed")
		sawListening = sawListening || rec.Msg == "ext_proc listening" && rec.TLS
	}
	if !sawTLS || !sawListening {
		t.Errorf("startup logs do not say TLS is on with a self-signed certificate:\n%s", logs.String())
	}
}

// With --extproc-cert-path the picker serves the mounted pair, which a client
// verifies against it; with --extproc-cert-reload a new pair written over
// it is served to new connections.
func TestExtProcServesTheMountedCertificateAndReloadsIt(t *testing.T) {
	dir := t.TempDir()
	first := writeCertDir(t, dir)
	_, addr, _ := startPicker(t, "--extproc-secure-serving", "--extproc-cert-path", dir, "--extproc-cert-reload")
	conn := dialPicker(t, addr, credentials.NewTLS(&tls.Config{RootCAs: first}))
	if err := healthCheck(t.Context(), conn); err != nil {
		t.Fatalf("health, verifying the mounted certificate: %v", err)
	}
	exchange(t, conn)

	second := writeCertDir(t, dir)
	// The files are checked at most once a second, at a new handshake.
	proctest.Eventually(t, "the new certificate on a new connection", 10*time.Second, func() bool {
		c, err := grpc.NewClient(addr, append(envoysim.DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: second})))...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return healthCheck(t.Context(), c) == nil
	})
	// The connection made before the reload keeps working.
	exchange(t, conn)
}

// A certificate directory without the pair stops the start with status 2 and
// a message naming the file.
func TestExtProcMissingCertificateIsAUsageError(t *testing.T) {
	dir := t.TempDir()
	status, _, stderr := runArgs(t, "--host", "127.0.0.1", "--port", "0", "--extproc-secure-serving", "--extproc-cert-path", dir)
	if status != 2 || !strings.Contains(stderr, filepath.Join(dir, "tls.crt")) || !strings.Contains(stderr, "no such file or directory") {
		t.Errorf("status %d, stderr %q", status, stderr)
	}
}

// With --extproc-client-ca the picker requires a client certificate its CA
// signed (mTLS): the gateway's certificate gets through, a client without
// one or with another CA's gets no stream.
func TestExtProcRequiresClientCertificates(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, rogueCA := testpki.NewCA(t, "server CA"), testpki.NewCA(t, "gateway CA"), testpki.NewCA(t, "rogue CA")
	testpki.WriteCertDir(t, dir, serverCA.ServerCert(t))
	caFile := filepath.Join(t.TempDir(), "gateway-ca.pem")
	clientCA.WritePEM(t, caFile)
	_, addr, logs := startPicker(t, "--extproc-secure-serving", "--extproc-cert-path", dir, "--extproc-client-ca", caFile)
	if !strings.Contains(logs.String(), "required, verified against --extproc-client-ca") {
		t.Errorf("the startup log does not say client certificates are required:\n%s", logs)
	}
	creds := func(cert *tls.Certificate) credentials.TransportCredentials {
		cfg := &tls.Config{RootCAs: serverCA.Pool()}
		if cert != nil {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		return credentials.NewTLS(cfg)
	}
	gateway := clientCA.Issue(t, testpki.Leaf{CommonName: "envoy", Client: true})
	conn := dialPicker(t, addr, creds(&gateway))
	if err := healthCheck(t.Context(), conn); err != nil {
		t.Fatalf("the gateway's certificate: %v", err)
	}
	exchange(t, conn)

	rogue := rogueCA.Issue(t, testpki.Leaf{CommonName: "envoy", Client: true})
	for name, c := range map[string]credentials.TransportCredentials{"no certificate": creds(nil), "another CA's certificate": creds(&rogue)} {
		if err := healthCheck(t.Context(), dialPicker(t, addr, c)); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: health check %v, want Unavailable (no TLS session)", name, err)
		}
	}
}
