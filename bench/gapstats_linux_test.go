//go:build linux

package bench

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestGapStats checks the gap histogram of BenchmarkContention's
// SHMLOCKS_BENCH_GAPS knob: what recordGap records and what the summaries
// make of it.
func TestGapStats(t *testing.T) {
	words := make([]uint64, (ctlSize+7)/8) // 8-byte aligned, as the mapping is
	ctl := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), ctlSize)
	end := (*int64)(unsafe.Pointer(&ctl[ctlGapEnd]))
	who := ctlWord32(ctl, ctlGapWho)
	count := func() (n uint64, last uint64) {
		for i := 0; i < gapBuckets; i++ {
			n += atomic.LoadUint64(ctlWord64(ctl, ctlGaps+8*i))
		}
		return n, atomic.LoadUint64(ctlWord64(ctl, ctlGaps+8*(gapBuckets-1)))
	}

	recordGap(ctl, 1) // no section has ended yet
	n, _ := count()
	require.Zero(t, n)

	atomic.StoreInt64(end, time.Now().UnixNano())
	atomic.StoreUint32(who, 1)
	recordGap(ctl, 1) // our own section: a repeat, not a gap
	n, _ = count()
	require.Zero(t, n)

	atomic.StoreInt64(end, time.Now().Add(-time.Second).UnixNano())
	recordGap(ctl, 2) // a second-long gap lands in the stall bucket
	n, last := count()
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, last)
	require.GreaterOrEqual(t, atomic.LoadUint64(ctlWord64(ctl, ctlGaps+8*(2*gapBuckets-1))), uint64(time.Second))

	var r loopResult
	require.Zero(t, r.gapP50())
	require.Zero(t, r.gapMean())
	require.Zero(t, r.stallPct())
	r.gapCount[6], r.gapSum[6] = 3, 3*650 // three gaps of 650 ns
	r.gapCount[gapBuckets-1], r.gapSum[gapBuckets-1] = 1, 10_050
	require.Equal(t, 650.0, r.gapP50())
	require.Equal(t, 3000.0, r.gapMean())
	require.InDelta(t, 100*10_050.0/12_000, r.stallPct(), 1e-9)
	r.gapCount[gapBuckets-1] = 5 // now most gaps are stalls
	require.Equal(t, float64((gapBuckets-1)*100+50), r.gapP50())
}
