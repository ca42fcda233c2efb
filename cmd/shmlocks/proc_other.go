//go:build !linux

package main

// procCommand: no /proc here; the command column shows "-".
func procCommand(int) string { return "" }

// procCmdline: no /proc here.
func procCmdline(int) string { return "" }

// groupMember: without /proc the group's id stands for its leader.
func groupMember(pgid int) int { return pgid }
