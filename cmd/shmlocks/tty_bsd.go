//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package main

import "golang.org/x/sys/unix"

// The ioctls that read and set a terminal's settings (tty_unix.go).
const (
	getTermios = unix.TIOCGETA
	setTermios = unix.TIOCSETA
)
