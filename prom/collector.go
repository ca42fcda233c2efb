package prom

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shmlocks/shmlocks/internal/inspect"
	"github.com/shmlocks/shmlocks/internal/tablemetrics"
	"github.com/shmlocks/shmlocks/manager"
)

// Options configure a Collector. nil means the zero Options.
type Options struct {
	// Names is an allow-list of lock names exported with a name label
	// (holders, waiting requests, longest wait and longest hold per name).
	// Empty: none.
	Names []string
	// ConstLabels are added to every metric (e.g. {"table": "orders"} when
	// a program registers Collectors of several tables).
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector of one Manager's statistics and its
// table's usage. It reads them at each scrape (Manager.Stats); it holds no
// state of its own and is safe for concurrent use.
type Collector struct {
	m       *manager.Manager
	counted bool // the Manager keeps statistics (OpenOptions.Stats)
	names   []string

	requests, wait, steals, lost, reaps, repairs, corrupt *prometheus.Desc

	tNames, tNamesLimit, tRequests, tSlots, tSlotsLimit *prometheus.Desc
	tAgents, tAgentsLimit, tReaps, tRepairs             *prometheus.Desc

	lHolders, lWaiting, lWait, lHold *prometheus.Desc
}

// NewCollector returns a Collector of m. The per-request metrics are
// described only if m was opened with OpenOptions.Stats (otherwise it
// counts nothing); the table usage always is. The Collector is not
// registered anywhere: register it on your registry.
func NewCollector(m *manager.Manager, opts *Options) (*Collector, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	st, err := m.Stats()
	if err != nil {
		return nil, err
	}
	for _, n := range o.Names {
		if !utf8.ValidString(n) {
			return nil, fmt.Errorf("prom: Options.Names: %q is not valid UTF-8 (a Prometheus label value must be): %w", n, manager.ErrNotSupported)
		}
	}
	c := &Collector{m: m, counted: st.Enabled, names: slices.Clone(o.Names)}
	slices.Sort(c.names)
	c.names = slices.Compact(c.names)
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, o.ConstLabels)
	}
	c.requests = d("shmlocks_requests_total", "Requests of this Manager by mode and outcome.", "mode", "outcome")
	c.wait = d("shmlocks_request_wait_seconds", "Time this Manager's granted requests spent queued (0 if granted at once).", "mode")
	c.steals = d("shmlocks_steals_total", "Steal requests of this Manager granted (stealer side).")
	c.lost = d("shmlocks_locks_lost_total", "Locks held by this Manager taken away by a steal or a reap (victim side).")
	c.reaps = d("shmlocks_reaps_total", "Dead agents reaped by this Manager.")
	c.repairs = d("shmlocks_repairs_total", "Bucket latches this Manager took over from dead owners (buckets rebuilt).")
	c.corrupt = d("shmlocks_corrupt_total", "Times this Manager met a corrupt or truncated table.")
	c.tNames = d("shmlocks_table_names", "Names held or waited for.")
	c.tNamesLimit = d("shmlocks_table_names_limit", "MaxResources: names that can be held or waited for at once.")
	c.tRequests = d("shmlocks_table_requests", "Requests by state: held locks and queued requests.", "state")
	c.tSlots = d("shmlocks_table_request_slots", "Request slots in use (a lock held by the fast path uses none).")
	c.tSlotsLimit = d("shmlocks_table_request_slots_limit", "MaxRequests: request slots, all agents together.")
	c.tAgents = d("shmlocks_table_agents", "Agent records in use (open Managers, all processes together).")
	c.tAgentsLimit = d("shmlocks_table_agents_limit", "MaxAgents: open Managers at once.")
	c.tReaps = d("shmlocks_table_reaps_total", "Dead agents reaped, for the life of the table file.")
	c.tRepairs = d("shmlocks_table_repairs_total", "Bucket latches taken over from dead owners (buckets rebuilt), for the life of the table file.")
	c.lHolders = d("shmlocks_lock_holders", "Holders of a lock name, by mode (allow-listed names only).", "name", "mode")
	c.lWaiting = d("shmlocks_lock_waiting", "Queued requests on a lock name, by mode (allow-listed names only).", "name", "mode")
	c.lWait = d("shmlocks_lock_longest_wait_seconds", "Age of the oldest queued request on a lock name (allow-listed names only).", "name")
	c.lHold = d("shmlocks_lock_longest_hold_seconds", "Hold time of the longest current holder of a lock name, granted at once or from the queue; 0 when nothing is held (allow-listed names only).", "name")
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c.counted {
		for _, d := range []*prometheus.Desc{c.requests, c.wait, c.steals, c.lost, c.reaps, c.repairs, c.corrupt} {
			ch <- d
		}
	}
	for _, d := range []*prometheus.Desc{c.tNames, c.tNamesLimit, c.tRequests, c.tSlots, c.tSlotsLimit,
		c.tAgents, c.tAgentsLimit, c.tReaps, c.tRepairs} {
		ch <- d
	}
	if len(c.names) > 0 {
		ch <- c.lHolders
		ch <- c.lWaiting
		ch <- c.lWait
		ch <- c.lHold
	}
}

var modes = [2]manager.Mode{manager.Exclusive, manager.Shared}

// Collect implements prometheus.Collector. A closed Manager yields no
// metrics; a table that cannot be read yields an invalid metric carrying
// the error (the registry reports it), after the counters.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.m.Stats()
	if errors.Is(err, manager.ErrClosed) {
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if c.counted {
		for mi, mode := range modes {
			for o := manager.Outcome(0); o < manager.NumOutcomes; o++ {
				counter(c.requests, st.Requests[mi][o], mode.String(), o.String())
			}
			h := st.Wait[mi]
			buckets := make(map[float64]uint64, len(h.Counts)-1)
			var cum uint64
			for i := range len(h.Counts) - 1 {
				cum += h.Counts[i]
				buckets[h.Bound(i).Seconds()] = cum
			}
			ch <- prometheus.MustNewConstHistogram(c.wait, h.Count, h.Sum.Seconds(), buckets, mode.String())
		}
		counter(c.steals, st.Steals)
		counter(c.lost, st.LocksLost)
		counter(c.reaps, st.Reaps)
		counter(c.repairs, st.Repairs)
		counter(c.corrupt, st.Corrupt)
	}
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.tNames, err)
		return
	}
	u, g := st.Usage, st.Geometry
	gauge(c.tNames, float64(u.Entries))
	gauge(c.tNamesLimit, float64(g.MaxResources))
	gauge(c.tRequests, float64(u.Held), "held")
	gauge(c.tRequests, float64(u.Waiting), "waiting")
	gauge(c.tSlots, float64(u.Slots))
	gauge(c.tSlotsLimit, float64(g.MaxRequests))
	gauge(c.tAgents, float64(u.Agents))
	gauge(c.tAgentsLimit, float64(g.MaxAgents))
	counter(c.tReaps, u.Reaps)
	counter(c.tRepairs, u.Repairs)
	if len(c.names) > 0 {
		c.collectNames(ch, gauge)
	}
}

// collectNames exports the allow-listed names' state, read from the table
// without latching (tablemetrics.Gather); a listed name that nobody holds
// or waits for is exported with zeros.
func (c *Collector) collectNames(ch chan<- prometheus.Metric, gauge func(*prometheus.Desc, float64, ...string)) {
	t, _ := inspect.Table(c.m)
	ts, err := tablemetrics.Gather(t, time.Now())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.lHolders, err)
		return
	}
	byName := make(map[string]*tablemetrics.Name, len(ts.Names))
	for i := range ts.Names {
		byName[ts.Names[i].Name] = &ts.Names[i]
	}
	for _, name := range c.names {
		var holders [2]int
		var n tablemetrics.Name
		if p := byName[name]; p != nil {
			n = *p
		}
		for _, h := range n.Holders {
			holders[min(h.Mode, 1)]++
		}
		for mi, mode := range modes {
			gauge(c.lHolders, float64(holders[mi]), name, mode.String())
		}
		gauge(c.lWaiting, float64(n.WaitingExclusive), name, manager.Exclusive.String())
		gauge(c.lWaiting, float64(n.WaitingShared), name, manager.Shared.String())
		gauge(c.lWait, n.LongestWait.Seconds(), name)
		gauge(c.lHold, n.LongestHold.Seconds(), name)
	}
}
