//go:build linux && cgo

package main

/*
void shmlocks_note_table(unsigned long long dev, unsigned long long ino);
*/
import "C"

import "syscall"

// noteTable tells the C side the file of a table this process opened: a
// child forked after the load closes its inherited descriptors of it
// (shim.c), so that it never keeps the parent's agent, and its locks,
// alive after the parent dies.
func noteTable(path string) {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) == nil {
		C.shmlocks_note_table(C.ulonglong(st.Dev), C.ulonglong(st.Ino))
	}
}
