//go:build unix

package stress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The exec feature: each goroutine of an exec worker runs
//
//	shmlocks exec --table T [-s] [-n | -w D] -E 75 stress-N -- WORKER
//
// in a process group of its own, one after the other. The command is this
// binary again (WorkerEnv with Command set): it checks in with the
// occupancy checker as the holder of stress-N, under its own pid, holds the
// name for a few milliseconds and checks out. So the checkers see the
// command's occupancy, not the wrapper's: whatever kills the wrapper, no
// other request may be granted the name while the command runs (what
// shmlocks exec guarantees, docs/cli.md).
//
// The supervisor's chaos picks a command that has checked in and asks (in
// the record's control word, tagged with the command's seq so that a late
// request never hits the next command) for a SIGKILL of the wrapper (sent
// by the worker, the wrapper's parent, which alone knows the pid is still
// its child), of the command (it kills itself) or of the wrapper's process
// group. The worker then waits until the command is gone before it reuses
// the record: it has cleared the record, or its pid is dead (a zombie or
// gone), in which case the worker clears it.
//
// Records of goroutine g: 0, the wrapper's request, then the command's hold.

const execConflict = 75 // -E: not available or timed out

// execLost is shmlocks exec's status when its lock was stolen, whatever the
// command did (docs/cli.md); "COMMAND not run" on its stderr when the steal
// came before the command started.
const execLost = 76

// execCommand is what an exec command needs (in its WorkerEnv).
type execCommand struct {
	Rec      int           `json:"rec"`
	Name     int           `json:"name"`
	Mode     uint32        `json:"mode"`
	Blocking bool          `json:"blocking"`
	Hold     time.Duration `json:"hold"`
	Asked    int64         `json:"asked"`
	Seq      uint64        `json:"seq"`
}

// execHold: how long a command holds its lock (a command is a process: it
// lives milliseconds, and a kill must find it running).
func execHold(rng *rand.Rand) time.Duration {
	return 10*time.Millisecond + time.Duration(rng.Int64N(int64(30*time.Millisecond)))
}

// runExec runs goroutine g's exec wrappers until ctx ends or its ops are done.
func runExec(ctx context.Context, wc *workerConfig, hold Hold, r *Region, c *Checker, be backend, g int, st *gstats) {
	rng := rand.New(rand.NewPCG(wc.Seed, uint64(wc.Slot)<<20|uint64(g)))
	slot := wc.Slot
	rec := r.rec(g, 0)
	ctl := r.u64(r.recOff(slot, rec) + rcCtl)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, WorkerEnv+"=") {
			env = append(env, kv)
		}
	}
	for i := 0; wc.Ops == 0 || i < wc.Ops; i++ {
		if ctx.Err() != nil {
			break
		}
		d := drawRequest(rng, wc)
		seq := uint64(i + 1)
		atomic.StoreUint64(ctl, seq<<8)
		var deadline int64
		args := append([]string(nil), wc.Exec[1:]...)
		args = append(args, "--table", wc.Table, "-E", strconv.Itoa(execConflict))
		if d.mode == modeShared {
			args = append(args, "-s")
		}
		switch {
		case d.ifAvailable:
			args = append(args, "-n")
		case d.timed:
			args = append(args, "-w", wc.Deadline.String())
			deadline = mono() + int64(wc.Deadline)
		}
		q := c.begin(want{rec: rec, name: d.name, mode: d.mode, blocking: !d.ifAvailable, deadline: deadline, flags: waitExec})
		cw := *wc
		cw.Command = &execCommand{Rec: rec, Name: d.name, Mode: d.mode, Blocking: !d.ifAvailable, Hold: execHold(rng), Asked: q.From(), Seq: seq}
		cw.Exec, cw.Worker = nil, nil
		js, _ := json.Marshal(cw)
		args = append(args, nameOf(d.name), "--")
		args = append(args, wc.Worker...)
		cmd := exec.Command(wc.Exec[0], args...)
		cmd.Env = append(env, WorkerEnv+"="+string(js))
		var errOut tail
		cmd.Stderr = &errOut
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			q.End()
			r.addStat(slot, slErrors, 1)
			st.addErr("start exec wrapper: " + err.Error())
			break
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		killed := execKillNone
	wait:
		for {
			select {
			case <-done:
				break wait
			case <-tick.C:
			}
			v := atomic.LoadUint64(ctl)
			if killed != execKillNone || v>>8 != seq || v&0xff == execKillNone {
				continue
			}
			killed = int(v & 0xff)
			switch killed {
			case execKillWrapper:
				cmd.Process.Kill() // not yet waited for: the pid is still our child's
			case execKillGroup:
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its group id is its pid, not reusable before the wait
			default:
				continue // the command kills itself, and counts it
			}
			r.addKill(featureExec)
			r.addExecKill(killed)
		}
		if v := atomic.LoadUint64(ctl); killed == execKillNone && v>>8 == seq && v&0xff == execKillCommand {
			killed = execKillCommand // it killed itself, and its wrapper exited before the worker looked
		}
		q.End()
		r.addStat(slot, slOps, 1)
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		switch {
		case ws.Exited() && ws.ExitStatus() == 0:
		case ws.Exited() && ws.ExitStatus() == execConflict && d.ifAvailable:
			r.addStat(slot, slNotAvail, 1)
		case ws.Exited() && ws.ExitStatus() == execConflict && d.timed:
			r.addStat(slot, slTimedOut, 1)
		case ws.Signaled() && ws.Signal() == syscall.SIGKILL && (killed == execKillWrapper || killed == execKillGroup):
		case ws.Exited() && ws.ExitStatus() == 128+int(syscall.SIGKILL) && (killed == execKillCommand || killed == execKillGroup):
		case ws.Exited() && ws.ExitStatus() == execLost && strings.Contains(errOut.String(), "COMMAND not run"):
			// Granted, then stolen before the wrapper saw its grant: the
			// command did not run.
			r.countGrant(slot, g, d.mode)
			r.addStat(slot, slStolen, 1)
		case ws.Exited() && ws.ExitStatus() == execLost:
			// Stolen while the command ran (it checked in: granted): the
			// wrapper sent it SIGTERM.
			r.addStat(slot, slStolen, 1)
			r.addStat(slot, slLostRel, 1)
		default:
			r.addStat(slot, slErrors, 1)
			st.addErr(fmt.Sprintf("exec wrapper for %s: %v: %q", nameOf(d.name), cmd.ProcessState, errOut.String()))
		}
		if !execGone(r, c, slot, rec, cw.Command.Hold+wc.Stuck+5*time.Second) {
			break
		}
	}
}

// execGone waits until the command of record rec has checked out or died
// (then clears its record), at most limit; a command still running then
// is a violation (its wrapper has exited: the name is not held for it).
func execGone(r *Region, c *Checker, slot, rec int, limit time.Duration) bool {
	off := r.recOff(slot, rec)
	deadline := time.Now().Add(limit)
	for {
		pid := atomic.LoadInt64(r.i64(off + rcPID))
		if pid == 0 && atomic.LoadUint32(r.u32(off+rcHoldName)) == 0 {
			return true
		}
		if pid != 0 && !processAlive(int(pid), atomic.LoadUint64(r.u64(off+rcPStart))) {
			atomic.StoreUint32(r.u32(off+rcHoldName), 0)
			atomic.StoreInt64(r.i64(off+rcPID), 0)
			return true
		}
		if time.Now().After(deadline) {
			c.violation(kindExec, "exec command pid %d still runs %v after its wrapper exited", pid, limit)
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// execCommandMain is an exec command: check in as the holder of the name,
// hold it, check out. The wrapper gives the fencing token in
// SHMLOCKS_TOKEN; without it the token checks are skipped for this hold.
func execCommandMain(wc *workerConfig, stderr io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "stress exec command %d: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
		return 1
	}
	x := wc.Command
	mp, err := openRegionFile(wc.Region)
	if err != nil {
		return fail("%v", err)
	}
	defer mp.close()
	r, err := OpenRegion(mp.buf)
	if err != nil {
		return fail("%v", err)
	}
	if wc.Slot < 0 || wc.Slot >= r.Slots() || x.Rec < 0 || x.Rec >= r.Records() || x.Name < 0 || x.Name >= r.Names() {
		return fail("configuration does not fit the check region")
	}
	pid := os.Getpid()
	c := NewChecker(r, wc.Slot, pid, mono)
	c.ids.Store(uint32(pid) << 8) // apart from the ids of the worker's own holds
	q := &Request{c: c, g: x.Rec / r.perG, rec: x.Rec, name: x.Name, mode: x.Mode, blocking: x.Blocking,
		flags: recExec, pid: int64(pid), pstart: processStart(pid), asked: x.Asked}
	q.End()
	if n := os.Getenv("SHMLOCKS_NAME"); n != "" && n != nameOf(x.Name) {
		c.violation(kindExec, "exec command for %s was given SHMLOCKS_NAME=%q", nameOf(x.Name), n)
	}
	var token uint64
	if t := os.Getenv("SHMLOCKS_TOKEN"); t != "" {
		if token, err = strconv.ParseUint(t, 10, 64); err != nil {
			c.violation(kindExec, "exec command for %s was given SHMLOCKS_TOKEN=%q", nameOf(x.Name), t)
		}
	} else {
		q.noToken = true
	}
	off := r.recOff(wc.Slot, x.Rec)
	atomic.StoreUint64(r.u64(off+rcSeq), x.Seq)
	q.Granted(token)
	r.countGrant(wc.Slot, q.g, x.Mode)
	r.addStat(wc.Slot, slExecRuns, 1)
	q.Enter()
	ctl := r.u64(off + rcCtl)
	for end := time.Now().Add(x.Hold); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if v := atomic.LoadUint64(ctl); v>>8 == x.Seq && v&0xff == execKillCommand {
			r.addKill(featureExec)
			r.addExecKill(execKillCommand)
			syscall.Kill(pid, syscall.SIGKILL)
			select {}
		}
	}
	q.Exit()
	q.Release()
	atomic.StoreInt64(r.i64(off+rcPID), 0)
	return 0
}

// tail keeps the last bytes written to it (a wrapper's and its command's
// standard error, shown when the wrapper ends unexpectedly).
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 512 {
		t.b = t.b[len(t.b)-512:]
	}
	return len(p), nil
}

func (t *tail) String() string { return strings.TrimSpace(string(t.b)) }
