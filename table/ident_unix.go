//go:build unix && !linux

package table

import "syscall"

func processAlive(pid int, _ uint64) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
