//go:build linux

package stress

import (
	"bytes"
	"os"
	"strconv"
)

// processAlive reports whether process pid, started at start (processStart's
// value, 0: not checked), is still running: not gone, not a zombie, not a
// later process that reuses the pid. A killed exec command whose parent
// died too is reparented and may stay a zombie for a while.
func processAlive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !os.IsNotExist(err)
	}
	state, st, ok := parseStat(b)
	if !ok {
		return true
	}
	if state == 'Z' || state == 'X' || state == 'x' {
		return false
	}
	return start == 0 || st == start
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
