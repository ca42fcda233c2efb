// Package prom exports a shmlocks Manager's statistics to Prometheus: a
// Collector that a program registers on its own registry. It lives in a
// nested module (github.com/shmlocks/shmlocks/prom) so that users of the
// core module who do not want the Prometheus client library do not pull it
// in; the core module keeps a dependency-free stats API (manager.Stats), and
// the table-wide exporter of `shmlocks serve --metrics` writes the text
// format by hand (package tablemetrics).
//
// Nothing here registers anything by itself:
//
//	m, _ := manager.Open(path, &manager.OpenOptions{Stats: true})
//	c, _ := prom.NewCollector(m, nil)
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(c)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// # Metrics
//
// Counted by this Manager (present when it was opened with
// OpenOptions.Stats):
//
//	shmlocks_requests_total{mode,outcome}     counter    requests by mode and outcome (granted, not_available, aborted, stolen, failed)
//	shmlocks_request_wait_seconds{mode}       histogram  time granted requests spent queued (0 if granted at once); buckets 1 µs × 4^k up to ~67 s
//	shmlocks_steals_total                     counter    Steal requests granted (stealer side)
//	shmlocks_locks_lost_total                 counter    held locks taken away by a steal or a reap (victim side)
//	shmlocks_reaps_total                      counter    dead agents reaped by this Manager
//	shmlocks_repairs_total                    counter    bucket latches taken over from dead owners by this Manager
//	shmlocks_corrupt_total                    counter    times this Manager met a corrupt or truncated table
//
// Of the whole table (always; the same names `shmlocks serve --metrics`
// uses):
//
//	shmlocks_table_names, shmlocks_table_names_limit
//	shmlocks_table_requests{state="held"|"waiting"}
//	shmlocks_table_request_slots, shmlocks_table_request_slots_limit
//	shmlocks_table_agents, shmlocks_table_agents_limit
//	shmlocks_table_reaps_total, shmlocks_table_repairs_total   (for the life of the file)
//
// No metric has a lock-name label unless Options.Names lists the name
// (cardinality): then shmlocks_lock_holders{name,mode},
// shmlocks_lock_waiting{name,mode}, shmlocks_lock_longest_wait_seconds{name}
// and shmlocks_lock_longest_hold_seconds{name} (every holder's time is
// known, those granted at once included; 0 only when nothing is held) are
// exported for those names, read from the table at each scrape.
package prom
