package table

import "github.com/shmlocks/shmlocks/internal/testhooks"

// Crash points: every multi-step update of the table calls crash(point)
// between its steps. Tests install a hook (internal/testhooks.SetCrash) that
// SIGKILLs the process at one named point, and prove that the survivors repair what it left behind.
// CrashPoints lists every point; a test fails if one of them is not covered.
var CrashPoints = []string{
	"slot.claimed",        // slot CLAIMED by us, not yet in any list
	"latch.acquired",      // bucket latch held, nothing changed yet
	"entry.allocated",     // entry marked live in its bucket, name not written / not linked
	"entry.linked",        // entry linked into the bucket chain, no request on it yet
	"enqueue.marked",      // slot marked WAITING, not yet linked into the queue
	"enqueue.linked",      // slot linked at the queue tail, latch still held
	"grant.marked",        // a slot marked HELD, not yet moved to the held list
	"grant.linked",        // a granted slot moved to the held list, the run of grants unfinished
	"release.unlinked",    // held slot unlinked from the held list, not yet freed
	"release.freed",       // held slot freed, queue not yet re-processed
	"abort.unlinked",      // waiting slot unlinked from the queue, not yet freed
	"steal.marked",        // a holder marked STOLEN, the rest not yet
	"steal.granted",       // stealer HELD, latch still held
	"entry.unlinked",      // empty entry unlinked from its chain, not yet freed
	"reap.latches",        // reaping: the dead agent's latches repaired, its slots not yet freed
	"reap.slot",           // reaping: one of the dead agent's slots freed, others not yet
	"reap.slots",          // reaping: all the dead agent's slots freed, agent record not yet freed
	"agent.claimed",       // agent record claimed (REGISTERING), identity not written
	"agent.alive",         // agent record ALIVE, doorbell not yet listening
	"deregister.released", // closing: every slot freed, agent record not yet freed
	"repair.rebuilt",      // repairing a bucket: lists rebuilt, queue not yet re-processed
	"fast.held",           // entry taken by the fast path's CAS, its name not yet checked again
	"fast.released",       // fast hold given back by CAS, its slot not yet freed
	"fast.inflating",      // a fast hold marked for the held list, not yet linked (latch held)
	"watch.marked",        // slot marked WATCHING, not yet linked into the entry's watch list
	"watch.linked",        // watching slot linked, latch still held
	"unwatch.unlinked",    // watching slot unlinked from the watch list, not yet freed
	"tag.partial",         // some holds of a long wait tagged with its task, the rest not yet
	"passon.leftfree",     // bounded: a release left the name free to the head, whose mark it cleared, not yet rung (latch held)
	"turn.taken",          // bounded: the head took the name left to it, latch still held
	"barge.granted",       // bounded: a new request took a free name ahead of its queue, latch still held
	"batch.granted",       // bounded, aging queue: a release granted its agent's oldest queued request ahead of older ones, not yet rung (latch held)
}

// crash marks a crash point (the hook is set by tests through
// internal/testhooks).
func crash(point string) { testhooks.Crash(point) }
