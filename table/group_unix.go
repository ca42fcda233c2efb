//go:build unix && !linux

package table

import "syscall"

// Without /proc a group is alive while kill(-pgid, 0) finds a member (a
// zombie counts, and a reused pgid is not recognised: the limits of the
// fallback identity, ident_other.go).
func groupAlive(pgid int, _ uint32) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || err == syscall.EPERM
}
