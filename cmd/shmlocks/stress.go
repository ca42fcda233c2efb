package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/stress"
)

const stressAbout = `Start worker processes (this binary, re-executed) that hammer lock names
through the manager package (or flock(2)), and check the lock with
independent checkers that share a separate memory-mapped file next to the
table (not the lock code):

  - occupancy: every grant publishes its hold and looks for conflicting
    holders (two exclusive, or exclusive and shared, at once);
  - a non-atomic per-name counter, read at the start of every exclusive
    section and written at its end: it must not change in between, and its
    final value must equal the exclusive grants (it may fall short by at most
    kills + workers that died + steals: a killed holder may die before
    writing, a stolen-from holder preempted between its fence check and its
    write may overwrite);
  - fencing tokens strictly increase per name (exclusive grants above every
    earlier token, shared grants above every earlier exclusive one);
  - a lock lost at release must have been stolen (a later steal recorded);
  - watchdog: no request waits longer than --stuck on a name no live process
    holds and on which nothing happened for --stuck, and none waits --stuck
    past its deadline;
  - at the end the table's own checker runs and the table must be empty
    (every dead worker reaped).

Each worker process runs one feature (--features; every one by default
with --chaos, else plain): plain (Acquire/Release of one name), exec
(shmlocks exec wrappers whose command, this binary again, checks in as the
holder while it runs), child (a Request whose fn fans out and nests child
requests with its ctx: children of one grant must exclude each other),
coalesce (Coalesce callers: one leader per key at once, whole results of
their own key) and all (AcquireAll/RequestAll of two or three names, each
name checked). --chaos SIGKILLs the feature killed least so far, where it
is most fragile: a holder, a process inside a child grant, a Coalesce
leader, an AcquireAll holder, or an exec command's wrapper, the command
itself or the wrapper's process group. The report counts kills per feature
and violations per kind (exclusion, exec, child, flight, counter, token,
lost, stuck, table, failure).

Holders in processes killed by --chaos are ignored (the supervisor marks a
victim before it sends SIGKILL), and so are those of processes that are
dead (an exec command is checked under its own pid: killing its wrapper
does not end its hold); conflicts with a stolen-from holder are excused.
FIFO order is only sampled (waiters that took a ticket well before a grant
and still wait): the ticket is taken before the request enters the lock, so
this is a statistic, not a check.

Any violation: the messages are printed, the table and check file are kept
(their path is printed) and the exit status is 1. SHMLOCKS_FAULT=break-exclusion
in the environment makes every worker break the lock's exclusion on purpose
(the checkers must then report violations).

The report counts each request once, by its outcome (granted and
released, granted then stolen, not available, timed out, errors: they add
up to "requests"), and says under it what each counter counts. --json
prints {"violations": N, "runs": [one report per backend]} whatever the
number of backends (docs/cli.md). Progress goes to standard error: on a
terminal a line redrawn in place, otherwise a line every --progress.

The run uses a fresh table in a temporary directory (not the default table
location below), removed afterwards unless --keep or a violation. --table uses the given file instead (it must
not be in use by anyone else: the final check expects it empty).

` + "%s"

const stressExamples = `  shmlocks stress
  shmlocks stress --duration 3s --procs 4
  shmlocks stress --chaos 5 --duration 3s --json
  shmlocks stress --chaos 50 --duration 240s --procs 10 --seed 1   # about 10,000 kills over every feature
  shmlocks stress --features exec,plain --chaos 10 --duration 10s
  shmlocks stress --procs 8 --goroutines 4 --names 2 --shared 0.5 --hold uniform:0-200us
  shmlocks stress --backend shmlocks,flock --duration 2s
  shmlocks stress --fairness bounded:1ms --chaos 5 --duration 3s
  shmlocks stress --ops 10000 --seed 42 --keep
  SHMLOCKS_FAULT=break-exclusion shmlocks stress --duration 1s   # must fail`

// runStress runs the stress command, or a stress worker when this process
// was started as one.
func runStress(args []string, stdout, stderr io.Writer) int {
	if stress.IsWorker() {
		return stress.WorkerMain(stdout, stderr)
	}
	fs := newFlags("stress", "shmlocks stress [flags]", fmt.Sprintf(stressAbout, tableHelp()), stressExamples, stdout, stderr)
	var cfg stress.Config
	fs.IntVar(&cfg.Procs, "procs", 4, "worker processes")
	fs.IntVar(&cfg.Goroutines, "goroutines", 2, "requesting goroutines per process")
	fs.IntVar(&cfg.Names, "names", 4, "lock names (stress-0, stress-1, ...)")
	fs.Var(newDuration(&cfg.Duration, 0), "duration", "run length, more than 0 (default 5s unless --ops)")
	fs.IntVar(&cfg.Ops, "ops", 0, "requests per goroutine instead of a duration (0: none)")
	fs.Float64Var(&cfg.Shared, "shared", 0.3, "fraction of requests in shared mode")
	fs.Float64Var(&cfg.IfAvailable, "if-available", 0.1, "fraction of requests made with IfAvailable")
	fs.Float64Var(&cfg.Steal, "steal", 0.01, "fraction of exclusive waiting requests made with Steal (shmlocks only)")
	fs.Float64Var(&cfg.Timeout, "timeout", 0.1, "fraction of waiting requests given a deadline")
	fs.Var(newDuration(&cfg.Deadline, 0), "deadline", "the deadline of those requests (default 5ms)")
	hold := fs.String("hold", "exp:50us", "hold time: fixed:DUR, exp:MEAN, uniform:MIN-MAX or none (busy below 1ms, asleep above)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed (0: pick one; the report prints it)")
	fs.StringVar(&cfg.Table, "table", "", "table file (default: a fresh file in a temporary directory; \"default\": the default table location below)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the temporary table and check file")
	fs.BoolVar(&cfg.HandOver, "handover", false, "shmlocks workers open with OpenOptions.HandOver (a release yields the P to the sibling it granted; off by default)")
	fs.StringVar(&cfg.Fairness, "fairness", "fifo", "the table's fairness when this run creates it: fifo, or bounded:DURATION (a request may take a free name ahead of the queue while its oldest has waited less than DURATION; e.g. bounded:1ms)")
	fs.BoolVar(&cfg.KillEach, "kill-each", false, "with --chaos: go on after --duration until every feature has been killed at least once (at most a minute more)")
	fs.BoolVar(&cfg.Namespaces, "namespaces", false, "start every other worker process (exec's excepted) in new PID, network and mount namespaces of its own, as containers sharing the table (Linux, as root)")
	fs.Float64Var(&cfg.Chaos, "chaos", 0, "SIGKILL this many processes per second, each time of the feature killed least so far (a killed worker is replaced at once)")
	features := fs.String("features", "", "what the worker processes do, one feature per process in turn: plain, exec, child, coalesce, all (AcquireAll), or every (default: every with --chaos on shmlocks, else plain)")
	backends := fs.String("backend", "shmlocks", "shmlocks, flock, or both comma-separated (run one after the other, reported side by side)")
	fs.Var(newDuration(&cfg.Stuck, 0), "stuck", "a waiter blocked this long on a free, quiet name is a violation (default 2s)")
	fs.Var(newDuration(&cfg.MaxGrantGap, 0), "max-gap", "no grant anywhere for this long is a violation (0: not checked)")
	asJSON := fs.Bool("json", false, "print the report as JSON: {\"violations\": N, \"runs\": [one report per backend]}")
	progressEvery := new(time.Duration)
	fs.Var(newDuration(progressEvery, 5*time.Second), "progress", "when standard error is not a terminal, a progress line every this often (0: none); on a terminal one line redrawn in place")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return fs.usageError("unexpected argument %q", fs.Arg(0))
	}
	// Zero means "default" to stress.Config; on the command line it is an error.
	for _, v := range []struct {
		name string
		n    int
	}{{"--procs", cfg.Procs}, {"--goroutines", cfg.Goroutines}, {"--names", cfg.Names}} {
		if v.n < 1 {
			return fs.usageError("%s must be at least 1", v.name)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// Zero means "default" to stress.Config; given on the command line it is an error.
	switch {
	case set["duration"] && cfg.Duration <= 0:
		return fs.usageError("--duration must be more than 0 (leave it out for 5s)")
	case cfg.Ops < 0:
		return fs.usageError("--ops must not be negative (0: none, run for --duration)")
	case set["deadline"] && cfg.Deadline <= 0:
		return fs.usageError("--deadline must be more than 0 (leave it out for 5ms)")
	case set["stuck"] && cfg.Stuck <= 0:
		return fs.usageError("--stuck must be more than 0 (leave it out for 2s)")
	}
	var err error
	if cfg.Hold, err = stress.ParseHold(*hold); err != nil {
		return fs.usageError("%v", strings.TrimPrefix(err.Error(), stress.ErrUsage.Error()+": "))
	}
	var list []string
	for _, b := range strings.Split(*backends, ",") {
		b = strings.TrimSpace(b)
		if b != stress.BackendShmlocks && b != stress.BackendFlock {
			return fs.usageError("unknown backend %q (want shmlocks, flock or shmlocks,flock)", b)
		}
		list = append(list, b)
	}
	switch {
	case *features != "":
		if cfg.Features, err = stress.ParseFeatures(*features); err != nil {
			return fs.usageError("%v", strings.TrimPrefix(err.Error(), stress.ErrUsage.Error()+": "))
		}
	case cfg.Chaos > 0 && len(list) == 1 && list[0] == stress.BackendShmlocks:
		cfg.Features = stress.AllFeatures
	}
	procsSet := false
	fs.Visit(func(f *flag.Flag) { procsSet = procsSet || f.Name == "procs" })
	if len(cfg.Features) > cfg.Procs && !procsSet {
		cfg.Procs = len(cfg.Features) // one process per feature at least
	}
	if cfg.Table == "default" {
		cfg.Table = defaultTablePath()
	}
	if cfg.Table != "" && len(list) > 1 {
		return fs.usageError("--table applies to one backend only")
	}
	exe, err := os.Executable()
	if err != nil {
		return failf(stderr, "stress", exitOSErr, "%v", err)
	}
	cfg.Worker = []string{exe, "stress"}
	cfg.Exec = []string{exe, "exec"}
	cfg.Defaults()
	for _, b := range list {
		c := cfg
		c.Backend = b
		if err := c.Validate(); err != nil {
			return fs.usageError("%v", strings.TrimPrefix(err.Error(), stress.ErrUsage.Error()+": "))
		}
	}
	if !stress.Supported {
		return failf(stderr, "stress", exitOSErr, "not supported on this OS")
	}
	switch {
	case isTerminal(os.Stderr) && stderr == io.Writer(os.Stderr):
		cfg.Progress = os.Stderr
	case *progressEvery > 0:
		cfg.Progress, cfg.ProgressEvery = stderr, *progressEvery
	}

	var reps []*stress.Report
	status := exitOK
	for _, b := range list {
		c := cfg
		c.Backend = b
		rep, err := stress.Run(c, stderr)
		if err != nil {
			if errors.Is(err, stress.ErrUsage) {
				return fs.usageError("%v", err)
			}
			return tableFail(stderr, "stress", c.Table, err, exitOSErr)
		}
		cfg.Seed = rep.Seed // the same seed for the next backend
		reps = append(reps, rep)
		if !rep.OK() {
			status = exitFailure
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		// One shape whatever the number of backends.
		out := stressJSONReport{Runs: reps}
		for _, r := range reps {
			out.Violations += r.Violations
		}
		if err := enc.Encode(out); err != nil {
			return failf(stderr, "stress", exitOSErr, "%v", err)
		}
	} else if err := stress.WriteText(stdout, reps); err != nil {
		return failf(stderr, "stress", exitOSErr, "%v", err)
	}
	for _, r := range reps {
		if !r.OK() {
			fmt.Fprintf(stderr, "shmlocks stress: %s: %d violations; table kept at %s\n", r.Backend, r.Violations, r.Table)
		}
	}
	return status
}

// stressJSONReport is the output of stress --json: the total of
// violations and one report per backend, in the order run (docs/cli.md).
type stressJSONReport struct {
	Violations int              `json:"violations"`
	Runs       []*stress.Report `json:"runs"`
}
