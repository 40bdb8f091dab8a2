package soak

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/kvselect/kvselect/internal/peerproc"
)

// process is one child process that the run may kill, pause and start again
// under the same name: every incarnation appends to the same log file, and
// an exit nobody asked for is reported as a violation.
type process struct {
	name string
	bin  string
	log  string // log file path
	env  []string

	mu       sync.Mutex
	args     []string
	cmd      *exec.Cmd
	done     chan struct{}
	expected bool // the current incarnation is meant to end (a kill, a stop)
	paused   bool // stopped with SIGSTOP
	starts   int
	onExit   func(name string, err error) // unexpected exits
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("%s is already running", p.name)
	}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	fmt.Fprintf(logf, "=== %s start %d: %s %q\n", time.Now().Format(time.RFC3339Nano), p.starts+1, p.bin, p.args)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.env...)
	peerproc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s (%s): %w; build it with `make build`", p.name, p.bin, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expected, p.paused = cmd, done, false, false
	p.starts++
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		unexpected := !p.expected
		onExit := p.onExit
		p.mu.Unlock()
		close(done)
		if unexpected && onExit != nil {
			onExit(p.name, err)
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

// running reports whether the current incarnation has not exited.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.done) {
		return 0
	}
	return p.cmd.Process.Pid
}

// signal sends sig to the current incarnation; expectExit marks the exit it
// may cause as asked for.
func (p *process) signal(sig syscall.Signal, expectExit bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.done) {
		return fmt.Errorf("%s is not running", p.name)
	}
	if expectExit {
		p.expected = true
	}
	return p.cmd.Process.Signal(sig)
}

// pause stops the process with SIGSTOP; resume continues it.
func (p *process) pause() error {
	if err := p.signal(syscall.SIGSTOP, false); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return nil
}

func (p *process) resume() error {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return p.signal(syscall.SIGCONT, false)
}

func (p *process) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// kill ends the process with SIGKILL and waits for it.
func (p *process) kill() {
	if p.signal(syscall.SIGKILL, true) == nil {
		p.wait(time.Minute)
	}
}

// stop asks the process to end (SIGTERM), killing it after grace. A paused
// process is continued first, or it could not act on the signal.
func (p *process) stop(grace time.Duration) {
	if p.signal(syscall.SIGTERM, true) != nil {
		return
	}
	_ = p.signal(syscall.SIGCONT, true)
	if !p.wait(grace) {
		p.kill()
	}
}

func (p *process) wait(limit time.Duration) bool {
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

// logTail is the end of the process's log, for a violation's context.
func (p *process) logTail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func logPath(out, name string) string { return filepath.Join(out, name+".log") }
