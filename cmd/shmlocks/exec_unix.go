//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/manager"
	"github.com/shmlocks/shmlocks/table"
)

// How shmlocks exec keeps the lock exactly as long as the command:
//
//  1. The lock is acquired by this process's agent.
//  2. The command is started as a child of this process that first execs
//     shmlocks itself (execChildArg) in a new process group (its pid is
//     the group's id), holding only the read end of a pipe.
//  3. The group is made the co-owner of the agent (Manager.SetCoOwner): from
//     now on the agent, and so the lock, is alive while this process or a
//     process of the group runs.
//  4. A byte on the pipe tells the child to exec the command. Should this
//     process die before (SIGKILL between 2 and 4), the child reads EOF and
//     exits without running anything: the command never runs without the
//     lock.
//
// This process then waits for the command, passes it the signals it
// receives, and exits with its status; it releases the lock itself only if
// no process of the group is left (or with -o): otherwise the group keeps
// it, and the table's reapers free it when the group is gone.

// waitSignals end a wait for the lock: each would end this process by
// default, and a request must be withdrawn cleanly rather than reaped.
var waitSignals = []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE, syscall.SIGXCPU, syscall.SIGXFSZ,
	syscall.SIGVTALRM, syscall.SIGABRT}

// notForwarded are the signals never passed to the command: the child's
// own exit (ours to see), and the Go runtime's preemption signal.
var notForwarded = []syscall.Signal{syscall.SIGCHLD, syscall.SIGURG}

// notify relays each of sigs to c, except those ignored when this process
// started (they stay ignored, and so does the command: exec keeps SIG_IGN).
func notify(c chan<- os.Signal, sigs ...syscall.Signal) {
	for _, s := range sigs {
		if !signal.Ignored(s) {
			signal.Notify(c, s)
		}
	}
}

// allSignals lists the signal numbers 1..64 but those that cannot be caught
// and notForwarded (numbers this system lacks are ignored by Notify).
func allSignals() []syscall.Signal {
	var out []syscall.Signal
	for n := 1; n <= 64; n++ {
		s := syscall.Signal(n)
		if s == syscall.SIGKILL || s == syscall.SIGSTOP || slices.Contains(notForwarded, s) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func execLocked(o *execOptions, stdout, stderr io.Writer) int {
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(stderr, "shmlocks exec: %s\n", fmt.Sprintf(format, args...))
		return code
	}
	// Catch the signals that end a wait before anything can block.
	sigs := make(chan os.Signal, 64)
	notify(sigs, waitSignals...)
	defer signal.Stop(sigs)

	m, err := manager.Open(o.path, &manager.OpenOptions{FileMode: o.mode})
	if err != nil {
		return tableFail(stderr, "exec", o.path, err, exitNoTable)
	}
	keep := false // the command's group keeps the lock: leave without Close
	defer func() {
		if !keep {
			m.Close()
		}
	}()

	// Wait for the lock; a signal cancels the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.timeout > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, o.timeout)
		defer c2()
	}
	var interrupted os.Signal
	waiting, watcherDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-waiting:
		}
	}()
	start := time.Now()
	l, err := m.Acquire(ctx, o.name, o.opts)
	took := time.Since(start)
	close(waiting)
	<-watcherDone
	if interrupted != nil {
		if l != nil { // granted as the signal arrived: give it back
			l.Release()
		}
		if o.verbose {
			fmt.Fprintf(stderr, "shmlocks exec: %v while waiting for %q: request withdrawn\n", interrupted, o.name)
		}
		return 128 + int(interrupted.(syscall.Signal))
	}
	switch {
	case err == nil:
	case errors.Is(err, manager.ErrNotAvailable):
		if o.verbose {
			fmt.Fprintf(stderr, "shmlocks exec: lock %q is not available\n", o.name)
		}
		return o.conflictCode
	case errors.Is(err, manager.ErrAborted) && errors.Is(err, context.DeadlineExceeded):
		if o.verbose {
			fmt.Fprintf(stderr, "shmlocks exec: timed out after %v waiting for lock %q\n", o.timeout, o.name)
		}
		return o.conflictCode
	case errors.Is(err, manager.ErrStolen):
		// Granted, then stolen before this process saw the grant.
		return fail(exitLost, "lock %q was stolen as it was granted; COMMAND not run", o.name)
	default:
		return tableFail(stderr, "exec", o.path, err, exitOSErr)
	}
	if o.verbose {
		fmt.Fprintf(stderr, "shmlocks exec: getting lock %q took %.6f seconds\n", o.name, took.Seconds())
		fmt.Fprintf(stderr, "shmlocks exec: executing %s\n", o.argv[0])
	}
	// From here on every signal goes to the command.
	notify(sigs, allSignals()...)

	c, code, err := startCommand(o, m, l, stdout, stderr)
	if err != nil {
		l.Release()
		return fail(code, "%v", err)
	}
	status, stolen := c.wait(o, l, sigs, stderr)
	switch {
	case stolen:
		// Whatever the command did (ignored SIGTERM and exited 0, say):
		// it did not hold the lock to its end.
		fmt.Fprintf(stderr, "shmlocks exec: lock %q was lost while the command ran (its status %d); exit %d\n", o.name, status, exitLost)
		status = exitLost
	case o.closeEarly || !table.GroupAlive(c.pgid, uint32(c.start)) && !m.KeepAliveHeld():
		l.Release()
	default:
		keep = true // the group's processes, or those holding the keep-alive descriptor, hold the lock now; the table frees it when they are gone
		if o.verbose {
			fmt.Fprintf(stderr, "shmlocks exec: processes of the command's group %d still run: they keep lock %q\n", c.pgid, o.name)
		}
	}
	return status
}

// child is a started command: its process (the leader of group pgid)
// and the terminal whose foreground it was given, if any.
type child struct {
	pid, pgid int
	start     uint64 // the leader's start time (ProcessStart)
	tty       *os.File
	fg        bool            // the group was made the terminal's foreground job
	sigs      chan os.Signal  // relayed signals while the command runs (nil after)
	writers   []*os.File      // pipe ends given to the command (file)
	copies    []chan struct{} // closed when a pipe's copy ends
}

// startCommand starts the command (see the top of this file) with the lock
// l's name and token in its environment; code is the exit status for its
// error.
func startCommand(o *execOptions, m *manager.Manager, l *manager.Lock, stdout, stderr io.Writer) (c *child, code int, err error) {
	path, err := exec.LookPath(o.argv[0])
	if errors.Is(err, exec.ErrDot) { // found through "." in $PATH: run it, as execvp would
		err = nil
	}
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return nil, 127, err
		}
		return nil, 126, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, exitOSErr, fmt.Errorf("cannot find the shmlocks executable: %w", err)
	}
	goR, goW, err := os.Pipe()
	if err != nil {
		return nil, exitOSErr, err
	}
	defer goW.Close()
	c = &child{}
	outF, errF := c.file(stdout), c.file(stderr)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, envLockName+"=") || strings.HasPrefix(kv, envLockToken+"=")
	})
	env = append(env, envLockName+"="+o.name, envLockToken+"="+strconv.FormatUint(l.Token(), 10))
	sys := &syscall.SysProcAttr{Setpgid: true}
	if c.tty = openTTY(); c.tty != nil && foregroundOf(c.tty) == syscall.Getpgrp() {
		c.fg = true
		sys.Foreground, sys.Ctty = true, int(c.tty.Fd())
	}
	files := []*os.File{os.Stdin, outF, errF, goR}
	// The keep-alive descriptor (the command's fd 3): the lock lives while
	// any process holds it, in any PID namespace, as flock(1)'s lock lives
	// with the descriptor its command inherits. Where there is none, the
	// command's group keeps the lock through SetCoOwner alone.
	var keep *os.File
	if !o.closeEarly { // -o: the command holds no descriptor of the lock, as with flock(1)
		if f, err := m.KeepAliveFile(); err == nil {
			keep = f
			files = append(files, keep)
		}
	}
	p, err := os.StartProcess(self, append([]string{"shmlocks", execChildArg, path}, o.argv...), &os.ProcAttr{
		Env: env, Files: files, Sys: sys,
	})
	goR.Close()
	if keep != nil {
		keep.Close() // the command's copy keeps the agent alive; this process's agent lock keeps it too
	}
	if err != nil {
		c.close()
		return nil, exitOSErr, fmt.Errorf("start %s: %w", o.argv[0], err)
	}
	c.started()
	c.pid, c.pgid = p.Pid, p.Pid
	c.start = table.ProcessStart(c.pid)
	p.Release() // waited for with wait4 (WUNTRACED), below
	if err := m.SetCoOwner(c.pgid); err != nil {
		syscall.Kill(-c.pgid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(c.pid, &ws, 0, nil)
		c.restoreTerminal()
		c.close()
		code, _ := tableFailure(o.path, err, exitOSErr)
		return nil, code, errors.New(errText(err))
	}
	if _, err := goW.Write([]byte{1}); err != nil { // the child died before the go-ahead
		c.restoreTerminal()
		c.close()
		return nil, exitOSErr, fmt.Errorf("start %s: %w", o.argv[0], err)
	}
	return c, 0, nil
}

// file returns w as an *os.File for the command: w itself if it is one,
// else the write end of a pipe copied to w (closed here once the command
// has it: the copy ends with the last writer of the command's group).
func (c *child) file(w io.Writer) *os.File {
	if f, ok := w.(*os.File); ok {
		return f
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil
	}
	done := make(chan struct{})
	c.copies = append(c.copies, done)
	c.writers = append(c.writers, pw)
	go func() {
		io.Copy(w, r)
		r.Close()
		close(done)
	}()
	return pw
}

// started closes what the command no longer needs from this process.
func (c *child) started() {
	for _, w := range c.writers {
		w.Close()
	}
	c.writers = nil
}

func (c *child) close() {
	c.started()
	if c.tty != nil {
		c.tty.Close()
	}
}

// wait waits for the command to exit, passing it the signals this process
// receives, following its stops (job control) and, once the lock is
// stolen, terminating it. It returns the exit status, and whether the lock
// was stolen.
func (c *child) wait(o *execOptions, l *manager.Lock, sigs chan os.Signal, stderr io.Writer) (status int, stolen bool) {
	c.sigs = sigs
	defer func() {
		c.sigs = nil
		c.restoreTerminal()
		if c.tty != nil {
			c.tty.Close()
		}
		for _, d := range c.copies {
			select {
			case <-d:
			case <-time.After(time.Second): // a process of the group still writes
			}
		}
	}()
	type event struct {
		ws  syscall.WaitStatus
		err error
	}
	events := make(chan event, 1)
	go func() {
		for {
			var ws syscall.WaitStatus
			_, err := syscall.Wait4(c.pid, &ws, syscall.WUNTRACED, nil)
			if err == syscall.EINTR {
				continue
			}
			events <- event{ws, err}
			if err != nil || !ws.Stopped() {
				return
			}
		}
	}()
	lost := l.Lost()
	var kill <-chan time.Time
	stopSent := false // a stop signal was passed on: stop along with the command
	for {
		select {
		case s := <-sigs:
			sig := s.(syscall.Signal)
			switch sig {
			case syscall.SIGCHLD, syscall.SIGURG:
				continue
			case syscall.SIGCONT:
				// Continued in the foreground (fg, also of a job started in
				// the background): the command gets the terminal.
				if c.tty != nil && foregroundOf(c.tty) == syscall.Getpgrp() {
					setForeground(c.tty, c.pgid, c.sigs)
					c.fg = true
				}
			case syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU:
				stopSent = true
			}
			syscall.Kill(-c.pgid, sig)
		case <-lost:
			lost, stolen = nil, true
			after := ""
			if o.killAfter > 0 {
				kill = time.After(o.killAfter)
				after = fmt.Sprintf(", SIGKILL in %v", o.killAfter)
			}
			c.warnf(stderr, "lock %q was stolen; sending SIGTERM to the command%s", o.name, after)
			syscall.Kill(-c.pgid, syscall.SIGTERM)
		case <-kill:
			kill = nil
			c.warnf(stderr, "the command outlived --kill-after %v after the steal; sending SIGKILL", o.killAfter)
			syscall.Kill(-c.pgid, syscall.SIGKILL)
		case ev := <-events:
			switch {
			case ev.err != nil:
				c.warnf(stderr, "wait: %v", ev.err)
				return exitOSErr, stolen
			case ev.ws.Stopped():
				// Stopped from its terminal (Ctrl-Z, or reading it from the
				// background) or by a stop signal we passed on: stop too, so
				// that the shell running us sees the job stopped; the
				// SIGCONT that resumes us resumes it. (Stopped otherwise, by
				// a SIGSTOP sent to it alone, it waits for its own SIGCONT.)
				ttyStop := ev.ws.StopSignal() == syscall.SIGTTIN || ev.ws.StopSignal() == syscall.SIGTTOU
				if c.fg || stopSent || ttyStop && c.tty != nil {
					stopSent = false
					c.restoreTerminal()
					syscall.Kill(os.Getpid(), syscall.SIGSTOP)
				}
			case ev.ws.Signaled():
				return 128 + int(ev.ws.Signal()), stolen
			default:
				return ev.ws.ExitStatus(), stolen
			}
		}
	}
}

// restoreTerminal takes the terminal's foreground back from the command's
// group, if it had it.
func (c *child) restoreTerminal() {
	if c.fg && c.tty != nil && foregroundOf(c.tty) == c.pgid {
		setForeground(c.tty, syscall.Getpgrp(), c.sigs)
	}
}

// warnf prints a line on stderr while the command runs. On a terminal this
// process is then in the background: SIGTTOU (stty tostop) would stop it,
// or, relayed, loop; it is ignored for the write.
func (c *child) warnf(stderr io.Writer, format string, args ...any) {
	if c.tty != nil {
		signal.Ignore(syscall.SIGTTOU)
		defer signal.Notify(c.sigs, syscall.SIGTTOU)
	}
	fmt.Fprintf(stderr, "shmlocks exec: %s\n", fmt.Sprintf(format, args...))
}

// execChild is the command's process before it runs the command: it waits
// for the go-ahead byte on descriptor 3 (see the top of this file), then
// execs args[0] with argv args[1:]. EOF: the wrapper died before the lock
// was handed to this group; nothing runs.
func execChild(args []string) int {
	goR := os.NewFile(3, "go-ahead")
	var b [1]byte
	n, _ := goR.Read(b[:])
	goR.Close()
	if n != 1 || len(args) < 2 {
		return exitFailure
	}
	// The keep-alive descriptor, if the wrapper passed one (fd 4), becomes
	// the command's fd 3 (not close-on-exec).
	if _, err := unix.FcntlInt(4, unix.F_GETFD, 0); err == nil {
		if unix.Dup2(4, 3) == nil {
			unix.Close(4)
		}
	}
	err := syscall.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "shmlocks exec: %s: %v\n", args[1], err)
	if errors.Is(err, syscall.ENOENT) {
		return 127
	}
	return 126
}
