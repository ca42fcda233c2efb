//go:build linux

package table

import (
	"bytes"
	"errors"
	"hash/fnv"
	"io/fs"
	"os"
	"strconv"
)

// BootID returns the running kernel's boot id (random per boot).
func BootID() [16]byte {
	var id [16]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id
	}
	b = bytes.TrimSpace(bytes.ReplaceAll(b, []byte("-"), nil))
	for i := 0; i < 16 && 2*i+1 < len(b); i++ {
		v, err := strconv.ParseUint(string(b[2*i:2*i+2]), 16, 8)
		if err != nil {
			return [16]byte{}
		}
		id[i] = byte(v)
	}
	return id
}

func bootHash(id [16]byte) uint64 {
	h := fnv.New64a()
	h.Write(id[:])
	return h.Sum64() | 1 // never 0
}

func readSelfIdentity() Identity {
	pid := os.Getpid()
	_, start, _ := procStat(pid)
	return Identity{PID: pid, Start: start, Boot: bootHash(BootID())}
}

// procStat reads /proc/PID/stat: the state letter and the start time (field 22).
// exists is false when there is no such process.
func procStat(pid int) (state byte, start uint64, exists bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, false
		}
		return 0, 0, true // cannot tell: assume it exists
	}
	// The command name may contain spaces and parentheses: fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, true
	}
	fields := bytes.Fields(b[i+2:])
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, true
	}
	start, err = strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return fields[0][0], 0, true
	}
	return fields[0][0], start, true
}

// ProcessStart returns the start time of pid (0 if unknown).
func ProcessStart(pid int) uint64 {
	_, s, _ := procStat(pid)
	return s
}

func processAlive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	state, s, exists := procStat(pid)
	if !exists {
		return false
	}
	if state == 'Z' || state == 'X' || state == 'x' {
		return false
	}
	if start != 0 && s != 0 && s != start {
		return false // the PID was recycled
	}
	return true
}
