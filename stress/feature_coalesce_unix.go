//go:build unix

package stress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/coalesce"
	"github.com/shmlocks/shmlocks/manager"
)

// The coalesce feature: callers of one key in several processes share one
// run of fn. The flight checker: fn publishes a leader record on the key's
// flight entry in the check region and looks for another live leader of the
// key (two at once is a violation; a killed leader's record is ignored, and
// the caller that leads after it must not overlap a live one), and keeps a
// non-atomic counter per key as the exclusive sections do. Every caller
// checks what it got: a whole result (length and checksum), of its own key,
// from a flight that did not end long before it arrived; or the leader's
// error, of its own key.
//
// Records of goroutine g: 0, while its fn leads.

// coalesceDo is the one call of the coalescing API.
func coalesceDo(ctx context.Context, m *manager.Manager, key string,
	fn func(ctx context.Context) ([]byte, error)) ([]byte, bool, error) {
	return coalesce.New(m).Do(ctx, key, fn)
}

// coalesceStore is where the outcomes of a table's flights are kept.
func coalesceStore(table string) string { return table + ".coalesce" }

// coalesceCheck runs the outcome store's own checker.
func coalesceCheck(m *manager.Manager) error { return coalesce.New(m).Check() }

const (
	flightMagic  = "SHMLSTRF"
	flightHeader = 48
	flightFail   = 0.05 // fraction of flights whose fn fails
	flightMaxLen = 2048 // payload bytes, at most
)

// flightResult builds fn's result: a header naming the key, the leader and
// fn's times, a checksum, and a payload derived from the leader and its seq.
func flightResult(key, slot, g int, seq uint64, start, end int64, n int) []byte {
	b := make([]byte, flightHeader+n)
	copy(b, flightMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], uint32(key))
	le.PutUint32(b[12:], uint32(slot))
	le.PutUint32(b[16:], uint32(g))
	le.PutUint64(b[24:], seq)
	le.PutUint64(b[32:], uint64(start))
	le.PutUint64(b[40:], uint64(end))
	rng := rand.New(rand.NewPCG(seq, uint64(slot)<<8|uint64(g)))
	for i := flightHeader; i < len(b); i++ {
		b[i] = byte(rng.Uint32())
	}
	le.PutUint32(b[20:], crc32.ChecksumIEEE(b))
	return b
}

// checkFlightResult returns what is wrong with a result received by a
// caller of key that arrived at arrive, or "".
func checkFlightResult(b []byte, key int, arrive int64, stale time.Duration) string {
	if len(b) < flightHeader || string(b[:8]) != flightMagic {
		return fmt.Sprintf("a result of %d bytes that is not a whole flight result", len(b))
	}
	le := binary.LittleEndian
	c := make([]byte, len(b))
	copy(c, b)
	sum := le.Uint32(c[20:])
	le.PutUint32(c[20:], 0)
	if crc32.ChecksumIEEE(c) != sum {
		return fmt.Sprintf("a partial or corrupt result (%d bytes, checksum mismatch)", len(b))
	}
	if k := int(le.Uint32(b[8:])); k != key {
		return fmt.Sprintf("the result of another key (%s)", nameOf(k))
	}
	if end := int64(le.Uint64(b[40:])); end < arrive-int64(stale) {
		return fmt.Sprintf("the result of a flight whose fn ended %v before the caller arrived", time.Duration(arrive-end).Round(time.Millisecond))
	}
	return ""
}

// flightError is fn's error when it fails on purpose.
type flightError struct {
	key int
	pid int
	seq uint64
}

func (e flightError) Error() string {
	return fmt.Sprintf("stress flight %s failed (leader pid %d seq %d)", nameOf(e.key), e.pid, e.seq)
}

// runCoalesce makes goroutine g's Coalesce calls until ctx ends or its ops
// are done.
func runCoalesce(ctx context.Context, wc *workerConfig, hold Hold, r *Region, c *Checker, be backend, g int, st *gstats) {
	m := be.(*shmBackend).m
	rng := rand.New(rand.NewPCG(wc.Seed, uint64(wc.Slot)<<20|uint64(g)))
	slot, pid := wc.Slot, c.pid
	var seq uint64
	for i := 0; wc.Ops == 0 || i < wc.Ops; i++ {
		if ctx.Err() != nil {
			break
		}
		key := rng.IntN(wc.Names)
		h := hold.Sample(rng)
		fail := rng.Float64() < flightFail
		n := rng.IntN(flightMaxLen + 1)
		seq++
		mySeq := seq
		fn := func(context.Context) ([]byte, error) {
			q := c.begin(want{rec: r.rec(g, 0), name: r.flight(key), mode: modeExclusive})
			q.End()
			q.Granted(0)
			q.Enter()
			start := mono()
			holdFor(h)
			q.Exit()
			q.Release()
			r.addStat(slot, slLed, 1)
			if fail {
				return nil, flightError{key: key, pid: pid, seq: mySeq}
			}
			return flightResult(key, slot, g, mySeq, start, mono(), n), nil
		}
		arrive := mono()
		res, shared, err := coalesceDo(ctx, m, nameOf(key), fn)
		r.addStat(slot, slOps, 1)
		switch {
		case err == nil:
			r.countGrant(slot, g, modeExclusive) // a result of the flight, run under its exclusive lock
			if shared {
				r.addStat(slot, slFollowed, 1)
			}
			if msg := checkFlightResult(res, key, arrive, wc.Stuck); msg != "" {
				c.violation(kindFlight, "Coalesce of %s (shared %v) returned %s", nameOf(key), shared, msg)
			}
		case errors.Is(err, manager.ErrAborted):
			r.addStat(slot, slAborted, 1)
		case strings.Contains(err.Error(), "stress flight "):
			r.countGrant(slot, g, modeExclusive) // a result of the flight, run under its exclusive lock
			if shared {
				r.addStat(slot, slFollowed, 1)
			}
			if !strings.Contains(err.Error(), "stress flight "+nameOf(key)+" ") {
				c.violation(kindFlight, "Coalesce of %s returned the error of another key's flight: %v", nameOf(key), err)
			}
		default:
			r.addStat(slot, slErrors, 1)
			st.addErr("Coalesce: " + err.Error())
		}
		if ctx.Err() != nil {
			break
		}
	}
}
