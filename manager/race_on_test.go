//go:build race

package manager

const raceEnabled = true
