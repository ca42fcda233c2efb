package table

// The table does not log. The rare events an operator cares about (a dead
// agent reaped, a bucket latch taken over from a dead owner and the bucket
// rebuilt) are reported to one hook per Table, which the manager package
// turns into statistics and log records. The hook is called on the cold
// paths only (Reap, repair), possibly with a bucket latch held: it must be
// quick and must not call back into the table.

// EventKind says what happened.
type EventKind uint8

const (
	// EventReap: agent Agent (process PID) was found dead and reaped by us:
	// its held locks released, its pending requests removed.
	EventReap EventKind = 1 + iota
	// EventRepair: the latch of Bucket was left held by a dead owner; we
	// took it over and rebuilt the bucket from its slots.
	EventRepair
)

// String names the kind ("reap", "repair").
func (k EventKind) String() string {
	switch k {
	case EventReap:
		return "reap"
	case EventRepair:
		return "repair"
	}
	return "unknown"
}

// Event is one reported event. Fields that do not apply are zero.
type Event struct {
	Kind   EventKind
	Agent  uint32 // EventReap: the dead agent's record index
	PID    int    // EventReap: its process id
	Bucket uint32 // EventRepair: the rebuilt bucket
}

// SetEventHook sets the function called for every event this Table's
// operations cause (nil: none). See EventKind for the events.
func (t *Table) SetEventHook(f func(Event)) {
	if f == nil {
		t.events.Store(nil)
		return
	}
	t.events.Store(&f)
}

// emit reports e to the hook, if any.
func (t *Table) emit(e Event) {
	if f := t.events.Load(); f != nil {
		(*f)(e)
	}
}
