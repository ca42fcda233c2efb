//go:build unix && !linux

package bench

import "syscall"

func nsAttr() *syscall.SysProcAttr { return nil }
func canUnshare() bool             { return false }
