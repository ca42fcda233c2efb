package table

import "os"

// Stat describes the file the table was opened from (its owner, mode), not
// whatever its path names now.
func (t *Table) Stat() (os.FileInfo, error) { return t.m.File().Stat() }
