package stress

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/shmlocks/shmlocks/manager"
)

// Backends.
const (
	BackendShmlocks = "shmlocks"
	BackendFlock    = "flock"
)

// Environment variables.
const (
	// WorkerEnv carries a worker's configuration (JSON) to the re-executed
	// binary; its presence selects the worker role.
	WorkerEnv = "SHMLOCKS_STRESS_WORKER"
	// FaultEnv = "break-exclusion" makes every worker break the lock's mutual
	// exclusion (internal/testhooks.BreakExclusion), to prove the checkers notice.
	FaultEnv = "SHMLOCKS_FAULT"
)

// ErrUsage marks configuration errors (the command line's fault).
var ErrUsage = errors.New("stress: invalid configuration")

// Config is one stress run.
type Config struct {
	Backend    string        // BackendShmlocks or BackendFlock
	Procs      int           // worker processes at once
	Goroutines int           // requesting goroutines per process
	Names      int           // lock names (stress-0 ...)
	Duration   time.Duration // run length (when Ops is 0)
	Ops        int           // requests per goroutine (0: run for Duration)

	Shared      float64       // fraction of requests in shared mode
	IfAvailable float64       // fraction made with IfAvailable
	Steal       float64       // fraction of exclusive, waiting requests made with Steal
	Timeout     float64       // fraction of waiting requests given a deadline
	Deadline    time.Duration // that deadline
	Hold        Hold          // how long a granted lock is held
	HandOver    bool          // shmlocks workers open with manager.OpenOptions.HandOver
	Fairness    string        // the shmlocks table is created with this manager.Fairness ("fifo", "bounded:1ms"; "": fifo)

	Target string // what a registered backend's workers open (RegisterBackend)

	Seed  uint64  // 0: random (the report prints the one used)
	Table string  // table file (default: fresh, in a temporary directory)
	Keep  bool    // keep the temporary directory
	Chaos float64 // SIGKILLs per second, over every feature (a killed worker is replaced at once)
	// Namespaces starts every other worker process in new PID, network and
	// mount namespaces of its own (Linux, as root), but exec's workers:
	// containers sharing the table; the checkers see every worker alike.
	Namespaces bool
	// KillEach (with Chaos) goes on after Duration until every feature has
	// been killed at least once, for at most KillEachWithin more: a run
	// that must kill each feature waits for it rather than assuming how
	// many kills fit in Duration on a busy machine.
	KillEach bool

	// Features are what the worker processes do, one per process position
	// in turn (FeaturePlain, FeatureExec, ...; empty: FeaturePlain). Every
	// feature but plain and coalesce needs BackendShmlocks (coalesce runs
	// on a registered backend whose Managers keep records, as etcd's do),
	// and Procs must give each feature a process.
	Features []string
	// Exec is the argv of "shmlocks exec" (FeatureExec; its command is Worker).
	Exec []string

	Stuck       time.Duration // a waiter blocked this long on a free name is a violation (default 2s)
	MaxGrantGap time.Duration // no grant anywhere for this long while the run is on is a violation (0: not checked)
	Grace       time.Duration // how long workers may take to stop after the end (default 20s)

	// Worker is the command that runs a worker (argv; the configuration goes
	// in the WorkerEnv environment variable).
	Worker []string
	// Progress, when not nil, receives a progress line: with ProgressEvery
	// 0, one redrawn in place ("\r...") four times a second (a terminal);
	// else one line ("...\n") every ProgressEvery (a log).
	Progress      interface{ Write([]byte) (int, error) }
	ProgressEvery time.Duration
}

// Defaults fills the zero fields that have defaults.
func (c *Config) Defaults() {
	if c.Backend == "" {
		c.Backend = BackendShmlocks
	}
	if c.Procs == 0 {
		c.Procs = 4
	}
	if c.Goroutines == 0 {
		c.Goroutines = 2
	}
	if c.Names == 0 {
		c.Names = 4
	}
	if c.Duration == 0 && c.Ops == 0 {
		c.Duration = 5 * time.Second
	}
	if c.Deadline == 0 {
		c.Deadline = 5 * time.Millisecond
	}
	if c.Stuck == 0 {
		c.Stuck = 2 * time.Second
	}
	if c.Grace == 0 {
		c.Grace = 20 * time.Second
	}
}

// Validate reports configuration errors wrapping ErrUsage.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
	}
	switch c.Backend {
	case BackendShmlocks, BackendFlock:
	default:
		if _, ok := plugin(c.Backend); !ok {
			return bad("unknown backend %q (want shmlocks, flock or one of the registered %v)", c.Backend, pluginNames())
		}
	}
	if c.Procs < 1 || c.Procs > 256 {
		return bad("--procs %d out of range [1, 256]", c.Procs)
	}
	if c.Goroutines < 1 || c.Goroutines > 256 {
		return bad("--goroutines %d out of range [1, 256]", c.Goroutines)
	}
	if c.Names < 1 || c.Names > 4096 {
		return bad("--names %d out of range [1, 4096]", c.Names)
	}
	if c.Ops < 0 {
		return bad("--ops %d is negative", c.Ops)
	}
	if c.Ops == 0 && c.Duration <= 0 {
		return bad("--duration %v must be positive", c.Duration)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"--shared", c.Shared}, {"--if-available", c.IfAvailable}, {"--steal", c.Steal}, {"--timeout", c.Timeout}} {
		if !(f.v >= 0 && f.v <= 1) {
			return bad("%s %v is not a fraction in [0, 1]", f.name, f.v)
		}
	}
	if c.Deadline <= 0 {
		return bad("--deadline %v must be positive", c.Deadline)
	}
	if c.Fairness != "" {
		if _, err := manager.ParseFairness(c.Fairness); err != nil {
			return bad("--fairness %q: want fifo or bounded:DURATION (e.g. bounded:1ms)", c.Fairness)
		}
	}
	if c.Namespaces && (!namespacesSupported || c.Backend != BackendShmlocks) {
		return bad("--namespaces needs Linux and the shmlocks backend")
	}
	if !(c.Chaos >= 0) || math.IsInf(c.Chaos, 0) {
		return bad("--chaos %v must be a non-negative rate", c.Chaos)
	}
	if c.Stuck <= 0 || c.Grace <= 0 {
		return bad("stuck and grace periods must be positive")
	}
	if len(c.Worker) == 0 {
		return bad("no worker command")
	}
	for _, f := range c.Features {
		if featureIndex(f) < 0 {
			return bad("unknown feature %q", f)
		}
		if !backendFeature(f) && c.Backend != BackendShmlocks {
			return bad("feature %s needs the shmlocks backend", f)
		}
		if f == FeatureExec && len(c.Exec) == 0 {
			return bad("feature exec needs the shmlocks exec command (Config.Exec)")
		}
	}
	if len(c.Features) > c.Procs {
		return bad("--procs %d gives %d features no process each (at least %d)", c.Procs, len(c.Features), len(c.Features))
	}
	if c.Procs > maxPositions {
		return bad("--procs %d above %d", c.Procs, maxPositions)
	}
	return nil
}

// recordsPerGoroutine is how many hold records a goroutine of the features
// needs at once.
func recordsPerGoroutine(features []string) int {
	n := 1
	for _, f := range features {
		switch f {
		case FeatureChild:
			n = max(n, childRecords)
		case FeatureAll:
			n = max(n, allMax)
		}
	}
	return n
}

// Hold is a distribution of hold times.
type Hold struct {
	Kind     string // "fixed", "exp", "uniform" or "" (no hold)
	A, B     time.Duration
	original string
}

// ParseHold parses "fixed:10us", "exp:50us" (exponential with that mean),
// "uniform:0-100us" (or "uniform:10us-1ms"), or "0"/"none".
func ParseHold(s string) (Hold, error) {
	h := Hold{original: s}
	if s == "" || s == "0" || s == "none" {
		return Hold{original: "none"}, nil
	}
	kind, arg, ok := strings.Cut(s, ":")
	if !ok {
		return h, fmt.Errorf("%w: --hold %q: want fixed:DUR, exp:MEAN or uniform:MIN-MAX", ErrUsage, s)
	}
	parse := func(v string) (time.Duration, error) {
		if v == "0" {
			return 0, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%w: --hold %q: bad duration %q", ErrUsage, s, v)
		}
		return d, nil
	}
	var err error
	switch kind {
	case "fixed", "exp":
		h.Kind = kind
		h.A, err = parse(arg)
	case "uniform":
		h.Kind = kind
		lo, hi, ok := strings.Cut(arg, "-")
		if !ok {
			return h, fmt.Errorf("%w: --hold %q: want uniform:MIN-MAX", ErrUsage, s)
		}
		// "0-100us": the unit of the upper bound applies to a bare lower bound.
		if _, perr := time.ParseDuration(lo); perr != nil && lo != "0" {
			unit := strings.TrimLeft(hi, "0123456789.")
			lo += unit
		}
		if h.A, err = parse(lo); err == nil {
			h.B, err = parse(hi)
		}
		if err == nil && h.B < h.A {
			err = fmt.Errorf("%w: --hold %q: maximum below minimum", ErrUsage, s)
		}
	default:
		return h, fmt.Errorf("%w: --hold %q: unknown distribution %q (fixed, exp, uniform)", ErrUsage, s, kind)
	}
	return h, err
}

// String returns the distribution as given.
func (h Hold) String() string {
	if h.original == "" {
		return "none"
	}
	return h.original
}

// Sample draws a hold time.
func (h Hold) Sample(rng *rand.Rand) time.Duration {
	switch h.Kind {
	case "fixed":
		return h.A
	case "exp":
		return time.Duration(rng.ExpFloat64() * float64(h.A))
	case "uniform":
		if h.B == h.A {
			return h.A
		}
		return h.A + time.Duration(rng.Int64N(int64(h.B-h.A)+1))
	}
	return 0
}
