// Package workersfile is the discovery source for setups without Kubernetes:
// a YAML or JSON file (--workers-file) that lists worker records in the POST
// /workers shape. The file is read at start and again whenever its content
// changes; every good version becomes a discovery.Snapshot, and a version that
// does not parse (or a file that vanished) keeps the last good catalog while
// the readiness condition and the log say why.
package workersfile

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvselect/kvselect/discovery"
	"github.com/kvselect/kvselect/selection/catalog"
)

// DefaultPollInterval is how often the file is read to notice changes.
// Polling the content, not watching inodes, follows every way a file gets
// replaced: editors that write a new file and rename it, Kubernetes ConfigMap
// volumes that swap a symlink, network filesystems without inotify. Reading a
// small file every two seconds costs nothing measurable.
const DefaultPollInterval = 2 * time.Second

// MaxFileBytes bounds the file; a catalog of 100,000 workers fits in far less.
const MaxFileBytes = 16 << 20

// Condition reasons.
const (
	ReasonLoaded       = "WorkersFileLoaded"
	ReasonInvalid      = "WorkersFileInvalid"      // no good version yet: not ready
	ReasonUnreadable   = "WorkersFileUnreadable"   // no good version yet: not ready
	ReasonLastGoodKept = "WorkersFileLastGoodKept" // a later version is bad: still ready
)

// file is the document: either {"workers": [...]} or a bare list.
type file struct {
	Workers []json.RawMessage `json:"workers"`
}

// entry is one worker: a catalog.Record whose worker_id must be present
// (encoding/json cannot tell a missing id from 0 otherwise).
type entry struct {
	catalog.Record
	WorkerID *uint64 `json:"worker_id"`
}

// Parse decodes a workers file. YAML and JSON are both accepted (JSON is
// YAML). Unknown fields, duplicate keys, a missing or duplicate worker_id and
// enum values the REST API rejects are errors that name the entry.
func Parse(data []byte) ([]catalog.Record, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		// An empty file is far more often a file caught half-written than a
		// request to remove every worker; `workers: []` says the latter.
		return nil, errors.New("file is empty (write `workers: []` to list no workers)")
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML or JSON: %w", err)
	}
	var raw []json.RawMessage
	switch t := bytes.TrimSpace(js); {
	case bytes.HasPrefix(t, []byte("[")):
		if err := json.Unmarshal(t, &raw); err != nil {
			return nil, fmt.Errorf("top level: %w", err)
		}
	case bytes.HasPrefix(t, []byte("{")):
		var f file
		if err := strictDecode(t, &f); err != nil {
			return nil, fmt.Errorf("top level: %w", err)
		}
		if f.Workers == nil {
			return nil, errors.New("top level: missing `workers` list")
		}
		raw = f.Workers
	default:
		return nil, errors.New("top level: want a `workers:` list or a list of worker records")
	}
	out := make([]catalog.Record, 0, len(raw))
	seen := make(map[uint64]int, len(raw))
	for i, r := range raw {
		var e entry
		if err := strictDecode(r, &e); err != nil {
			return nil, fmt.Errorf("workers[%d]: %w", i, err)
		}
		if e.WorkerID == nil {
			return nil, fmt.Errorf("workers[%d]: missing field `worker_id`", i)
		}
		if j, dup := seen[*e.WorkerID]; dup {
			return nil, fmt.Errorf("workers[%d]: worker_id %d already used by workers[%d]", i, *e.WorkerID, j)
		}
		seen[*e.WorkerID] = i
		rec := e.Record
		rec.WorkerID = *e.WorkerID
		// Output-only fields a pasted GET /workers record may carry.
		rec.Lifecycle, rec.NotSchedulableReasons, rec.KVEventsStatus = "", nil, nil
		if err := rec.Normalize(); err != nil {
			return nil, fmt.Errorf("workers[%d] (worker_id %d): %w", i, rec.WorkerID, err)
		}
		out = append(out, rec)
	}
	return out, nil
}

func strictDecode(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data")
	}
	return nil
}

// Options configures a Source.
type Options struct {
	// Path is the workers file.
	Path string
	// PollInterval is how often the file is read; 0 means DefaultPollInterval.
	PollInterval time.Duration
	// Logger receives load results and problems; slog.Default() when nil.
	Logger *slog.Logger
}

// Source watches one workers file.
type Source struct {
	path string
	poll time.Duration
	log  *slog.Logger

	seen     []byte // content of the last version looked at
	seenErr  string // the read error last reported, if the file was unreadable
	good     []catalog.Record
	haveGood bool
}

// New returns a source for opts.Path. The file itself is first read by Run,
// so a file that appears later is picked up.
func New(opts Options) (*Source, error) {
	if strings.TrimSpace(opts.Path) == "" {
		return nil, errors.New("workers file: empty path")
	}
	return &Source{
		path: opts.Path,
		poll: cmp.Or(opts.PollInterval, DefaultPollInterval),
		log:  cmp.Or(opts.Logger, slog.Default()).With("workers_file", opts.Path),
	}, nil
}

// Run reads the file now and on every change until ctx ends, handing each
// resulting snapshot to sink (a discovery.Reconciler's Update).
func (s *Source) Run(ctx context.Context, sink func(discovery.Snapshot)) {
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		if snap, changed := s.Check(); changed {
			sink(snap)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check reads the file once. changed is false when the content (or the read
// error) is the same as last time, so nothing needs to be applied.
func (s *Source) Check() (snap discovery.Snapshot, changed bool) {
	data, err := readFile(s.path)
	if err != nil {
		if err.Error() == s.seenErr {
			return discovery.Snapshot{}, false
		}
		s.seenErr, s.seen = err.Error(), nil
		return s.bad(ReasonUnreadable, err), true
	}
	if s.seenErr == "" && s.seen != nil && bytes.Equal(data, s.seen) {
		return discovery.Snapshot{}, false
	}
	s.seenErr, s.seen = "", data
	recs, err := Parse(data)
	if err != nil {
		return s.bad(ReasonInvalid, fmt.Errorf("%s: %w", s.path, err)), true
	}
	s.good, s.haveGood = recs, true
	s.log.Info("workers file loaded", "workers", len(recs))
	return discovery.Snapshot{Workers: recs, State: discovery.State{
		Ready: true, Reason: ReasonLoaded, Message: fmt.Sprintf("%d workers from %s", len(recs), s.path),
	}}, true
}

// bad keeps the last good version if there is one.
func (s *Source) bad(reason string, err error) discovery.Snapshot {
	if !s.haveGood {
		s.log.Error("workers file not usable; no workers from it until it is fixed", "err", err)
		return discovery.Snapshot{State: discovery.State{Ready: false, Reason: reason, Message: err.Error()}}
	}
	s.log.Error("workers file not usable; keeping the last good version", "err", err, "workers", len(s.good))
	return discovery.Snapshot{Workers: s.good, State: discovery.State{
		Ready:   true,
		Reason:  ReasonLastGoodKept,
		Message: fmt.Sprintf("%v; serving the %d workers of the last good version", err, len(s.good)),
	}}
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileBytes)
	}
	return data, nil
}
