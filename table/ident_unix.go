//go:build unix && !linux

package table

import (
	"os"
	"syscall"
)

// BootID is not known on this system; identity relies on the PID alone
// (documented limitation of the non-Linux fallback).
func BootID() [16]byte { return [16]byte{} }

func bootHash([16]byte) uint64 { return 1 }

func readSelfIdentity() Identity { return Identity{PID: os.Getpid(), Boot: 1} }

// ProcessStart is not known on this system.
func ProcessStart(int) uint64 { return 0 }

func processAlive(pid int, _ uint64) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
