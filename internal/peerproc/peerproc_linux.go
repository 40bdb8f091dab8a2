package peerproc

import (
	"os/exec"
	"syscall"
)

// DieWithParent has the kernel kill the peer when the test process dies, so
// that an interrupted test leaves no simulator holding its ports.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
