//go:build linux

// Command goagent is the Go test agent of the cross-language tests: it takes
// locks of the table $SHMLOCKS_TABLE through package manager on command,
// in the line protocol of python/tests/agent.py (which documents it).
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

func main() {
	deadline := 60.0
	if s := os.Getenv("AGENT_DEADLINE"); s != "" {
		deadline, _ = strconv.ParseFloat(s, 64)
	}
	time.AfterFunc(time.Duration(deadline*float64(time.Second)), func() { os.Exit(3) })
	m, err := manager.Open(os.Getenv("SHMLOCKS_TABLE"), nil)
	if err != nil {
		fmt.Println("error open", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	var latest *manager.Lock
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "acquire":
			var opts manager.RequestOptions
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			for _, a := range f[2:] {
				switch {
				case a == "shared":
					opts.Mode = manager.Shared
				case a == "ifavail":
					opts.IfAvailable = true
				case a == "steal":
					opts.Steal = true
				case strings.HasPrefix(a, "timeout="):
					ms, _ := strconv.Atoi(a[len("timeout="):])
					ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
				}
			}
			l, err := m.Acquire(ctx, f[1], opts)
			cancel()
			if err != nil {
				fmt.Println("error", codeName(err), err)
				continue
			}
			latest = l
			fmt.Println("acquired", l.Token())
		case "release":
			if err := latest.Release(); err != nil {
				fmt.Println("error", codeName(err), err)
				continue
			}
			fmt.Println("released")
		case "waitlost":
			ms, _ := strconv.Atoi(f[1])
			select {
			case <-latest.Lost():
				fmt.Println("lost")
			case <-time.After(time.Duration(ms) * time.Millisecond):
				fmt.Println("notlost")
			}
		case "chaos":
			chaos(m, f[1], f[2], f[3])
		case "exit":
			os.Exit(0)
		default:
			fmt.Println("error usage unknown command", f[0])
		}
	}
}

// chaos takes name over and over; see python/tests/agent.py.
func chaos(m *manager.Manager, name, occ, log string) {
	occF, err := os.OpenFile(occ, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		panic(err)
	}
	logF, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		panic(err)
	}
	pid, fd := os.Getpid(), int(occF.Fd())
	for {
		l, err := m.Acquire(context.Background(), name, manager.RequestOptions{})
		if err != nil {
			panic(err)
		}
		if holder := occupy(fd); holder != 0 {
			fmt.Fprintf(logF, "blocked %d %d %d\n", l.Token(), pid, holder)
			lk := syscall.Flock_t{Type: syscall.F_WRLCK}
			if err := syscall.FcntlFlock(uintptr(fd), syscall.F_SETLKW, &lk); err != nil {
				panic(err)
			}
		}
		fmt.Fprintf(logF, "enter %d %d\n", l.Token(), pid)
		for i := rand.IntN(4); i > 0; i-- {
			time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
			fmt.Fprintf(logF, "mid %d %d\n", l.Token(), pid)
		}
		fmt.Fprintf(logF, "exit %d %d\n", l.Token(), pid)
		un := syscall.Flock_t{Type: syscall.F_UNLCK}
		syscall.FcntlFlock(uintptr(fd), syscall.F_SETLK, &un)
		l.Release()
	}
}

// occupy takes a POSIX record lock on fd without waiting: 0 if taken, else
// the pid of the process that holds it (F_GETLK).
func occupy(fd int) int {
	for {
		lk := syscall.Flock_t{Type: syscall.F_WRLCK}
		if syscall.FcntlFlock(uintptr(fd), syscall.F_SETLK, &lk) == nil {
			return 0
		}
		q := syscall.Flock_t{Type: syscall.F_WRLCK}
		if err := syscall.FcntlFlock(uintptr(fd), syscall.F_GETLK, &q); err != nil {
			panic(err)
		}
		if q.Type != syscall.F_UNLCK {
			return int(q.Pid)
		}
	}
}

// codeName is the C error code name of a manager error (as the other agents print).
func codeName(err error) string {
	for _, c := range []struct {
		target error
		name   string
	}{
		{context.DeadlineExceeded, "SHMLOCKS_ERR_TIMEOUT"}, {manager.ErrAborted, "SHMLOCKS_ERR_ABORTED"},
		{manager.ErrNotAvailable, "SHMLOCKS_ERR_NOT_AVAILABLE"}, {manager.ErrStolen, "SHMLOCKS_ERR_STOLEN"},
		{manager.ErrClosed, "SHMLOCKS_ERR_CLOSED"}, {manager.ErrNotSupported, "SHMLOCKS_ERR_NOT_SUPPORTED"},
		{manager.ErrReleased, "SHMLOCKS_ERR_BAD_HANDLE"},
	} {
		if errors.Is(err, c.target) {
			return c.name
		}
	}
	return "SHMLOCKS_ERR_INTERNAL"
}
