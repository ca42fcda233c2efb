//go:build linux && !shmlocks_poll

package wake

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shmlocks/shmlocks/table"
)

// The doorbell of an agent is a Linux abstract-namespace datagram socket
// named after the table's and the agent's nonces. Whoever grants a request
// to an agent with parked goroutines, or steals from it, sends it one byte;
// the agent's bell loop (a goroutine blocked in Go's netpoller, so no OS
// thread per waiter) then looks at its waiting requests and held locks.
// Lost or coalesced bytes are harmless: the loop re-reads the agent's bell
// and steal sequence words, and looks anyway every safetyScan.
const SafetyScan = 100 * time.Millisecond

// Bell is an agent's doorbell and its loop.
type Bell struct {
	conn   *net.UnixConn
	table  uint64
	mu     sync.Mutex
	addrs  map[uint64]*bellAddr
	closed atomic.Bool
	loops  atomic.Uint64 // bell-loop rounds done (tests wait for one after a change)
}

type bellAddr struct {
	raw unix.RawSockaddrUnix
	len uint32
}

func bellName(table, agent uint64) string { return fmt.Sprintf("shmlocks-%016x-%016x", table, agent) }

// NewBell opens the doorbell of the agent whose nonce is given, in the
// table whose nonce is table.
func NewBell(table, nonce uint64) (*Bell, error) {
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "@" + bellName(table, nonce), Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	if _, err := senderFD(); err != nil {
		conn.Close()
		return nil, err
	}
	return &Bell{conn: conn, table: table, addrs: map[uint64]*bellAddr{}}, nil
}

// One unbound datagram socket per process sends every doorbell byte. It is
// never closed, so a ring racing with a Close can never write to a reused
// descriptor number.
var sender struct {
	once sync.Once
	fd   int
	err  error
}

func senderFD() (int, error) {
	sender.once.Do(func() {
		sender.fd, sender.err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if sender.err != nil {
			sender.err = os.NewSyscallError("socket", sender.err)
		}
	})
	return sender.fd, sender.err
}

var one = []byte{1}

// Ring sends one byte to the agent whose nonce is given. Errors (the agent
// is gone, its buffer is full) are ignored: a full buffer already holds a
// wake-up, and a gone agent needs none.
func (d *Bell) Ring(nonce uint64) {
	if d.closed.Load() {
		return
	}
	d.mu.Lock()
	a := d.addrs[nonce]
	if a == nil {
		if len(d.addrs) > 4096 {
			clear(d.addrs)
		}
		a = &bellAddr{}
		a.raw.Family = unix.AF_UNIX
		name := bellName(d.table, nonce)
		// Abstract address: a leading NUL, then the name (no terminator).
		for i := 0; i < len(name); i++ {
			a.raw.Path[i+1] = int8(name[i])
		}
		a.len = uint32(2 + 1 + len(name))
		d.addrs[nonce] = a
	}
	d.mu.Unlock()
	unix.Syscall6(unix.SYS_SENDTO, uintptr(sender.fd), uintptr(unsafe.Pointer(&one[0])), 1,
		unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&a.raw)), uintptr(a.len))
}

// Close closes the doorbell; the loop returns.
func (d *Bell) Close() {
	d.closed.Store(true)
	d.conn.Close()
}

// Loops is the number of rounds the bell loop has done.
func (d *Bell) Loops() uint64 { return d.loops.Load() }

// Run is the bell loop: it waits for doorbell bytes and has h scan on each,
// and every SafetyScan. It returns once the bell is closed.
func (d *Bell) Run(h Host, _ *table.Agent) {
	buf := make([]byte, 64)
	for {
		d.conn.SetReadDeadline(time.Now().Add(SafetyScan))
		_, err := d.conn.Read(buf)
		if d.closed.Load() {
			return
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			time.Sleep(time.Millisecond)
		}
		if !h.Enter() {
			return
		}
		// Guarded: a table file truncated under us must not SIGBUS the
		// process from this background loop (TestTruncatedUnderUs).
		if table.Guard(func() error {
			h.Scan(err != nil)
			return nil
		}) != nil {
			h.NoteFault()
		}
		d.loops.Add(1)
		h.Leave()
	}
}
