//go:build shmlocks_poll

package main

// The binary under test uses the polling fallback too.
func init() { buildFlags = append(buildFlags, "-tags", "shmlocks_poll") }
