//go:build linux

package main

import "golang.org/x/sys/unix"

// The ioctls that read and set a terminal's settings (tty_unix.go).
const (
	getTermios = unix.TCGETS
	setTermios = unix.TCSETS
)
