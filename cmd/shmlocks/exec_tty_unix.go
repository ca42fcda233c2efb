//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// A command run on a terminal is the terminal's foreground job, as a shell
// would make it: Ctrl-C, Ctrl-Z and reads from the terminal reach it. The
// command's group is put in the foreground by the child itself before it
// runs anything (SysProcAttr.Foreground); this process takes the terminal
// back when the command stops or exits, and gives it again when it is
// continued in the foreground.

// openTTY opens this process's controlling terminal (nil: none).
func openTTY() *os.File {
	f, err := os.OpenFile("/dev/tty", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil
	}
	return f
}

// foregroundOf returns the foreground process group of tty (-1: unknown).
func foregroundOf(tty *os.File) int {
	pg, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	if err != nil {
		return -1
	}
	return pg
}

// setForeground makes pgid tty's foreground group. A process outside the
// foreground must ignore SIGTTOU to do that (else the kernel stops it): it
// is ignored for the call, and relayed to sigs again after it (nil: it was
// not relayed).
func setForeground(tty *os.File, pgid int, sigs chan<- os.Signal) {
	signal.Ignore(syscall.SIGTTOU)
	unix.IoctlSetPointerInt(int(tty.Fd()), unix.TIOCSPGRP, pgid)
	if sigs != nil {
		signal.Notify(sigs, syscall.SIGTTOU)
	} else {
		signal.Reset(syscall.SIGTTOU)
	}
}
