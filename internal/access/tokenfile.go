package access

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/internal/filewatch"
)

// MinTokenBytes is the shortest token the file accepts: 128 bits of a
// random hex or base64 string (openssl rand -hex 16 gives 32 characters).
const MinTokenBytes = 16

// maxTokenFileBytes bounds the file read at each change.
const maxTokenFileBytes = 4 << 20

// tokenFileCheckEvery bounds how often the file is stat'ed: at most once per
// interval, by the request that finds the interval over. No goroutine
// watches it.
const tokenFileCheckEvery = time.Second

// tokenEntry is one line of the file, without the token itself.
type tokenEntry struct {
	digest  [sha256.Size]byte
	scopes  Scopes
	name    string    // name=, or "sha256:" and the digest's first 4 bytes
	expires time.Time // zero: never
}

// ParseTokens reads a token file:
//
//	# comment
//	<token> <scope>[,<scope>...] [name=<name>] [expires=<RFC 3339 time>]
//
// Tokens use RFC 6750's token characters and are at least MinTokenBytes
// long; the same token twice is an error. Errors name the line.
func ParseTokens(data []byte) ([]tokenEntry, error) {
	var out []tokenEntry
	seen := make(map[[sha256.Size]byte]int)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxTokenBytes+4096)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		e, err := parseTokenLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if prev, dup := seen[e.digest]; dup {
			return nil, fmt.Errorf("line %d: the same token as line %d", n, prev)
		}
		seen[e.digest] = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, errors.New("a line longer than 12 KiB")
		}
		return nil, err
	}
	return out, nil
}

func parseTokenLine(line string) (tokenEntry, error) {
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return tokenEntry{}, errors.New(`want "<token> <scope>[,<scope>...]"`)
	}
	token := fields[0]
	if err := checkTokenSyntax(token); err != nil {
		return tokenEntry{}, errors.New(strings.Replace(err.Error(), "bearer token", "token", 1))
	}
	if len(token) < MinTokenBytes {
		return tokenEntry{}, fmt.Errorf("token shorter than %d characters (make one with: openssl rand -hex 32)", MinTokenBytes)
	}
	scopes, err := ParseScopes(fields[1])
	if err != nil {
		return tokenEntry{}, err
	}
	e := tokenEntry{digest: sha256.Sum256([]byte(token)), scopes: scopes}
	for _, f := range fields[2:] {
		key, val, ok := strings.Cut(f, "=")
		switch {
		case !ok || val == "":
			return tokenEntry{}, fmt.Errorf("%q: want name=<name> or expires=<RFC 3339 time>", f)
		case key == "name" && e.name == "":
			e.name = val
		case key == "expires" && e.expires.IsZero():
			t, err := time.Parse(time.RFC3339, val)
			if err != nil {
				return tokenEntry{}, fmt.Errorf("expires: %w", err)
			}
			e.expires = t
		default:
			return tokenEntry{}, fmt.Errorf("%q: unknown or repeated option (want name= or expires=)", f)
		}
	}
	if e.name == "" {
		e.name = "sha256:" + hex.EncodeToString(e.digest[:4])
	}
	return e, nil
}

// TokenFile is a token file in force: the last good version read, re-read
// when its size or modification time changes (a Kubernetes Secret volume
// swaps a symlink, which changes both). A version that fails to read or parse
// is logged and counted, and the previous one stays in force.
type TokenFile struct {
	path string
	now  func() time.Time
	log  *slog.Logger

	entries atomic.Pointer[[]tokenEntry]

	mu    sync.Mutex // held by the request that checks the file
	watch *filewatch.Watch

	reloads, reloadErrors prometheus.Counter
}

// OpenTokenFile reads path; an unreadable or invalid file is an error (the
// server does not start). now may be nil (time.Now).
func OpenTokenFile(path string, log *slog.Logger, now func() time.Time) (*TokenFile, error) {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &TokenFile{path: path, now: now, log: log,
		reloads: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvselect_auth_token_file_reloads_total",
			Help: "Times the --auth-token-file was re-read after it changed and the new version put in force."}),
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvselect_auth_token_file_reload_errors_total",
			Help: "Changed versions of the --auth-token-file that could not be read or parsed; the previous version stayed in force."}),
	}
	f.watch = filewatch.New(tokenFileCheckEvery, now(), path)
	entries, err := f.read()
	if err != nil {
		return nil, err
	}
	f.entries.Store(&entries)
	return f, nil
}

// Len is the number of tokens in force.
func (f *TokenFile) Len() int { return len(*f.entries.Load()) }

func (f *TokenFile) read() ([]tokenEntry, error) {
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxTokenFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if len(data) > maxTokenFileBytes {
		return nil, fmt.Errorf("token file %s: larger than %d bytes", f.path, maxTokenFileBytes)
	}
	entries, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", f.path, err)
	}
	return entries, nil
}

// refresh re-reads the file if it changed and the check interval is over.
// Only one request checks; the others go on with the version in force. A
// version that fails is counted and logged once: the watch reports each
// version once.
func (f *TokenFile) refresh() {
	if !f.mu.TryLock() {
		return
	}
	defer f.mu.Unlock()
	if !f.watch.Changed(f.now()) {
		return
	}
	entries, err := f.read()
	if err != nil {
		f.reloadErrors.Inc()
		f.log.Error("auth token file: the new version is not used; the previous one stays in force", "err", err)
		return
	}
	f.entries.Store(&entries)
	f.reloads.Inc()
	f.log.Info("auth token file reloaded", "path", f.path, "tokens", len(entries))
}

// Lookup finds token. found is false when the file does not hold it; when it
// does, invalid is non-empty if the token cannot be used (expired). Every
// entry is compared, in constant time, so the time taken says nothing about
// which digest bytes matched.
func (f *TokenFile) Lookup(token string) (id Identity, scopes Scopes, found bool, invalid string) {
	f.refresh()
	digest := sha256.Sum256([]byte(token))
	match := -1
	entries := *f.entries.Load()
	for i := range entries {
		if subtle.ConstantTimeCompare(digest[:], entries[i].digest[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return Identity{}, 0, false, ""
	}
	e := &entries[match]
	id = Identity{Method: "token", Subject: e.name}
	if !e.expires.IsZero() && !f.now().Before(e.expires) {
		return id, 0, true, "token " + e.name + " expired at " + e.expires.UTC().Format(time.RFC3339)
	}
	return id, e.scopes, true, ""
}

// Describe implements prometheus.Collector.
func (f *TokenFile) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.reloads.Desc()
	ch <- f.reloadErrors.Desc()
}

// Collect implements prometheus.Collector.
func (f *TokenFile) Collect(ch chan<- prometheus.Metric) {
	ch <- f.reloads
	ch <- f.reloadErrors
}
