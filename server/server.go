// Package server is kvselect's importable runner: it turns the command line,
// the DYN_ROUTER_* environment and an optional config file into a
// configuration, wires the selection core (package selection) to its fronts
// (the REST API in httpadmin, the Envoy ext_proc picker in extproc) and to its
// adapters (KV-event listeners in engines/kvlisten, the replica mesh and
// startup recovery in replicas/..., worker discovery in discovery/...), runs
// the upkeep ticker, and shuts everything down in order when its context ends.
//
// It is the only package that sees fronts and adapters together; cmd/kvselect
// is a few lines over Run, and a Go program can embed the whole server the same
// way, with its own selection policy (WithPolicy) or logger (WithLogger).
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/kvselect/kvselect/selection/scheduler"
)

// Option configures Run beyond its command-line arguments.
type Option func(*settings)

// settings are the options Run was given, with their defaults.
type settings struct {
	lookup    func(string) (string, bool)
	stdout    io.Writer
	stderr    io.Writer
	logger    *slog.Logger
	policy    *scheduler.Policy
	reload    <-chan struct{}
	listening func(Listening)
	version   string
}

func newSettings(opts []Option) *settings {
	s := &settings{lookup: os.LookupEnv, stdout: os.Stdout, stderr: os.Stderr}
	for _, o := range opts {
		o(s)
	}
	return s
}

// WithEnv reads the environment (DYN_ROUTER_*, KVSELECT_*) through lookup
// instead of os.LookupEnv.
func WithEnv(lookup func(string) (string, bool)) Option {
	return func(s *settings) { s.lookup = lookup }
}

// WithStdout is where --help and --version print (os.Stdout by default).
func WithStdout(w io.Writer) Option { return func(s *settings) { s.stdout = w } }

// WithStderr is where the logger built from --log-format and --log-level
// writes (os.Stderr by default). WithLogger replaces that logger altogether.
func WithStderr(w io.Writer) Option { return func(s *settings) { s.stderr = w } }

// WithLogger logs through l; --log-format and --log-level then do not apply.
func WithLogger(l *slog.Logger) Option { return func(s *settings) { s.logger = l } }

// WithPolicy selects workers with p, a policy written in Go, instead of a
// registered one: --policy, KVSELECT_POLICY and the config file's policy
// section must then be left unset (naming one too is a usage error), and a
// reload leaves p in place. To make a Go policy selectable by name instead,
// register it with scheduler.Register before calling Run.
func WithPolicy(p scheduler.Policy) Option {
	return func(s *settings) { s.policy = &p }
}

// WithReload re-reads the --config file's policy parameters whenever ch
// receives, instead of on SIGHUP (which Run then leaves alone).
func WithReload(ch <-chan struct{}) Option { return func(s *settings) { s.reload = ch } }

// Listening is where the servers listen once they do (with --port 0 the
// kernel picks the ports).
type Listening struct {
	// REST is the REST API's address.
	REST net.Addr
	// ExtProc is the ext_proc picker's address; nil when it is disabled.
	ExtProc net.Addr
}

// WithListening calls f once both servers listen, before Run serves its first
// request.
func WithListening(f func(Listening)) Option { return func(s *settings) { s.listening = f } }

// announce tells WithListening's f where the servers listen.
func (s *settings) announce(l Listening) {
	if s.listening != nil {
		s.listening(l)
	}
}

// loggerFor is WithLogger's logger, else one built from --log-format and
// --log-level writing to WithStderr's writer.
func (s *settings) loggerFor(o *options) *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return newLogger(o, s.stderr)
}

// WithVersion is the version --version prints and the startup log names
// (cmd/kvselect sets it at release time); by default the module version or
// VCS revision from the build info.
func WithVersion(v string) Option { return func(s *settings) { s.version = v } }

// UsageError is a command-line, environment or config-file mistake: the
// process exits with status 2, as clap (Dynamo's parser) and Go's flag
// package do.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// ExitStatus prints err (if any) to stderr and returns the process exit
// status: 0 on success, 2 for usage and configuration errors, 1 otherwise.
func ExitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		for line := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintf(stderr, "kvselect: %s\n", line)
		}
		fmt.Fprintln(stderr, "Run 'kvselect --help' for usage.")
		return 2
	}
	fmt.Fprintf(stderr, "kvselect: %v\n", err)
	return 1
}

// Run is the whole kvselect program: parse args, resolve the configuration,
// serve until ctx is cancelled, then shut down gracefully. It returns nil
// after --help, --version and a clean stop, a *UsageError for configuration
// mistakes, and any other error when serving failed.
func Run(ctx context.Context, args []string, opts ...Option) error {
	return run(ctx, args, newSettings(opts))
}
