package stress

import (
	"sort"
	"sync"

	"github.com/shmlocks/shmlocks/manager"
)

// ManagerBackend runs the stress workload on a manager.Manager that is not a
// table file's: a backend in a module of its own, which the core module
// cannot import (the etcd backend is one). A program registers it under a
// name, in the supervisor and in every worker (both run the same binary:
// register in main before calling Run or WorkerMain), and sets
// Config.Backend to that name and Config.Target to what its workers need to
// open it (an endpoint list, say). The workers then make the same requests,
// and the same independent checkers (occupancy, FIFO sampling, tokens,
// counters) judge them. See etcd/cmd/shmlocks-etcd.
type ManagerBackend struct {
	// Open opens the Manager of one worker process.
	Open func(target string) (*manager.Manager, error)
	// Empty, when not nil, is called after the run (every worker gone): it
	// reports an error if a lock or request is left in the bucket.
	Empty func(target string) error
}

var plugins sync.Map // name -> ManagerBackend

// RegisterBackend makes name a backend that Run and WorkerMain accept.
// The names shmlocks and flock are taken.
func RegisterBackend(name string, b ManagerBackend) {
	if name == BackendShmlocks || name == BackendFlock {
		panic("stress: backend name " + name + " is taken")
	}
	plugins.Store(name, b)
}

// plugin returns the registered backend called name.
func plugin(name string) (ManagerBackend, bool) {
	v, ok := plugins.Load(name)
	if !ok {
		return ManagerBackend{}, false
	}
	return v.(ManagerBackend), true
}

// pluginNames lists the registered backends.
func pluginNames() []string {
	var out []string
	plugins.Range(func(k, _ any) bool { out = append(out, k.(string)); return true })
	sort.Strings(out)
	return out
}
