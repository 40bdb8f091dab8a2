// Package ngf runs NGINX Gateway Fabric's endpoint-picker path on loopback:
// NGF's Go shim (on the fixed 127.0.0.1:54800 epp.js asks) and Debian's NGINX
// with the njs module running NGF's epp.js, configured from the shim folder's
// nginx.example.conf with this run's ports. The demo sends traffic through
// it; conformance/gateways checks what its clients see. Both take the folder
// from KVSELECT_NGF_SHIM_DIR (the demo's -ngf-shim-dir defaults to it).
package ngf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvselect/kvselect/bench/fleet"
	"github.com/kvselect/kvselect/internal/peerproc"
)

const (
	// EnvShimDir names the folder holding NGF's ngf-epp-shim binary, epp.js
	// and nginx.example.conf.
	EnvShimDir = "KVSELECT_NGF_SHIM_DIR"
	// EnvRequire turns a gateway that cannot run here into a failure.
	EnvRequire = "KVSELECT_REQUIRE_GATEWAYS"
	// ShimAddr is where epp.js looks for the shim (SHIM_URI): fixed in NGF's
	// source, so two runs on one machine cannot overlap.
	ShimAddr = "127.0.0.1:54800"
	// NJSModule is Debian's njs module, which nginx.example.conf loads.
	NJSModule = "/usr/lib/nginx/modules/ngx_http_js_module.so"

	nginxHowTo = "apt-get install nginx-light libnginx-mod-http-js"
	shimHowTo  = "set " + EnvShimDir + " (or -ngf-shim-dir) to a folder holding NGF's ngf-epp-shim binary, epp.js and nginx.example.conf"
	startLimit = 30 * time.Second
)

// ErrUnavailable is what Check wraps when the gateway cannot run here.
var ErrUnavailable = errors.New("NGINX Gateway Fabric's path cannot run here")

// Required reports whether the environment asks for the gateway to be
// required rather than skipped.
func Required() bool {
	return os.Getenv(EnvRequire) != "" || os.Getenv(peerproc.EnvRequireAll) != ""
}

// Check says why NGF's path cannot run from shimDir on this machine (an
// error wrapping ErrUnavailable, with how to fix it), or nil.
func Check(shimDir string) error {
	if shimDir == "" {
		return fmt.Errorf("%w: no shim folder; %s", ErrUnavailable, shimHowTo)
	}
	for _, f := range []string{"ngf-epp-shim", "epp.js", "nginx.example.conf"} {
		if _, err := os.Stat(filepath.Join(shimDir, f)); err != nil {
			return fmt.Errorf("%w: %v; %s", ErrUnavailable, err, shimHowTo)
		}
	}
	if _, err := exec.LookPath("nginx"); err != nil {
		return fmt.Errorf("%w: nginx is not on PATH; %s", ErrUnavailable, nginxHowTo)
	}
	if _, err := os.Stat(NJSModule); err != nil {
		return fmt.Errorf("%w: the njs module is missing (%v); %s", ErrUnavailable, err, nginxHowTo)
	}
	return nil
}

// Conf is NGF's example configuration with run as NGINX's folder, port as
// its listener and epPort as the picker's port, in the foreground as the
// caller's child: daemon off and no master process, so that stopping the
// process stops NGINX.
func Conf(shimDir, run string, port int, epPort string) ([]byte, error) {
	raw, err := os.ReadFile(filepath.Join(shimDir, "nginx.example.conf"))
	if err != nil {
		return nil, fmt.Errorf("read the example configuration: %w", err)
	}
	conf := string(raw)
	for _, r := range []struct{ old, new string }{
		{"/PATH/TO/run", run},
		{"/PATH/TO/ngf-epp-shim", shimDir},
		{"listen 127.0.0.1:8080;", "listen 127.0.0.1:" + strconv.Itoa(port) + ";"},
		{"set $epp_port 9002;", "set $epp_port " + epPort + ";"},
		{"load_module " + NJSModule + ";", "load_module " + NJSModule + ";\ndaemon off;\nmaster_process off;"},
	} {
		if !strings.Contains(conf, r.old) {
			return nil, fmt.Errorf("nginx.example.conf no longer has %q: the rewrite needs updating", r.old)
		}
		conf = strings.ReplaceAll(conf, r.old, r.new)
	}
	return []byte(conf), nil
}

// ShimTaken fails when something already listens on ShimAddr: another run
// of the demo or of conformance/gateways, whose shim this one's requests
// would reach.
func ShimTaken() error {
	if c, err := net.DialTimeout("tcp", ShimAddr, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%s is taken: another NGF shim is running (the demo or conformance/gateways); NGF fixes the shim's port, so only one can run at a time", ShimAddr)
	}
	return nil
}

// Config is a gateway to start.
type Config struct {
	ShimDir string
	// Dir holds the logs ([Prefix-]ngf-epp-shim.log, [Prefix-]nginx.log)
	// and NGINX's folder ([Prefix-]nginx-run: nginx.conf, error.log).
	Dir, Prefix string
	// ExtProc is the picker's host:port; the example configuration's
	// $epp_host is 127.0.0.1.
	ExtProc string
	// TLS has the shim reach the picker over TLS without verifying its
	// certificate (the shim's default); plaintext otherwise.
	TLS bool
}

// Gateway is a running shim and NGINX.
type Gateway struct {
	URL    string // http://127.0.0.1:port, NGINX's listener
	RunDir string // NGINX's folder: nginx.conf, error.log
	shim   *fleet.Process
	nginx  *fleet.Process
}

// Start checks the machine, starts the shim and NGINX, and waits until
// both listen.
func Start(ctx context.Context, c Config) (_ *Gateway, err error) {
	if err := Check(c.ShimDir); err != nil {
		return nil, err
	}
	if err := ShimTaken(); err != nil {
		return nil, err
	}
	_, epPort, err := net.SplitHostPort(c.ExtProc)
	if err != nil {
		return nil, fmt.Errorf("picker address %q: %w", c.ExtProc, err)
	}
	name := func(n string) string {
		if c.Prefix == "" {
			return n
		}
		return c.Prefix + "-" + n
	}
	// NGINX resolves relative paths against its prefix (-p), so every path
	// it is given is absolute: a relative -out would otherwise be doubled.
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return nil, fmt.Errorf("ngf: the run folder: %w", err)
	}
	g := &Gateway{RunDir: filepath.Join(dir, name("nginx-run"))}
	defer func() {
		if err != nil {
			g.Stop()
		}
	}()
	if err := os.MkdirAll(g.RunDir, 0o755); err != nil {
		return nil, err
	}
	var shimArgs []string
	if !c.TLS {
		shimArgs = append(shimArgs, "--endpoint-picker-disable-tls")
	}
	g.shim = fleet.NewProcess(name("ngf-epp-shim"), filepath.Join(c.ShimDir, "ngf-epp-shim"), c.Dir, shimArgs...)
	if err := g.shim.Start(); err != nil {
		return nil, err
	}
	if err := waitListening(ctx, g.shim, ShimAddr); err != nil {
		return nil, err
	}
	port, err := peerproc.FreePort()
	if err != nil {
		return nil, err
	}
	conf, err := Conf(c.ShimDir, g.RunDir, port, epPort)
	if err != nil {
		return nil, err
	}
	confPath := filepath.Join(g.RunDir, "nginx.conf")
	if err := os.WriteFile(confPath, conf, 0o644); err != nil {
		return nil, err
	}
	// -e: NGINX opens its error log before reading the configuration, and
	// Debian's default (/var/log/nginx) is not writable by a normal user.
	g.nginx = fleet.NewProcess(name("nginx"), "nginx", c.Dir, "-p", g.RunDir, "-e", filepath.Join(g.RunDir, "error.log"), "-c", confPath)
	if err := g.nginx.Start(); err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := waitListening(ctx, g.nginx, addr); err != nil {
		return nil, err
	}
	g.URL = "http://" + addr
	return g, nil
}

// ErrorLog is NGINX's error log so far.
func (g *Gateway) ErrorLog() (string, error) {
	raw, err := os.ReadFile(filepath.Join(g.RunDir, "error.log"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return string(raw), err
}

// Stop ends NGINX, then the shim.
func (g *Gateway) Stop() {
	for _, p := range []*fleet.Process{g.nginx, g.shim} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// waitListening waits until addr accepts connections, failing early when p
// exits.
func waitListening(ctx context.Context, p *fleet.Process, addr string) error {
	deadline := time.Now().Add(startLimit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("%s exited before listening on %s (log %s):\n%s", p.Name, addr, p.Log, p.LogTail(2000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %v (log %s)", p.Name, addr, startLimit, p.Log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
