//go:build linux

package bench

import (
	"os/exec"
	"syscall"
)

// nsAttr starts a child in new PID and network namespaces (a container).
func nsAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET}
}

// canUnshare reports whether this process may start children in new PID
// and network namespaces (root, or a user namespace allowing it).
func canUnshare() bool {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = nsAttr()
	return cmd.Run() == nil
}
