//go:build linux

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procCommand is the command name of process pid, as lslocks(8) and ps(1)
// show it: /proc/PID/comm (the kernel's 15-byte name), or the base name of
// the first word of /proc/PID/cmdline when comm cannot be read. "" when
// neither can (the process is gone, or /proc is not mounted).
func procCommand(pid int) string {
	if pid <= 0 {
		return ""
	}
	dir := "/proc/" + strconv.Itoa(pid)
	if b, err := os.ReadFile(dir + "/comm"); err == nil {
		if s := string(bytes.TrimRight(b, "\n")); s != "" {
			return s
		}
	}
	b, err := os.ReadFile(dir + "/cmdline")
	if err != nil || len(b) == 0 {
		return ""
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return filepath.Base(string(b))
}

// procCmdline is the command line of process pid, its arguments joined by
// spaces (as ps -o args shows it); its command name when the command line
// is empty (a kernel thread, a zombie); "" when the process is gone.
func procCmdline(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return procCommand(pid)
	}
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}

// groupMember returns a running process of process group pgid: its leader
// (pid pgid) if it runs and still leads the group, else the member of the
// lowest pid; 0 when no process of the group runs. (shmlocks exec's
// command is the leader of its group.)
func groupMember(pgid int) int {
	if pgid <= 1 {
		return 0
	}
	if g, state, ok := procGroup(pgid); ok && g == pgid && state != 'Z' {
		return pgid
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	best := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, state, ok := procGroup(pid); ok && g == pgid && state != 'Z' && (best == 0 || pid < best) {
			best = pid
		}
	}
	return best
}

// procGroup reads the state and process group of pid from /proc/PID/stat.
func procGroup(pid int) (pgid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return 0, 0, false
	}
	g, err := strconv.Atoi(f[2])
	if err != nil || len(f[0]) != 1 {
		return 0, 0, false
	}
	return g, f[0][0], true
}
