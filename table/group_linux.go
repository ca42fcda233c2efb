//go:build linux

package table

import (
	"bytes"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

func groupAlive(pgid int, start32 uint32) bool {
	state, start, exists := procStat(pgid)
	if exists && start != 0 && start32 != 0 && uint32(start) != start32 {
		return false // pgid names a newer process: no member of the old group is left
	}
	if exists && start != 0 && !zombie(state) {
		return true // the leader runs
	}
	// The leader is gone (or a zombie): does another member run? The one
	// found last time is looked at first.
	if err := unix.Kill(-pgid, 0); err == unix.ESRCH {
		lastMember.Delete(pgid)
		return false
	}
	if pid, ok := lastMember.Load(pgid); ok && memberRunning(pid.(int), pgid) {
		return true
	}
	pid := groupMemberRunning(pgid)
	if pid == 0 {
		lastMember.Delete(pgid)
		return false
	}
	lastMember.Store(pgid, pid)
	return true
}

// lastMember remembers, per group whose leader is gone, the member found
// running by the last scan.
var lastMember sync.Map // pgid -> pid

func zombie(state byte) bool { return state == 'Z' || state == 'X' || state == 'x' }

// groupMemberRunning scans /proc for a process of group pgid that is not a
// zombie and returns its pid (0: none; pgid itself if it cannot tell).
// Members are usually younger than their leader: the scan starts after
// pgid and wraps around.
func groupMemberRunning(pgid int) int {
	d, err := os.Open("/proc")
	if err != nil {
		return pgid // cannot tell: keep the group
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return pgid
	}
	var before []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == pgid {
			continue
		}
		if pid < pgid {
			before = append(before, pid)
			continue
		}
		if memberRunning(pid, pgid) {
			return pid
		}
	}
	for _, pid := range before {
		if memberRunning(pid, pgid) {
			return pid
		}
	}
	return 0
}

// memberRunning reports whether pid runs (not a zombie) in group pgid.
func memberRunning(pid, pgid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false // gone
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	// Fields resume after the command name: 3 state, 4 ppid, 5 pgrp.
	f := bytes.Fields(b[i+2:])
	if len(f) < 3 || len(f[0]) != 1 {
		return false
	}
	g, err := strconv.Atoi(string(f[2]))
	return err == nil && g == pgid && !zombie(f[0][0])
}
