//go:build linux

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
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
