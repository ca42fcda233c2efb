package table

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/shm"
)

// Tables of another format (docs/design.md, "Compatibility promise").
//
// A table of an older format is replaced by Open itself, atomically (a new
// file renamed over it), once no process uses it: no open file description
// holds its in-use lock (the users of format 8 and later), and the kernel
// grants a write lease on it (no other open file or mapping of it anywhere:
// the users of the earlier formats, which never took that lock), or, where
// the kernel will not grant leases (not the file's owner), its agent
// records name no running process. Of eight processes that find it at
// once, the one that takes the in-use write lock replaces it and the others
// wait for that lock and then open the new file. A table of a newer format
// is never replaced.

// maxReplaceRounds bounds Open's rounds of replace-and-open-again.
const maxReplaceRounds = 256

// inUseSettle: a file found open elsewhere is looked at again for this long
// before Open says it is in use (new processes racing to replace it open
// it too, each for a moment).
const inUseSettle = 300 * time.Millisecond

// openOrReplace is shm.Open with the replacement of an older format.
func openOrReplace(path string, l layout, mode os.FileMode, init, validate func([]byte) error) (*shm.Mapping, bool, error) {
	var inUseSince time.Time
	for round := 0; ; round++ {
		m, created, err := shm.Open(path, int64(l.size), HeaderSize, mode, init, validate)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Found > FormatVersion && fe.Found != formatRetired || round >= maxReplaceRounds {
			return m, created, err
		}
		rerr := shm.Replace(path, int64(l.size), mode, init, legacyUsers, retire)
		switch {
		case rerr == nil, shm.IsTransient(rerr):
			if shm.IsTransient(rerr) {
				pause(round)
			}
			continue
		case errors.Is(rerr, shm.ErrInUse) && (inUseSince.IsZero() || time.Since(inUseSince) < inUseSettle):
			// Another new process may have the old file open for a moment
			// (it opened it and is about to find its format): look again.
			if inUseSince.IsZero() {
				inUseSince = time.Now()
			}
			pause(round)
			continue
		case errors.Is(rerr, shm.ErrInUse):
			who := rerr.Error()
			if i := strings.LastIndex(who, ": "); i >= 0 {
				who = who[i+2:]
			}
			return nil, false, &FormatError{Found: fe.Found, InUse: who}
		default:
			return nil, false, fmt.Errorf("%w: %w", fe, rerr)
		}
	}
}

// retire marks a replaced table's header (its users refuse it from now on).
func retire(b []byte) {
	if len(b) >= hdrVersion+4 {
		binary.NativeEndian.PutUint32(b[hdrVersion:], formatRetired)
	}
}

// legacyUsers counts the agent records of an older table (formats 3 to 7
// share the header offsets of the geometry and the agent word) that name a
// running process: a hint, the only one those formats leave, used where the
// kernel will not say whether the file is open elsewhere. The bytes are
// untrusted: anything out of range counts as no agent.
func legacyUsers(b []byte) (int, string) {
	ne := binary.NativeEndian
	if len(b) < HeaderSize {
		return 0, ""
	}
	nAgents := uint64(ne.Uint32(b[hdrMaxAgents:]))
	off := ne.Uint64(b[hdrAgentsOff:])
	if nAgents > MaxAgentsLimit || off >= uint64(len(b)) || off%8 != 0 {
		return 0, ""
	}
	n := 0
	var pids []string
	for i := uint64(0); i < nAgents && off+(i+1)*AgentSize <= uint64(len(b)); i++ {
		w := ne.Uint64(b[off+i*AgentSize:])
		if wordState(w) == AgentFree {
			continue
		}
		pid := agentWordPID(w)
		if pid <= 0 || !processAlive(pid, 0) {
			continue
		}
		if s := ProcessStart(pid); s != 0 && s&0xFFFFFF != agentWordStart24(w) {
			continue
		}
		n++
		if len(pids) < 8 {
			pids = append(pids, fmt.Sprint(pid))
		}
	}
	if n == 0 {
		return 0, ""
	}
	return n, fmt.Sprintf("%d agents (pids %s)", n, strings.Join(pids, ", "))
}

// formatUse tells an inspector (dump, serve) who uses the table file at
// path of an older format: a process of format 8 or later holding the
// in-use lock, or agents of the old format naming running processes (a
// hint: the kernel's lease, which alone would see every user, needs write
// access). unused is true when neither is found.
func formatUse(path string) (who string, unused bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if locked, known := shm.RangeLocked(int(f.Fd()), shm.InUseStart, shm.InUseLen); known && locked {
		return "a process holding its in-use lock", false
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() > 1<<30 {
		return "", false
	}
	b := make([]byte, fi.Size())
	n, _ := f.ReadAt(b, 0)
	if k, who := legacyUsers(b[:n]); k > 0 {
		return who, false
	}
	return "", true
}
