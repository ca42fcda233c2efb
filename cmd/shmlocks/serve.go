package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/shmlocks/shmlocks/internal/tablemetrics"
	"github.com/shmlocks/shmlocks/table"
)

const serveAbout = `Serve the state of a whole lock table over HTTP for a Prometheus scraper
(the node-exporter pattern: no program that uses the table is changed).
GET /metrics answers in the Prometheus text format (version 0.0.4):

  shmlocks_table_up                       1 if the table could be read, else 0
  shmlocks_table_names, _names_idle, _names_limit
  shmlocks_table_requests{state="held"|"waiting"}
  shmlocks_table_request_slots, _request_slots_limit
  shmlocks_table_agents, _agents_dead, _agents_limit
  shmlocks_table_reaps_total, _repairs_total     (for the life of the file)
  shmlocks_table_longest_wait_seconds
  shmlocks_table_scrape_duration_seconds        (time taken to read the table)
  shmlocks_lock_holders{name,mode}, shmlocks_lock_waiting{name,mode}
  shmlocks_lock_longest_wait_seconds{name}, shmlocks_lock_longest_hold_seconds{name}

A lock name that is not valid UTF-8 (a label value must be) has each
invalid byte as U+FFFD in name and its exact bytes in a second label,
name_base64: names that differ are always different series.

The per-name series (--names, on by default) exist only for names held or
waited for at the scrape: at most the table's MaxResources (4096 by
default) names, a few series each. Turn them off with --names=false on a
table with many short-lived names.

The table is mapped read-only: a scrape never latches, writes or blocks a
holder. A missing table is served as shmlocks_table_up 0 and picked up when
it appears; a table file replaced by another is re-opened.

Listen on loopback unless the network is trusted: the lock names are
exported. SIGINT or SIGTERM stop the server (exit 0). Exit status: 64
usage error; 69 the address cannot be listened on (in use, not
allowed); 71 internal error.

%s`

const serveExamples = `  shmlocks serve --metrics 127.0.0.1:9756
  shmlocks serve --metrics 127.0.0.1:9756 --names=false --table /run/app/locks.tbl
  curl -s http://127.0.0.1:9756/metrics | grep shmlocks_lock_waiting`

func runServe(args []string, stdout, stderr io.Writer) int {
	f := newFlags("serve", "shmlocks serve --metrics ADDR [--table PATH] [--names=false]",
		fmt.Sprintf(serveAbout, tableHelp()), serveExamples, stdout, stderr)
	tbl := f.String("table", "", "table file (default: see 'Table location')")
	addr := f.String("metrics", "", "listen address of the metrics endpoint, e.g. 127.0.0.1:9756 (port 0: any free port)")
	names := f.Bool("names", true, "export the per-name series (name label)")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if f.NArg() > 0 {
		return f.usageError("unexpected argument %q", f.Arg(0))
	}
	if *addr == "" {
		return f.usageError("--metrics ADDR is required")
	}
	path := *tbl
	if path == "" {
		path = defaultTablePath()
	}
	ln, err := net.Listen("tcp", *addr)
	var bad *net.AddrError
	var dns *net.DNSError
	if errors.As(err, &bad) || errors.As(err, &dns) { // not an address: a usage error
		return f.usageError("--metrics %s: %v", *addr, errors.Unwrap(err))
	}
	if err != nil {
		return failf(stderr, "serve", exitUnavailable, "cannot listen on %s: %v", *addr, errors.Unwrap(err))
	}
	src := &tableSource{path: path}
	defer src.close()
	var lastErr string
	opts := tablemetrics.Options{Names: *names, OnError: func(err error) {
		// One line per change of error, not one per scrape.
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			fmt.Fprintf(stderr, "shmlocks serve: %s: %v\n", path, err)
		}
	}}
	metrics := tablemetrics.Handler(src.get, opts)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		// One scrape at a time: a scrape may re-open (and unmap) the table.
		src.mu.Lock()
		defer src.mu.Unlock()
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "shmlocks serve: table %s; metrics at /metrics\n", path)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stdout, "shmlocks serve: table %s; metrics on http://%s/metrics\n", path, ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return failf(stderr, "serve", exitOSErr, "%v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "shmlocks serve: shutdown: %v\n", err)
	}
	return exitOK
}

// tableSource is the table serve exports, mapped read-only on first use and
// re-mapped when the file at path is replaced. mu is held by the caller
// across a whole scrape (get and the reads of the mapping it returns).
type tableSource struct {
	path string
	mu   sync.Mutex
	t    *table.Table
	fi   os.FileInfo
}

func (s *tableSource) get() (*table.Table, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		s.close()
		return nil, err
	}
	if s.t != nil && os.SameFile(fi, s.fi) {
		return s.t, nil
	}
	s.close()
	t, err := table.OpenReadOnly(s.path)
	if err != nil {
		return nil, err
	}
	s.t, s.fi = t, fi
	return t, nil
}

func (s *tableSource) close() {
	if s.t != nil {
		s.t.Close()
		s.t, s.fi = nil, nil
	}
}
