package manager

import "github.com/shmlocks/shmlocks/table"

// Internals the tests of this package (and its external test package) use.

// Table returns the table behind m.
func (m *Manager) Table() *table.Table { return m.t }

// Agent returns m's agent record.
func (m *Manager) Agent() *table.Agent { return m.a }
