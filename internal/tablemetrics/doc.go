// Package tablemetrics summarises the state of a whole lock table (every
// agent's held locks and queues, usage against the limits, the table-wide
// reap and repair counters) and writes it in the Prometheus text exposition
// format, version 0.0.4, without any dependency beyond the standard library:
// `shmlocks serve --metrics` exports a table this way (the node-exporter
// pattern: no program that uses the table is changed), and `shmlocks dump
// --watch` draws the same summary as a live view.
//
// The table is read through a read-only mapping (table.OpenReadOnly): never
// latched, never written, so a scrape never blocks a holder; a live table may
// be caught mid-update, and what cannot be parsed is skipped.
//
// # Cardinality
//
// The per-name series (label name="...") exist only for names that are held
// or waited for at the scrape: at most MaxResources of them (the table's
// geometry, 4096 by default), each with at most three series per metric
// (mode exclusive and shared for holders). Options.Names false leaves them
// out. A name that is not valid UTF-8 is exported with each invalid byte
// written as \xHH; two names that map to the same label value are summed
// into one series.
//
// The per-Manager metrics (requests by outcome, wait-time histograms) live in
// the nested module github.com/shmlocks/shmlocks/prom, which depends on the
// Prometheus client library; this package does not.
package tablemetrics
