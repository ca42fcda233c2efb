package main

import (
	binenc "encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/shmlocks/shmlocks/manager"
	shmfile "github.com/shmlocks/shmlocks/shm"
	"github.com/shmlocks/shmlocks/table"
)

// Exit statuses, one table for every command (docs/cli.md, "Exit
// status"); those above 1 are sysexits(3) codes, as flock(1) uses.
// shmlocks exec also exits with the command's own status, 126/127 when it
// cannot run it and 128+N after signal N.
const (
	exitOK          = 0
	exitFailure     = 1  // exec: not available (-n) or timed out (-w); dump --check: violations or a wait-for cycle
	exitUsage       = 64 // EX_USAGE: a usage error
	exitCorrupt     = 65 // EX_DATAERR: the file is not a lock table this build reads (corrupt, another format version)
	exitNoTable     = 66 // EX_NOINPUT: the table cannot be opened or created (missing, not a regular file, permission, unsafe location)
	exitUnavailable = 69 // EX_UNAVAILABLE: a service could not start (serve: the address cannot be listened on)
	exitOSErr       = 71 // EX_OSERR: internal or system error (no memory, descriptors, processes; anything unexpected)
	exitTempFail    = 75 // EX_TEMPFAIL: the table is full (no free agent record, name or request)
	exitLost        = 76 // exec: the lock was lost (stolen) while the command ran or before it started, whatever the command did
)

const exitStatusHelp = `Exit status, every command (sysexits codes above 1, as flock(1)):
0 ok; 1 not available or timed out (exec), violations or a wait-for
cycle (dump --check); 64 usage error; 65 not a lock table this build
reads (corrupt, another format version); 66 the table cannot be opened
or created (missing, not a regular file, permission, unsafe location);
69 a service could not start (serve: its address); 71 internal or system
error; 75 table full; 76 exec's lock was lost (stolen). exec also: the
command's own status, 126/127 if it cannot be run, 128+N after signal N.`

// tableFailure is the exit status and the message (without the command's
// prefix) of err, an error of opening the table at path or of a request
// on it; dflt for an error of no known kind.
func tableFailure(path string, err error, dflt int) (int, string) {
	switch {
	case errors.Is(err, table.ErrFormat):
		if v, ok := tableVersion(path); ok && v != table.FormatVersion {
			return exitCorrupt, fmt.Sprintf("%s is a lock table of format version %d; this build of shmlocks reads version %d: %s", path, v, table.FormatVersion, errText(err))
		}
		return exitCorrupt, fmt.Sprintf("%s: %s", path, errText(err))
	case errors.Is(err, table.ErrCorrupt):
		if v, ok := tableVersion(path); ok && v != table.FormatVersion {
			return exitCorrupt, fmt.Sprintf("%s is a lock table of format version %d; this build of shmlocks reads version %d", path, v, table.FormatVersion)
		}
		return exitCorrupt, fmt.Sprintf("%s is not a valid lock table: %s", path, errText(err))
	case errors.Is(err, table.ErrTableFull):
		return exitTempFail, errText(err)
	case errors.Is(err, manager.ErrNotSupported):
		return exitUsage, errText(err)
	case errors.Is(err, shmfile.ErrNotRegular):
		return exitNoTable, fmt.Sprintf("%s is %s, not a regular file: a table is a file", path, fileKind(path))
	case errors.Is(err, fs.ErrNotExist):
		dir := filepath.Dir(path)
		if fi, derr := os.Stat(dir); derr != nil || !fi.IsDir() {
			return exitNoTable, fmt.Sprintf("no table at %s: directory %s does not exist", path, dir)
		}
		return exitNoTable, fmt.Sprintf("no table at %s", path)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return exitNoTable, fmt.Sprintf("%s: permission denied (%s)", path, errText(err))
	case errors.Is(err, manager.ErrUnsafeTable), errors.Is(err, shmfile.ErrSymlink),
		errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ELOOP),
		errors.Is(err, syscall.ENAMETOOLONG):
		return exitNoTable, errText(err)
	case errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE),
		errors.Is(err, syscall.EAGAIN):
		return exitOSErr, errText(err)
	}
	return dflt, errText(err)
}

// failf prints "shmlocks CMD: message" on w and returns code.
func failf(w io.Writer, cmd string, code int, format string, args ...any) int {
	fmt.Fprintf(w, "shmlocks %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return code
}

// tableFail prints the failure of err on the table at path (tableFailure)
// and returns its exit status.
func tableFail(w io.Writer, cmd, path string, err error, dflt int) int {
	code, msg := tableFailure(path, err, dflt)
	return failf(w, cmd, code, "%s", msg)
}

// errText is err's message without the "shmlocks: " its sentinel starts
// with (the command's own prefix says it).
func errText(err error) string {
	return strings.ReplaceAll(err.Error(), "shmlocks: ", "")
}

// tableVersion reads the format version of the file at path if it starts
// with the table's magic.
func tableVersion(path string) (uint32, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var b [12]byte
	if _, err := io.ReadFull(f, b[:]); err != nil || string(b[:8]) != table.Magic {
		return 0, false
	}
	return binenc.NativeEndian.Uint32(b[8:]), true
}

// fileKind names what the file at path is, in words.
func fileKind(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "a file that cannot be read"
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file"
}
