//go:build !linux

package shm

import "os"

// preallocate is a no-op here; the file stays as sized by Truncate.
func preallocate(f *os.File, size int64) error { return nil }
