//go:build !linux

package main

// procCommand: no /proc here; the command column shows "-".
func procCommand(int) string { return "" }
