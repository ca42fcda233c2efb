//go:build !linux

package manager

import "runtime"

// osYield yields the processor (Go's scheduler only, on this system).
func osYield(int) { runtime.Gosched() }
