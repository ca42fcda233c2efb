package table

// haveRDTSC: this architecture has a time-stamp counter (tscClock).
const haveRDTSC = true

// rdtsc reads the CPU's time-stamp counter (tsc_amd64.s). It is not a
// serialising read: the clock it feeds is for timestamps and rate limits,
// where a few cycles of reordering do not matter.
func rdtsc() uint64
