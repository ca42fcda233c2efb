//go:build !linux || shmlocks_poll

package manager

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
	safetyScan = 100 * time.Millisecond
)

type doorbell struct {
	closed atomic.Bool
}

func newDoorbell(table, nonce uint64) (*doorbell, error) { return &doorbell{}, nil }

func (d *doorbell) ring(nonce uint64) {}
func (d *doorbell) close()            { d.closed.Store(true) }

func (m *Manager) bellLoop() {
	defer m.bg.Done()
	sleep := pollMin
	var lastBell, lastSteal uint32
	lastFull := time.Now()
	for !m.bell.closed.Load() {
		time.Sleep(sleep)
		if !m.enter() {
			return
		}
		// Guarded: a table file truncated under us must not SIGBUS the
		// process from this background loop (TestTruncatedUnderUs).
		err := table.Guard(func() error {
			bell, steal := atomic.LoadUint32(m.a.Bell()), atomic.LoadUint32(m.a.StealSeq())
			full := time.Since(lastFull) >= safetyScan
			if bell != lastBell || steal != lastSteal || full {
				lastBell, lastSteal = bell, steal
				m.scan(full)
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
			m.noteFault()
		}
		m.loops.Add(1)
		m.leave()
	}
}
