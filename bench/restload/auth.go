package restload

// What authentication and TLS cost on the REST hot path,
// measured side by side in one run: the same in-process service behind
// httpadmin with no authentication, with a bearer token checked against a
// token file, over TLS (keep-alive, so the handshake is paid once per
// connection), and both.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/internal/access"
	"github.com/kvselect/kvselect/internal/servingtls"
	"github.com/kvselect/kvselect/selection"
)

// AuthModes are the in-process server setups: no authentication, a bearer
// token checked against a token file, TLS, both.
var AuthModes = []string{"off", "token", "tls", "tls+token"}

// benchToken is the token of the -auth token modes. The token file also
// holds otherTokens others, so the lookup compares against a file
// of realistic size rather than a single line.
const (
	benchToken  = "kvbench-rest-token-0123456789abcdef"
	otherTokens = 15
)

// target is where the clients send requests and how.
type target struct {
	base  string
	token string      // bearer token; "" for none
	tls   *tls.Config // nil: plaintext
}

// authorize adds the bearer token, if any.
func (tg target) authorize(req *http.Request) {
	if tg.token != "" {
		req.Header.Set("Authorization", "Bearer "+tg.token)
	}
}

// startServer serves svc on loopback as mode says.
func startServer(svc *selection.Service, mode string) (target, func(), error) {
	var opts httpadmin.Options
	var tg target
	if mode == "token" || mode == "tls+token" {
		dir, err := os.MkdirTemp("", "kvbench-rest-auth-")
		if err != nil {
			return tg, nil, err
		}
		defer os.RemoveAll(dir) // read at once; nothing re-reads it during the run
		lines := fmt.Sprintf("%s select,admin name=kvbench\n", benchToken)
		for i := range otherTokens {
			lines += fmt.Sprintf("kvbench-other-token-%04d-0123456789 read name=other-%d\n", i, i)
		}
		path := filepath.Join(dir, "tokens")
		if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
			return tg, nil, err
		}
		tokens, err := access.OpenTokenFile(path, nil, nil)
		if err != nil {
			return tg, nil, err
		}
		opts.Auth = access.NewChain(tokens, nil, nil)
		tg.token = benchToken
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return tg, nil, err
	}
	scheme := "http"
	if mode == "tls" || mode == "tls+token" {
		cfg, leaf, err := servingtls.ServerConfig(servingtls.Options{NextProtos: []string{"h2", "http/1.1"}})
		if err != nil {
			ln.Close()
			return tg, nil, err
		}
		ln = tls.NewListener(ln, cfg)
		pool := x509.NewCertPool()
		pool.AddCert(leaf)
		// HTTP/1.1 like the plaintext modes: the clients are keep-alive
		// connections, one request at a time.
		tg.tls = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}}
		scheme = "https"
	}
	srv := &http.Server{Handler: httpadmin.New(svc, opts), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tg.base = scheme + "://" + ln.Addr().String()
	return tg, func() { _ = srv.Close() }, nil
}

// handshakeP50 is the median time of n full TLS handshakes to tg, each on a
// new connection: what a client pays once per connection, not per request.
func handshakeP50(ctx context.Context, tg target, n int) (int64, error) {
	addr := tg.base[len("https://"):]
	times := make([]time.Duration, 0, n)
	d := tls.Dialer{Config: tg.tls}
	for range n {
		t0 := time.Now()
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return 0, fmt.Errorf("TLS handshake: %w", err)
		}
		times = append(times, time.Since(t0))
		conn.Close()
	}
	slices.Sort(times)
	return int64(times[len(times)/2]), nil
}

// authTable compares the modes: each mode's mean over the rounds, and
// its throughput and CPU per request (which CPU stolen by other tenants of
// the machine does not inflate) against the first mode's, round by round (the rounds
// alternate the modes, so drift on a shared machine hits a round's modes
// alike): the median of the per-round ratios and their range.
func authTable(w io.Writer, modes []string, all []Result) error {
	rounds := len(all) / len(modes)
	fmt.Fprintf(w, "\nREST authentication and TLS cost, %d round(s) of %v alternating; means over rounds, ratios per round\n", rounds, modes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "auth\tpairs/s\tvs %s (median)\t(range)\tCPU µs/request\tvs %s (median)\tselect p50 µs\tselect p99 µs\tdelete p50 µs\tTLS handshake p50 µs\t\n", modes[0], modes[0])
	for i, m := range modes {
		var pairs, cpu, sp50, sp99, dp50, hs float64
		ratios, cpuRatios := make([]float64, 0, rounds), make([]float64, 0, rounds)
		for r := range rounds {
			res, first := all[r*len(modes)+i], all[r*len(modes)]
			pairs += res.PairsPerSec
			cpu += float64(res.CPUPerRequest) / 1e3
			cpuRatios = append(cpuRatios, 100*(float64(res.CPUPerRequest)/float64(first.CPUPerRequest)-1))
			sp50 += float64(res.Select.P50) / 1e3
			sp99 += float64(res.Select.P99) / 1e3
			dp50 += float64(res.Delete.P50) / 1e3
			hs += float64(res.TLSHandshakeP50) / 1e3
			ratios = append(ratios, 100*(res.PairsPerSec/first.PairsPerSec-1))
		}
		f := float64(rounds)
		slices.Sort(ratios)
		slices.Sort(cpuRatios)
		handshake := "-"
		if hs > 0 {
			handshake = fmt.Sprintf("%.0f", hs/f)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%+.1f%%\t%+.1f..%+.1f%%\t%.1f\t%+.1f%%\t%.1f\t%.1f\t%.1f\t%s\t\n", m, pairs/f, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1],
			cpu/f, cpuRatios[len(cpuRatios)/2], sp50/f, sp99/f, dp50/f, handshake)
	}
	return tw.Flush()
}
