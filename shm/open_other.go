//go:build !unix

package shm

import "os"

// openFlags: there is no O_NOFOLLOW here; symlinks are refused through Lstat
// and an os.SameFile check between the Lstat and the opened file.
const openFlags = 0

// renameFile would give f the name path; not needed where the creator reopens
// the published file by path (Windows), and harmless to skip elsewhere.
func renameFile(f *os.File, name string) *os.File { return f }

func dupFD(f *os.File) int { return -1 }
func closeFD(fd int)       {}
