//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), getTermios)
	return err == nil
}

// termSize returns f's terminal size in columns and rows.
func termSize(f *os.File) (cols, rows int, ok bool) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 || ws.Row == 0 {
		return 0, 0, false
	}
	return int(ws.Col), int(ws.Row), true
}

// keyMode puts terminal f in cbreak mode for the live view's keys: input
// is not echoed and each key is read as it is typed (no line editing),
// and a read returns after at most 0.1 s without a key (so the reader can
// stop); signals (Ctrl-C) still work. restore puts back the settings it
// found. ok false: f is not a terminal (nothing changed).
func keyMode(f *os.File) (restore func(), ok bool) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, getTermios)
	if err != nil {
		return func() {}, false
	}
	t := *old
	t.Lflag &^= unix.ICANON | unix.ECHO
	t.Cc[unix.VMIN] = 0
	t.Cc[unix.VTIME] = 1
	if err := unix.IoctlSetTermios(fd, setTermios, &t); err != nil {
		return func() {}, false
	}
	return func() { unix.IoctlSetTermios(fd, setTermios, old) }, true
}

// jobSignals delivers the job-control signals the live view handles
// itself: SIGTSTP (Ctrl-Z: leave the terminal as it was found, then stop)
// and SIGCONT (fg or bg: take the screen again). stop ends the delivery.
func jobSignals() (sigs <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 4)
	signal.Notify(c, syscall.SIGTSTP, syscall.SIGCONT)
	return c, func() { signal.Stop(c) }
}

// isSuspend reports whether s asks the view to stop (SIGTSTP).
func isSuspend(s os.Signal) bool { return s == syscall.SIGTSTP }

// suspendSelf stops this process as a Ctrl-Z would have, until a SIGCONT.
// It sends SIGSTOP: a SIGTSTP's stop, once the view has handled the
// signal, is dropped by the kernel in an orphaned process group.
func suspendSelf() { syscall.Kill(os.Getpid(), syscall.SIGSTOP) }
