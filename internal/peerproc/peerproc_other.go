//go:build !linux

package peerproc

import "os/exec"

// dieWithParent: only Linux can tie a child's life to its parent's; elsewhere
// an interrupted test may leave a peer running.
func dieWithParent(*exec.Cmd) {}
