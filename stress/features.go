package stress

import (
	"fmt"
	"slices"
	"strings"
)

// Features: what the worker processes of a run do, one feature per process
// position (position p runs Config.Features[p % len]). Under --chaos the
// supervisor SIGKILLs each feature's processes in turn, at the moment that
// feature is most fragile (see the package documentation).
const (
	FeaturePlain    = "plain"    // Acquire/Release of one name (modes, IfAvailable, Steal, deadlines)
	FeatureExec     = "exec"     // shmlocks exec wrappers whose command checks in while it runs
	FeatureChild    = "child"    // Request whose fn makes nested and fanned-out child requests with its ctx
	FeatureCoalesce = "coalesce" // Coalesce flights: one leader per key, whole results to followers
	FeatureAll      = "all"      // AcquireAll / RequestAll of two or three names
)

// Feature indices in the check region (kills per feature).
const (
	featurePlain = iota
	featureExec
	featureChild
	featureCoalesce
	featureAll
	numFeatures
)

var featureNames = [numFeatures]string{FeaturePlain, FeatureExec, FeatureChild, FeatureCoalesce, FeatureAll}

// AllFeatures is every feature, in the order of the report.
var AllFeatures = featureNames[:]

func featureIndex(f string) int { return slices.Index(featureNames[:], f) }

// ParseFeatures parses a comma-separated feature list; "every" stands for
// AllFeatures (the feature "all" is AcquireAll).
func ParseFeatures(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			continue
		case f == "every":
			for _, g := range AllFeatures {
				if !slices.Contains(out, g) {
					out = append(out, g)
				}
			}
		case featureIndex(f) < 0:
			return nil, fmt.Errorf("%w: --features: unknown feature %q (want %s or every)", ErrUsage, f, strings.Join(AllFeatures, ", "))
		case !slices.Contains(out, f):
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --features: empty list", ErrUsage)
	}
	return out, nil
}

// Records per goroutine the features need (feature_child_unix.go,
// feature_all_unix.go).
const (
	childFanout  = 2                 // children per grant, at most
	childRecords = 2 + 2*childFanout // the Request, each child and its nested request, a stale request
	allMax       = 3                 // names per AcquireAll, at most
)

// Exec kill targets: what a SIGKILL of an exec feature hits.
const (
	execKillNone    = 0
	execKillWrapper = 1 // the shmlocks exec process only (the OOM killer, timeout -s KILL)
	execKillCommand = 2 // the command only (it kills itself)
	execKillGroup   = 3 // the wrapper's process group (systemctl kill -s KILL)
)

var execKillNames = [4]string{"", "wrapper", "command", "group"}

// Violation kinds (each violation message starts with its kind).
const (
	kindExclusion = iota // two holders of one name at once (plain and AcquireAll holds)
	kindExec             // a holder overlapped an exec command that holds the name
	kindChild            // child grants of one grant overlapped, or a child outlived its grant unaware, or a stale ctx was granted inside another's hold
	kindFlight           // two Coalesce leaders of one key at once, or a partial, foreign or stale result
	kindCounter          // the non-atomic per-name counter (a write inside someone else's section, lost updates)
	kindToken            // a fencing token went backwards or was 0
	kindLost             // a lock lost without a recorded steal
	kindStuck            // a waiter stuck on a free name, a deadline ignored, no grant for --max-gap, workers that do not stop
	kindTable            // the table's own checker, or the table not empty at the end
	kindFailure          // a worker or command failed, or a request failed with an unexpected error
	kindOther
	numKinds
)

var kindNames = [numKinds]string{"exclusion", "exec", "child", "flight", "counter", "token", "lost", "stuck", "table", "failure", "other"}

// backendFeature reports whether feature f runs on a registered backend
// too (RegisterBackend): plain, and coalesce on a backend whose Managers
// keep records (etcd); the others need the table.
func backendFeature(f string) bool { return f == FeaturePlain || f == FeatureCoalesce }
