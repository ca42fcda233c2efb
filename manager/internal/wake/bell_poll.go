//go:build !linux || shmlocks_poll

package wake

import (
	"sync/atomic"
	"time"

	"github.com/shmlocks/shmlocks/table"
)

// Without Linux abstract sockets (or with the shmlocks_poll build tag) the
// doorbell is polled: the bell loop re-reads the agent's bell and steal
// sequence words, sleeping between looks from pollMin doubling to pollMax
// while nothing changes (so a grant is noticed within pollMax).
const (
	pollMin    = 50 * time.Microsecond
	pollMax    = 2 * time.Millisecond
	SafetyScan = 100 * time.Millisecond
)

// Bell is an agent's doorbell (polled here) and its loop.
type Bell struct {
	closed atomic.Bool
	loops  atomic.Uint64
}

// NewBell opens the doorbell of an agent.
func NewBell(table, nonce uint64) (*Bell, error) { return &Bell{}, nil }

// Ring: the polled doorbell needs no byte (the loop reads the bell word).
func (d *Bell) Ring(nonce uint64) {}

// Close ends the loop.
func (d *Bell) Close() { d.closed.Store(true) }

// Loops is the number of rounds the bell loop has done.
func (d *Bell) Loops() uint64 { return d.loops.Load() }

// Run is the bell loop: it has h scan when agent a's bell or steal words
// change, and every SafetyScan.
func (d *Bell) Run(h Host, a *table.Agent) {
	sleep := pollMin
	var lastBell, lastSteal uint32
	lastFull := time.Now()
	for !d.closed.Load() {
		time.Sleep(sleep)
		if !h.Enter() {
			return
		}
		// Guarded: a table file truncated under us must not SIGBUS the
		// process from this background loop (TestTruncatedUnderUs).
		err := table.Guard(func() error {
			bell, steal := atomic.LoadUint32(a.Bell()), atomic.LoadUint32(a.StealSeq())
			full := time.Since(lastFull) >= SafetyScan
			if bell != lastBell || steal != lastSteal || full {
				lastBell, lastSteal = bell, steal
				h.Scan(full)
				if full {
					lastFull = time.Now()
				}
				sleep = pollMin
			} else if sleep < pollMax {
				sleep *= 2
			}
			return nil
		})
		if err != nil {
			sleep = pollMax
			h.NoteFault()
		}
		d.loops.Add(1)
		h.Leave()
	}
}
