//go:build unix && !linux

package bench

import (
	"syscall"
	"time"
)

func nsAttr() *syscall.SysProcAttr { return nil }
func canUnshare() bool             { return false }

func monoNow() int64 { return time.Now().UnixNano() }
