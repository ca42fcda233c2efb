package table

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// Render writes a human-readable view of the table: the header (format,
// geometry, creation time, boot id), usage against the limits, every agent
// record (alive or dead, client id, how many requests it holds and waits
// for) and, per name, the held locks and then the pending requests in queue
// order, with how long each has been held or waiting ("-" when the table did
// not record the time: a lock granted at once, without queueing).
//
// Render never latches and never writes: it works on a read-only mapping
// (OpenReadOnly) and tolerates torn reads of a live table. Its output is a
// function of the mapped bytes, now, the liveness of the recorded processes
// and the running kernel's boot id only, so it is deterministic for a fixed
// file and now (the golden test pins liveness with SetLiveness). A memory
// fault on a file truncated underneath is returned as ErrCorrupt.
func (t *Table) Render(w io.Writer, now time.Time) error {
	var buf bytes.Buffer
	err := Guard(func() error { return t.render(&buf, now) })
	if _, werr := w.Write(buf.Bytes()); err == nil {
		err = werr
	}
	return err
}

// clientIDOf formats an agent nonce the way manager.ClientIDOf does (the
// table cannot import the manager).
func clientIDOf(nonce uint64) string { return strconv.FormatUint(nonce, 16) }

func (t *Table) render(buf *bytes.Buffer, now time.Time) error {
	g := t.Geometry()
	u := t.Usage()
	boot := t.BootID()

	tw := tabwriter.NewWriter(buf, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "format\t%s version %d, %d bytes\n", Magic, FormatVersion, t.Size())
	fmt.Fprintf(tw, "geometry\t%d names, %d requests, %d agents, names up to %d bytes (%d buckets)\n",
		g.MaxResources, g.MaxRequests, g.MaxAgents, g.MaxNameLen, t.l.buckets)
	fmt.Fprintf(tw, "fairness\t%s\n", t.fairnessText())
	created := t.Created()
	fmt.Fprintf(tw, "created\t%s (%s ago)\n", created.UTC().Format(time.RFC3339), RenderAge(now.Sub(created)))
	bootNote := "this boot"
	if boot != BootID() {
		bootNote = "not this boot: the file outlived a reboot"
	}
	fmt.Fprintf(tw, "boot id\t%s (%s)\n", hex.EncodeToString(boot[:]), bootNote)
	fmt.Fprintf(tw, "nonce\t%016x\n", t.Nonce())
	other := ""
	if u.Watching > 0 {
		other = fmt.Sprintf(", watching %d", u.Watching)
	}
	if u.Claimed > 0 {
		other += fmt.Sprintf(", claimed or stolen %d", u.Claimed)
	}
	fmt.Fprintf(tw, "usage\tnames %d/%d, requests %d/%d (held %d, waiting %d%s), agents %d/%d\n",
		u.Entries, g.MaxResources, u.Slots, g.MaxRequests, u.Held, u.Waiting, other, u.Agents, g.MaxAgents)
	fmt.Fprintf(tw, "counters\treaps %d, repairs %d\n", u.Reaps, u.Repairs)
	tw.Flush()

	held, pending, err := t.Snapshot(nil)
	if err != nil {
		return err
	}
	agents := t.Agents()
	type counts struct{ held, waiting int }
	perAgent := map[uint32]*counts{}
	alive := map[uint32]bool{}
	for _, a := range agents {
		perAgent[a.Index] = &counts{}
		alive[a.Index] = a.State == AgentAlive && Alive(Identity{PID: a.PID, Start: a.Start, Boot: a.Boot})
	}
	for _, li := range held {
		if c := perAgent[li.Agent]; c != nil {
			c.held++
		}
	}
	for _, li := range pending {
		if c := perAgent[li.Agent]; c != nil {
			c.waiting++
		}
	}

	fmt.Fprintf(buf, "\nagents: %d\n", len(agents))
	if len(agents) > 0 {
		tw = tabwriter.NewWriter(buf, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  INDEX\tPID\tSTATE\tCLIENT\tHELD\tWAITING\tREGISTERED")
		for _, a := range agents {
			state := "dead"
			switch {
			case a.State == AgentRegistering:
				state = "registering"
			case a.State != AgentAlive:
				state = fmt.Sprintf("invalid(%d)", a.State)
			case alive[a.Index]:
				state = "alive"
			}
			c := perAgent[a.Index]
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%d\t%d\t%s ago\n",
				a.Index, a.PID, state, clientIDOf(a.Nonce), c.held, c.waiting, RenderAge(now.Sub(a.Since)))
		}
		tw.Flush()
	}

	// Group by name: names sorted; held locks by token, pending in queue order
	// (the order Snapshot returns them in).
	type lockLine struct {
		li   LockInfo
		held bool
		kind string // "held", "waiting" or "watching"
	}
	byName := map[string][]lockLine{}
	for _, li := range held {
		byName[li.Name] = append(byName[li.Name], lockLine{li, true, "held"})
	}
	for _, li := range pending {
		byName[li.Name] = append(byName[li.Name], lockLine{li, false, "waiting"})
	}
	// Watchers after the requests (a watch takes no part in grants).
	for _, li := range t.watchInfos() {
		byName[li.Name] = append(byName[li.Name], lockLine{li, false, "watching"})
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(names) == 0 {
		fmt.Fprintf(buf, "\nlocks: none\n")
		return nil
	}
	fmt.Fprintf(buf, "\nlocks: %d names\n", len(names))
	tw = tabwriter.NewWriter(buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tSTATE\tMODE\tTOKEN\tPID\tCLIENT\tFOR")
	for _, n := range names {
		lines := byName[n]
		// Stable: pending keep their queue order, held sort by token ahead of
		// them, watchers (in slot order) come last.
		slices.SortStableFunc(lines, func(a, b lockLine) int {
			if aw, bw := a.kind == "watching", b.kind == "watching"; aw != bw {
				if aw {
					return 1
				}
				return -1
			}
			switch {
			case a.held && b.held:
				return cmp.Compare(a.li.Token, b.li.Token)
			case a.held:
				return -1
			case b.held:
				return 1
			}
			return 0
		})
		for i, l := range lines {
			li := l.li
			name := ""
			if i == 0 {
				name = strconv.Quote(n)
			}
			mode := "exclusive"
			switch li.Mode {
			case ModeExclusive:
			case ModeShared:
				mode = "shared"
			case ModeAny:
				if l.kind == "watching" {
					mode = "any"
					break
				}
				fallthrough
			default:
				mode = fmt.Sprintf("mode(%d)", li.Mode)
			}
			pid := strconv.Itoa(li.PID)
			if a, ok := alive[li.Agent]; !ok {
				pid += " (no agent)"
			} else if !a {
				pid += " (dead)"
			}
			state, tok := l.kind, "-"
			if l.held {
				tok = strconv.FormatUint(li.Token, 10)
				if li.Steal {
					tok += " (steal)"
				}
			}
			age := "-" // a grant made at once may not record its time
			if li.Since > 0 {
				age = RenderAge(now.Sub(time.Unix(0, li.Since)))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, state, mode, tok, pid, clientIDOf(li.Nonce), age)
		}
	}
	return tw.Flush()
}

// renderAge formats a duration for the dump: milliseconds below a second,
// tenths of a second below a minute, whole seconds above; negative ages (a
// clock step, or a torn read) print as "0s".
func RenderAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// watchInfos lists every watch (WATCHING slot) with its name, in slot
// order, reading without the latch (torn reads tolerated: a watch on an
// entry that is not live is skipped).
func (t *Table) watchInfos() []LockInfo {
	var out []LockInfo
	for s := uint32(0); s < uint32(t.l.MaxRequests); s++ {
		so := t.slotOff(s)
		sw := atomic.LoadUint64(t.u64(so + slWord))
		if wordState(sw) != SlotWatching {
			continue
		}
		e := atomic.LoadUint32(t.u32(so+slEntry)) - 1
		if e >= uint32(t.l.MaxResources) {
			continue
		}
		eo := t.entryOff(e)
		n := atomic.LoadUint32(t.u32(eo + enNameLen))
		if atomic.LoadUint32(t.u32(eo+enState)) == 0 || n > uint32(t.l.MaxNameLen) {
			continue
		}
		li := LockInfo{
			Name:  string(t.buf[eo+enName : eo+enName+uint64(n)]),
			Mode:  atomic.LoadUint32(t.u32(so + slMode)),
			Agent: wordAgent(sw),
			Slot:  s,
			Since: int64(atomic.LoadUint64(t.u64(so + slEnqueue))),
		}
		t.agentOf(&li)
		out = append(out, li)
	}
	return out
}
