//go:build !unix

package manager

import "fmt"

// groupLeader: there are no process groups on this system.
func groupLeader(int) error {
	return fmt.Errorf("%w: no process groups on this system", ErrNotSupported)
}
