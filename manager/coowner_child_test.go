package manager_test

import (
	"strconv"

	. "github.com/shmlocks/shmlocks/manager"
)

// childCoOwner: coowner PGID -> "coowned", or "error coowner MSG".
func childCoOwner(m *Manager, f []string) {
	pgid, _ := strconv.Atoi(f[1])
	if err := m.SetCoOwner(pgid); err != nil {
		say("error coowner %v", err)
		return
	}
	say("coowned %d", pgid)
}
