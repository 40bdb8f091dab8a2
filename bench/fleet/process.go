package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvselect/kvselect/internal/peerproc"
)

// Process is a child process a harness may stop, kill, pause and start again
// under the same name. Its output goes to Log: the first start empties the
// file, every later one appends to it after a line naming the incarnation.
// An exit nobody asked for (no Stop or Kill) is reported to OnExit. The
// kernel kills the process if the harness dies.
type Process struct {
	Name   string
	Bin    string
	Env    []string // added to the harness's environment
	Log    string   // the log file's path
	OnExit func(name string, err error)

	mu       sync.Mutex
	args     []string
	cmd      *exec.Cmd
	done     chan struct{}
	expected bool // the current incarnation is meant to end (a kill, a stop)
	paused   bool // stopped with SIGSTOP
	starts   int
}

// NewProcess is a process, not started, that logs to dir/name.log.
func NewProcess(name, bin, dir string, args ...string) *Process {
	return &Process{Name: name, Bin: bin, Log: filepath.Join(dir, name+".log"), args: args}
}

// SetArgs changes the arguments of the next start.
func (p *Process) SetArgs(args []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.args = args
}

// Start starts a new incarnation; the previous one must have ended.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("%s is already running", p.Name)
	}
	mode := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if p.starts > 0 {
		mode = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	logf, err := os.OpenFile(p.Log, mode, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	fmt.Fprintf(logf, "=== %s start %d: %s %s\n", time.Now().Format(time.RFC3339Nano), p.starts+1, p.Bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.Bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if len(p.Env) > 0 {
		cmd.Env = append(os.Environ(), p.Env...)
	}
	peerproc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s (%s): %w; build it with `make build`", p.Name, p.Bin, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expected, p.paused = cmd, done, false, false
	p.starts++
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		unexpected := !p.expected
		onExit := p.OnExit
		p.mu.Unlock()
		close(done)
		if unexpected && onExit != nil {
			onExit(p.Name, err)
		}
	}()
	return nil
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Running reports whether the current incarnation has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// Pid is the current incarnation's process id, 0 when none runs.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.done) {
		return 0
	}
	return p.cmd.Process.Pid
}

// signal sends sig to the current incarnation; expectExit marks the exit it
// may cause as asked for.
func (p *Process) signal(sig syscall.Signal, expectExit bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.done) {
		return fmt.Errorf("%s is not running", p.Name)
	}
	if expectExit {
		p.expected = true
	}
	return p.cmd.Process.Signal(sig)
}

// Pause stops the process with SIGSTOP; Resume continues it.
func (p *Process) Pause() error {
	if err := p.signal(syscall.SIGSTOP, false); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return nil
}

// Resume continues a paused process.
func (p *Process) Resume() error {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return p.signal(syscall.SIGCONT, false)
}

// Paused reports whether the process is stopped by Pause.
func (p *Process) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *Process) Kill() {
	if p.signal(syscall.SIGKILL, true) == nil {
		p.Wait(time.Minute)
	}
}

// Stop asks the process to end (SIGTERM), killing it after grace. A paused
// process is continued first, or it could not act on the signal.
func (p *Process) Stop(grace time.Duration) {
	if p.signal(syscall.SIGTERM, true) != nil {
		return
	}
	_ = p.signal(syscall.SIGCONT, true)
	if !p.Wait(grace) {
		p.Kill()
	}
}

// Wait waits up to limit for the current incarnation to end and reports
// whether it did.
func (p *Process) Wait(limit time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(limit):
		return false
	}
}

// LogTail is the end of the process's log, at most n bytes, for an error's
// context.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
