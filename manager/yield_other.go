//go:build !linux

package manager

import "runtime"

// cpuYield yields the processor (Go's scheduler only, on this system).
func cpuYield() { runtime.Gosched() }

// cpusAllowed is the number of CPUs this process may run on.
func cpusAllowed() int { return runtime.NumCPU() }
