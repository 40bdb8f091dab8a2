//go:build !linux

package peerproc

import "os/exec"

// DieWithParent: only Linux can tie a child's life to its parent's; elsewhere
// an interrupted test may leave a peer running.
func DieWithParent(*exec.Cmd) {}
