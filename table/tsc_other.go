//go:build !amd64

package table

// haveRDTSC: no time-stamp counter is read on this architecture; MonoNow is
// time.Since(origin) (tscClock stays off).
const haveRDTSC = false

func rdtsc() uint64 { return 0 }
