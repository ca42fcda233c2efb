// Package wake is how a Manager is woken: its doorbell and the bell loop
// that waits on it, and its reaper, the death watcher that notices other
// agents' deaths and reaps them. It calls back into the Manager only on
// cold paths (Host): a scan after a ring, a reap, a fault.
//
//	granter ──ring──▶ Bell (abstract datagram socket; across network
//	                  namespaces the table's cross-namespace bell word)
//	                    │
//	                    ▼ bell loop: Host.Scan
//	kernel ──death word (robust futex)──▶ Reaper's watcher threads
//	                    │
//	                    ▼ lock byte free: Host.ReapOne / orphans
package wake

// Host is the Manager as the waking sees it. Every method is a cold path.
type Host interface {
	// Enter marks a table operation in progress (false: the Manager is
	// closed); Leave ends it.
	Enter() bool
	Leave()
	// Scan looks at the Manager's waiting requests and held locks (force:
	// even if the sequence words did not change).
	Scan(force bool)
	// NoteFault reports a memory fault on the mapping (file truncated).
	NoteFault()
	// ReapAll reaps every dead agent; ReapOne agent idx if it is dead.
	ReapAll()
	ReapOne(idx uint32)
	// Busy reports whether the Manager has waiting requests or watches.
	Busy() bool
}
