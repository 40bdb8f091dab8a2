// Package recovery is the indexer-recovery peer plane of Dynamo's standalone
// selection service ("Peer Planes" in
// https://docs.nvidia.com/dynamo/dev/components/router/standalone-selection-service;
// lib/kv-router/src/services/indexer/recovery.rs at commit 1a20d3f4): at
// startup, a replica fetches GET /dump from the first --indexer-peers URL that
// answers with a usable snapshot, replays it into its KV index, and only then
// reports ready. Peers are selectors (kvselect or Dynamo) or standalone
// indexers; the dump format is the same.
//
// Recovery runs while the server already serves (liveness and the catalog
// routes answer; GET /ready stays 503 until it is over), which Dynamo does not
// do — it serves nothing until recovery finished — but which keeps a slow peer
// from failing a Kubernetes liveness probe. Like Dynamo's, it waits for the
// events to be submitted to the index, not for live KV events to catch up, and
// a replica whose peers all fail starts empty with a warning.
//
// A peer's /dump reveals what every worker holds in its KV cache, so a peer
// whose REST API requires authentication answers it only to a bearer token
// with the read scope. Options.TokenFile names that token; it is read again
// for every request rather than once, because the usual source is a
// Kubernetes projected ServiceAccount token, which the kubelet rotates in
// place while the replica runs.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvselect/kvselect/selection"
	"github.com/kvselect/kvselect/selection/index"
)

// Defaults for Options (Dynamo's recovery.rs: 1 s settle delay, 10 s per peer).
const (
	DefaultDelay   = time.Second
	DefaultTimeout = 10 * time.Second
	// DefaultMaxBytes bounds a dump body. A 10M-block index dumps to roughly a
	// gigabyte of JSON.
	DefaultMaxBytes = 2 << 30
)

// Target is what recovery feeds; (*selection.Service).Replica() is one.
type Target interface {
	Restore(index.Dump) []index.RestoreResult
	SetIndexRecovery(selection.IndexRecovery)
}

// Options configures Run.
type Options struct {
	// Peers are HTTP(S) base URLs, tried in order; "/dump" is appended.
	Peers []string
	// Delay is waited before the first request, so peers started together
	// are listening (DefaultDelay; a negative value waits nothing).
	Delay time.Duration
	// Timeout bounds each peer's request, body included (DefaultTimeout).
	Timeout time.Duration
	// MaxBytes bounds a dump body (DefaultMaxBytes); a larger one is refused.
	MaxBytes int64
	// Client sends the requests; a client without a timeout of its own when nil.
	Client *http.Client
	Logger *slog.Logger
	// TokenFile, when set, holds a bearer token sent as "Authorization:
	// Bearer <token>" with every GET /dump (the peer's REST API needs the
	// read scope). The file is read before each request, surrounding
	// whitespace trimmed; an unreadable or empty file fails that peer's
	// attempt like any other fetch error.
	TokenFile string
}

// Attempt is one peer's failure.
type Attempt struct {
	Peer string
	Err  error
}

// Result says what Run did.
type Result struct {
	// Peer is the URL whose dump was replayed; empty when none was.
	Peer string
	// Partitions reports the replay per partition of the dump.
	Partitions []index.RestoreResult
	// Failed lists the peers tried before Peer, or all of them.
	Failed []Attempt
	// State is what Run recorded on the target.
	State selection.IndexRecovery
}

// ErrIncompatible marks a peer answer that is not a usable dump: a non-2xx
// status, a body that does not parse, or a partition that reports an error
// (an EPP peer's {"error": …} entry).
var ErrIncompatible = errors.New("incompatible dump")

// ErrUnauthorized marks a peer that answered GET /dump with 401 or 403: the
// token is missing, wrong, expired or lacks the read scope.
var ErrUnauthorized = errors.New("peer refused the credentials")

// maxTokenBytes bounds a token file (a projected ServiceAccount token is
// about 1 KB; the REST API refuses tokens over 8 KiB).
const maxTokenBytes = 8 << 10

// Run recovers t's index from the first peer with a usable dump. It marks
// recovery pending at once, and recovered or failed when done, so readiness
// follows. With no peers it does nothing. It returns early, with state failed,
// when ctx ends.
func Run(ctx context.Context, t Target, opts Options) Result {
	if len(opts.Peers) == 0 {
		return Result{State: selection.RecoveryNone}
	}
	t.SetIndexRecovery(selection.RecoveryPending)
	res := run(ctx, t, opts)
	t.SetIndexRecovery(res.State)
	return res
}

func run(ctx context.Context, t Target, opts Options) Result {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "index-recovery")
	delay := opts.Delay
	if delay == 0 {
		delay = DefaultDelay
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	client := opts.Client
	if client == nil {
		client = &http.Client{}
	}
	res := Result{State: selection.RecoveryFailed}
	if delay > 0 {
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return res
		case <-timer.C:
		}
	}
	for _, peer := range opts.Peers {
		start := time.Now()
		d, err := fetch(ctx, client, peer, opts)
		if err != nil {
			res.Failed = append(res.Failed, Attempt{Peer: peer, Err: err})
			if errors.Is(err, ErrUnauthorized) {
				log.Warn("index recovery peer refused the credentials: "+authHint(opts.TokenFile), "peer", peer, "err", err)
			} else {
				log.Warn("index recovery peer failed", "peer", peer, "err", err)
			}
			if ctx.Err() != nil {
				return res
			}
			continue
		}
		res.Peer, res.State = peer, selection.RecoveryRecovered
		res.Partitions = t.Restore(d)
		events, failed := 0, 0
		for _, p := range res.Partitions {
			events += p.Events
			failed += p.Failed
			if p.Err != nil {
				log.Warn("index recovery partition incomplete", "peer", peer, "model_name", p.Partition.Model,
					"routing_group", p.Partition.RoutingGroup, "events", p.Events, "failed", p.Failed, "err", p.Err)
			}
		}
		log.Info("index recovered from peer", "peer", peer, "partitions", len(res.Partitions), "events", events,
			"failed_events", failed, "took", time.Since(start).Round(time.Millisecond).String())
		return res
	}
	log.Warn("index recovery failed on every peer; starting with an empty index", "peers", len(opts.Peers))
	return res
}

// authHint says what to check when a peer refused the request.
func authHint(tokenFile string) string {
	if tokenFile == "" {
		return "the peer requires a bearer token; give recovery a token file holding a token with the read scope"
	}
	return "check that the token in " + tokenFile + " is current, is accepted by the peer and grants the read scope"
}

// fetch GETs <peer>/dump and decodes it.
func fetch(ctx context.Context, client *http.Client, peer string, opts Options) (index.Dump, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(peer, "/")+"/dump", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if opts.TokenFile != "" {
		token, err := readToken(opts.TokenFile)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	maxBytes := opts.MaxBytes
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read dump: %w", err)
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return nil, fmt.Errorf("%w: GET /dump answered %s: %s", ErrUnauthorized, resp.Status, snippet(body))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("%w: GET /dump answered %s: %s", ErrIncompatible, resp.Status, snippet(body))
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("%w: dump larger than %d bytes", ErrIncompatible, maxBytes)
	}
	d, err := index.DecodeDump(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrIncompatible, err)
	}
	return d, nil
}

// readToken reads the bearer token from path. The token goes into a header
// verbatim, so anything but one run of visible ASCII is refused.
func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	if len(b) > maxTokenBytes {
		return "", fmt.Errorf("token file %s: larger than %d bytes", path, maxTokenBytes)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c >= 0x7f {
			return "", fmt.Errorf("token file %s: the token has a space, control or non-ASCII byte at offset %d (one token, nothing else)", path, i)
		}
	}
	return token, nil
}

func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
