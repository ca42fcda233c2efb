//go:build !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly

package main

import "os"

// isTerminal: without a termios query here, never draw progress lines.
func isTerminal(*os.File) bool { return false }

// termSize: unknown here.
func termSize(*os.File) (cols, rows int, ok bool) { return 0, 0, false }

// keyMode: no termios here; the live view takes no keys (Ctrl-C quits).
func keyMode(*os.File) (restore func(), ok bool) { return func() {}, false }

// jobSignals: no job control here.
func jobSignals() (sigs <-chan os.Signal, stop func()) { return nil, func() {} }

// isSuspend: never (no job control here).
func isSuspend(os.Signal) bool { return false }

// suspendSelf: nothing (no job control here).
func suspendSelf() {}
