//go:build linux

package stress

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// processAlive reports whether process pid, started at start (processStart's
// value, 0: not checked), can still run its own code: not gone, not a
// zombie, not a later process that reuses the pid, and not being killed (a
// SIGKILL pending, or its exit begun: a multi-threaded process takes a
// while to die, and it runs none of its code meanwhile). A killed exec
// command whose parent died too is reparented and may stay a zombie for a
// while.
func processAlive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return !os.IsNotExist(err)
	}
	state, st, ok := parseStat(b)
	if !ok {
		return true
	}
	if state == 'Z' || state == 'X' || state == 'x' || start != 0 && st != start {
		return false
	}
	return !dying(dir)
}

// dying reports whether the process of /proc directory dir has a SIGKILL
// pending or has begun to exit (PF_EXITING of its main thread).
func dying(dir string) bool {
	const sigkill = 1 << (9 - 1)
	const pfExiting = 0x4
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return os.IsNotExist(err)
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || !(bytes.Equal(k, []byte("SigPnd")) || bytes.Equal(k, []byte("ShdPnd"))) {
			continue
		}
		if m, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64); err == nil && m&sigkill != 0 {
			return true
		}
	}
	if b, err := os.ReadFile(dir + "/stat"); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
			if f := bytes.Fields(b[i+2:]); len(f) > 6 {
				if flags, err := strconv.ParseUint(string(f[6]), 10, 64); err == nil && flags&pfExiting != 0 {
					return true
				}
			}
		}
	}
	return false
}

// processStart returns the start time of process pid (clock ticks since
// boot), 0 if unknown.
func processStart(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	_, st, _ := parseStat(b)
	return st
}

// parseStat returns the state and the start time of a /proc/PID/stat line
// (fields 3 and 22; the command name in parentheses may hold anything).
func parseStat(b []byte) (byte, uint64, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 20 {
		return 0, 0, false
	}
	st, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil || len(f[0]) != 1 {
		return 0, 0, false
	}
	return f[0][0], st, true
}

// namespacesSupported: Config.Namespaces works here.
const namespacesSupported = true

// namespaceAttr starts a worker in new PID, network and mount namespaces
// (the worker mounts its own /proc: mountOwnProc).
func namespaceAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS}
}

// ownProcEnv asks a worker started by namespaceAttr to mount its /proc.
const ownProcEnv = "SHMLOCKS_STRESS_OWN_PROC"

// mountOwnProc makes every mount of this (new) mount namespace private,
// then mounts a /proc of this process's PID namespace over /proc.
func mountOwnProc() error {
	if err := syscall.Mount("none", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return err
	}
	return syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
}
