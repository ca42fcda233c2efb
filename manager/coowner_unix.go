//go:build unix

package manager

import (
	"fmt"
	"syscall"
)

// groupLeader checks that pid pgid runs and leads its own process group.
func groupLeader(pgid int) error {
	if pgid < 2 {
		return fmt.Errorf("%w: not a process group of its own", ErrNotSupported)
	}
	g, err := syscall.Getpgid(pgid)
	if err != nil {
		return fmt.Errorf("%w: no such process (%v)", ErrNotSupported, err)
	}
	if g != pgid {
		return fmt.Errorf("%w: process %d is in group %d, not the leader of its own", ErrNotSupported, pgid, g)
	}
	return nil
}
