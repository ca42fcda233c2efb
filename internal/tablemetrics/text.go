package tablemetrics

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shmlocks/shmlocks/table"
)

// ContentType is the media type of Write's output.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Options select what Write exports.
type Options struct {
	// Names exports the per-name series (see Cardinality in the package doc).
	Names bool
	// OnError, if not nil, is told why Handler served shmlocks_table_up 0.
	OnError func(error)
}

// The metrics Write exports. Every name is prefixed with "shmlocks_".
const (
	mUp            = "shmlocks_table_up"
	mNames         = "shmlocks_table_names"
	mNamesIdle     = "shmlocks_table_names_idle"
	mNamesLimit    = "shmlocks_table_names_limit"
	mRequests      = "shmlocks_table_requests"
	mSlots         = "shmlocks_table_request_slots"
	mSlotsLimit    = "shmlocks_table_request_slots_limit"
	mAgents        = "shmlocks_table_agents"
	mAgentsDead    = "shmlocks_table_agents_dead"
	mAgentsLimit   = "shmlocks_table_agents_limit"
	mReaps         = "shmlocks_table_reaps_total"
	mRepairs       = "shmlocks_table_repairs_total"
	mLongestWait   = "shmlocks_table_longest_wait_seconds"
	mLockHolders   = "shmlocks_lock_holders"
	mLockWaiting   = "shmlocks_lock_waiting"
	mLockWait      = "shmlocks_lock_longest_wait_seconds"
	mLockHold      = "shmlocks_lock_longest_hold_seconds"
	mScrapeSeconds = "shmlocks_table_scrape_duration_seconds"
)

// Write writes st in the text exposition format, version 0.0.4. A nil st
// (the table could not be read) writes shmlocks_table_up 0 and nothing else.
func Write(w io.Writer, st *State, took time.Duration, opts Options) error {
	bw := bufio.NewWriter(w)
	e := &expo{w: bw}
	e.family(mUp, "gauge", "1 if the lock table could be read at this scrape, else 0.")
	if st == nil {
		e.sample(mUp, "", 0)
		return bw.Flush()
	}
	e.sample(mUp, "", 1)
	g, u := st.Geometry, st.Usage
	e.gauge(mNames, "Names held or waited for.", float64(u.Entries))
	e.gauge(mNamesIdle, "Name entries nobody holds or waits for, kept for reuse.", float64(u.Idle))
	e.gauge(mNamesLimit, "MaxResources: names that can be held or waited for at once.", float64(g.MaxResources))
	e.family(mRequests, "gauge", "Requests by state: held locks and queued requests.")
	e.sample(mRequests, `state="held"`, float64(u.Held))
	e.sample(mRequests, `state="waiting"`, float64(u.Waiting))
	e.gauge(mSlots, "Request slots in use (a lock held by the fast path uses none).", float64(u.Slots))
	e.gauge(mSlotsLimit, "MaxRequests: request slots, all agents together.", float64(g.MaxRequests))
	e.gauge(mAgents, "Agent records in use (open Managers, all processes together).", float64(st.Agents))
	e.gauge(mAgentsDead, "Agents whose process is gone and that nobody has reaped yet.", float64(st.Dead))
	e.gauge(mAgentsLimit, "MaxAgents: open Managers at once.", float64(g.MaxAgents))
	e.family(mReaps, "counter", "Dead agents reaped, for the life of the table file.")
	e.sample(mReaps, "", float64(u.Reaps))
	e.family(mRepairs, "counter", "Bucket latches taken over from dead owners (buckets rebuilt), for the life of the table file.")
	e.sample(mRepairs, "", float64(u.Repairs))
	e.gauge(mLongestWait, "Age of the oldest queued request of any name (0: none).", st.LongestWait().Seconds())
	e.gauge(mScrapeSeconds, "Time taken to read the table.", took.Seconds())
	if opts.Names {
		e.names(st.Names)
	}
	return bw.Flush()
}

// names writes the per-name series, one per name: labels (nameLabels)
// are lossless, so names that differ stay different series.
func (e *expo) names(names []Name) {
	type agg struct {
		holders [2]int
		waiting [2]int
		wait    time.Duration
		hold    time.Duration
		held    bool
	}
	byLabel := map[string]*agg{}
	var order []string
	for _, n := range names {
		lv := nameLabels(n.Name)
		a := byLabel[lv]
		if a == nil {
			a = &agg{}
			byLabel[lv] = a
			order = append(order, lv)
		}
		for _, h := range n.Holders {
			a.holders[min(h.Mode, 1)]++
		}
		a.held = a.held || len(n.Holders) > 0
		a.waiting[0] += n.WaitingExclusive
		a.waiting[1] += n.WaitingShared
		a.wait = max(a.wait, n.LongestWait)
		a.hold = max(a.hold, n.LongestHold)
	}
	modes := [2]string{"exclusive", "shared"}
	e.family(mLockHolders, "gauge", "Holders of a lock name, by mode.")
	for _, lv := range order {
		for m, c := range byLabel[lv].holders {
			if c > 0 {
				e.sample(mLockHolders, lv+`,mode="`+modes[m]+`"`, float64(c))
			}
		}
	}
	e.family(mLockWaiting, "gauge", "Queued requests on a lock name, by mode.")
	for _, lv := range order {
		for m, c := range byLabel[lv].waiting {
			if c > 0 {
				e.sample(mLockWaiting, lv+`,mode="`+modes[m]+`"`, float64(c))
			}
		}
	}
	e.family(mLockWait, "gauge", "Age of the oldest queued request on a lock name.")
	for _, lv := range order {
		if a := byLabel[lv]; a.waiting[0]+a.waiting[1] > 0 {
			e.sample(mLockWait, lv, a.wait.Seconds())
		}
	}
	e.family(mLockHold, "gauge", "Age of the oldest current grant on a lock name, granted at once or from the queue.")
	for _, lv := range order {
		if a := byLabel[lv]; a.held {
			e.sample(mLockHold, lv, a.hold.Seconds())
		}
	}
}

// expo writes the exposition lines.
type expo struct{ w *bufio.Writer }

func (e *expo) family(name, typ, help string) {
	fmt.Fprintf(e.w, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

func (e *expo) sample(name, labels string, v float64) {
	e.w.WriteString(name)
	if labels != "" {
		e.w.WriteString("{" + labels + "}")
	}
	e.w.WriteString(" " + strconv.FormatFloat(v, 'g', -1, 64) + "\n")
}

func (e *expo) gauge(name, help string, v float64) {
	e.family(name, "gauge", help)
	e.sample(name, "", v)
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

// nameLabels are the labels of a lock name: name="NAME", the name as a
// label value (escaped as the format requires). A label value must be
// valid UTF-8, which a lock name need not be: a name that is not has each
// invalid byte as U+FFFD in name, and its exact bytes in a second label,
// name_base64 (as dump --json's nameBase64). Two names that differ never
// share their labels: before, the invalid byte 0xff and the four
// characters \xff were written alike.
func nameLabels(name string) string {
	if utf8.ValidString(name) {
		return `name="` + labelValue(name) + `"`
	}
	return `name="` + labelValue(strings.ToValidUTF8(name, "\uFFFD")) + `",name_base64="` + base64.StdEncoding.EncodeToString([]byte(name)) + `"`
}

// labelValue is s, valid UTF-8, as an escaped label value: backslash,
// double quote and newline escaped as the format requires.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// Handler serves the metrics of the table open returns, opened afresh when
// open decides so (see shmlocks serve): each scrape gathers the state once.
// A table that cannot be opened or read is served as shmlocks_table_up 0.
func Handler(open func() (*table.Table, error), opts Options) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var st *State
		t, err := open()
		if err == nil {
			var s State
			if s, err = Gather(t, start); err == nil {
				st = &s
			}
		}
		if err != nil && opts.OnError != nil {
			opts.OnError(err)
		}
		w.Header().Set("Content-Type", ContentType)
		Write(w, st, time.Since(start), opts)
	})
}
