package manager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWaitBucket(t *testing.T) {
	require.Equal(t, 14, len(waitBounds))
	require.Equal(t, time.Microsecond, waitBounds[0])
	require.Greater(t, waitBounds[len(waitBounds)-1], 60*time.Second, "tens of seconds")
	cases := []struct {
		d    time.Duration
		want int
	}{{0, 0}, {1, 0}, {time.Microsecond, 0}, {time.Microsecond + 1, 1}, {4 * time.Microsecond, 1},
		{4*time.Microsecond + 1, 2}, {time.Hour, len(waitBounds)}}
	for i, b := range waitBounds {
		cases = append(cases, struct {
			d    time.Duration
			want int
		}{b, i}, struct {
			d    time.Duration
			want int
		}{b + 1, i + 1})
	}
	for _, c := range cases {
		require.Equal(t, c.want, waitBucket(int64(c.d)), "wait %v", c.d)
	}
}

func TestOutcomeOf(t *testing.T) {
	for err, want := range map[error]Outcome{
		nil: OutcomeGranted,
		fmt.Errorf("lock %q: %w", "x", ErrNotAvailable):                  OutcomeNotAvailable,
		fmt.Errorf("%w: lock %q: %w", ErrAborted, "x", context.Canceled): OutcomeAborted,
		fmt.Errorf("lock %q: %w", "x", ErrStolen):                        OutcomeStolen,
		ErrClosed:    OutcomeFailed,
		ErrTableFull: OutcomeFailed,
		ErrCorrupt:   OutcomeFailed,
	} {
		require.Equal(t, want, outcomeOf(err), "%v", err)
	}
	for o := Outcome(0); o < NumOutcomes; o++ {
		require.NotEqual(t, "unknown", o.String())
	}
}

// Every outcome of every entry point is counted by mode, and a grant after
// a wait lands in the histogram's bucket of its length.
