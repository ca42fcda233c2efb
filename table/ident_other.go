//go:build !linux

package table

import "os"

// Outside Linux there is no boot id and no portable process start time:
// identity relies on the PID alone (a documented limitation of the
// fallback: a recycled PID looks alive, and so does a zombie).

// BootID is not known on this system.
func BootID() [16]byte { return [16]byte{} }

func bootHash([16]byte) uint64 { return 1 }

func readSelfIdentity() Identity { return Identity{PID: os.Getpid(), Boot: 1} }

// ProcessStart is not known on this system.
func ProcessStart(int) uint64 { return 0 }
