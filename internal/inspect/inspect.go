// Package inspect hands our own tools (shmlocks dump and serve, the prom
// Collector) and the tests of other packages the table behind a Manager,
// which the public API keeps to itself.
//
// The dependency runs one way, as for internal/seam: manager imports
// inspect and registers, in its init, the function Table calls; a tool
// imports manager and inspect. Nothing here is public API (the internal/
// rule admits the packages of this module and of the modules nested under
// it, such as github.com/shmlocks/shmlocks/prom).
package inspect

import (
	"strconv"
	"sync/atomic"

	"github.com/shmlocks/shmlocks/table"
)

var tableOf atomic.Pointer[func(m any) (*table.Table, *table.Agent)]

// Register sets the function Table calls; package manager calls it once,
// in its init.
func Register(f func(m any) (*table.Table, *table.Agent)) { tableOf.Store(&f) }

// Table returns the table of m, a *manager.Manager, and m's own agent
// record in it; nil, nil for a Manager whose locks live in another backend,
// or one never opened.
func Table(m any) (*table.Table, *table.Agent) {
	f := tableOf.Load()
	if f == nil {
		return nil, nil
	}
	return (*f)(m)
}

// ClientID is the Web Locks client id of the agent with nonce, as
// manager.LockInfo.ClientID gives it: the tools print the same id.
func ClientID(nonce uint64) string { return strconv.FormatUint(nonce, 16) }
