//go:build race

package main

// The binary under test is built with the race detector too.
func init() { buildFlags = append(buildFlags, "-race") }
