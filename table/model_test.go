package table

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestModelRandomOps drives random requests, releases, aborts, steals and
// agent deaths through the table, runs the invariant checker after every
// step, and compares holders, queues and outcomes with the reference model.
func TestModelRandomOps(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	steps := 3000
	if testing.Short() {
		seeds, steps = seeds[:3], 1500
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, steps, false, smallGeometry) })
	}
}

// TestModelBounded runs the model on tables of bounded fairness: releases
// leave free names to their heads, new requests take them first, heads
// take their turns, and heads aged past the bound are served in order.
func TestModelBounded(t *testing.T) {
	seeds := []uint64{31, 32, 33, 34}
	if testing.Short() {
		seeds = seeds[:2]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModelFair(t, seed, 2500, false, smallGeometry, true) })
	}
	t.Run("few entries", func(t *testing.T) {
		runModelFair(t, 35, 2000, false, Geometry{MaxResources: 3, MaxRequests: 64, MaxAgents: 16, MaxNameLen: 32}, true)
	})
	t.Run("near wrap", func(t *testing.T) { runModelFair(t, 36, 2000, true, smallGeometry, true) })
}

// TestModelFewEntries: five names share three entries, so idle entries are
// renamed and reclaimed from other buckets all the time, and ErrTableFull is
// acceptable only when the model has three names in use.
func TestModelFewEntries(t *testing.T) {
	g := Geometry{MaxResources: 3, MaxRequests: 64, MaxAgents: 16, MaxNameLen: 32}
	for _, seed := range []uint64{21, 22, 23, 24} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, 2000, false, g) })
	}
}

// TestModelCountersNearWrap seeds every slot serial, queue sequence number,
// doorbell counter and token counter just below 2^32 (hard case 9) and runs
// the model through the wrap.
func TestModelCountersNearWrap(t *testing.T) {
	for _, seed := range []uint64{11, 12, 13} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed, 2000, true, smallGeometry) })
	}
}

func runModel(t *testing.T, seed uint64, steps int, nearWrap bool, g Geometry) {
	runModelFair(t, seed, steps, nearWrap, g, false)
}

// runModelFair is runModel on a FIFO table, or (bounded) on a table of
// bounded fairness whose bound no request reaches unless the test ages it:
// then the model's releases leave a free name to its head (passOn), new
// requests may take it first (a barge), and the head takes it with
// TakeTurn (fairness.go).
func runModelFair(t *testing.T, seed uint64, steps int, nearWrap bool, g Geometry, bounded bool) {
	live0 := installFakeLiveness(t)
	var tb *Table
	if bounded {
		var err error
		tb, _, err = OpenFair(filepath.Join(t.TempDir(), "t.tbl"), g, 0, MaxFairnessBound)
		require.NoError(t, err)
		t.Cleanup(func() { tb.Close() })
	} else {
		tb = newTestTable(t, g)
	}
	if nearWrap {
		for s := uint32(0); s < uint32(tb.l.MaxRequests); s++ {
			*tb.u64(tb.slotOff(s) + slWord) = slotWord(0xFFFFFFFF-s%7, 0, SlotFree)
		}
		for e := uint32(0); e < uint32(tb.l.MaxResources); e++ {
			*tb.u32(tb.entryOff(e) + enSeq) = 0xFFFFFFF0 + e%5
		}
		// Token counters start just below 2^32 too, so that the fast
		// path's 32-bit counter reaches its end and the latched path
		// carries into the high word.
		for b := uint32(0); b < tb.l.buckets; b++ {
			*tb.u64(tb.bucketOff(b) + bkMaxToken) = 0xFFFFFFF0 + uint64(b%11)
		}
		for a := uint32(0); a < uint32(tb.l.MaxAgents); a++ {
			*tb.u32(tb.agentOff(a) + agBell) = 0xFFFFFFF8
			*tb.u32(tb.agentOff(a) + agStealSeq) = 0xFFFFFFFE
		}
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	names := []string{"a", "b", "c", "d\x00x", "é"}
	const nAgents = 5
	agents := make([]*Agent, nAgents)
	pids := make([]int, nAgents)
	nextPID := 1_000_000
	register := func(i int) {
		nextPID++
		pids[i] = nextPID
		a, err := tb.Register(Identity{PID: nextPID, Start: 7, Boot: selfIdentity.Boot}, uint64(nextPID))
		require.NoError(t, err)
		agents[i] = a
	}
	for i := range agents {
		register(i)
	}
	mdl := newModel()
	reqs := map[int]*live{} // id -> request
	nextID := 0
	// Watches (watch.go): each must be rung (its entry's gen moves) by every
	// change of its name, and a watch in a mode is removed by WatchCheck
	// exactly when the model says a request in that mode is grantable.
	type mwatch struct {
		agent int
		name  string
		mode  uint32
		ref   Ref
		gen   uint32
		state string // the model's state of the name when last looked at
	}
	watches := map[int]*mwatch{}
	var nLinked, nReady, nRung int // the watch checks did something
	// The holders and the queue (not which heads have waited the bound:
	// time passing is no change that rings a watch).
	nameState := func(n string) string {
		var b strings.Builder
		for _, l := range [][]mreq{mdl.held[n], {{}}, mdl.queue[n]} {
			for _, r := range l {
				fmt.Fprintf(&b, "%d/%d/%d ", r.agent, r.mode, r.id)
			}
		}
		return b.String()
	}
	grantableNow := func(n string, mode uint32) bool {
		if q := mdl.queue[n]; bounded && len(q) > 0 {
			return len(mdl.held[n]) == 0 && !q[0].starved // a barge
		}
		return len(mdl.queue[n]) == 0 && mdl.compatible(n, mode)
	}
	// passOn is the model of a release or an abort: the queue is processed,
	// unless a bounded table leaves the name to a head that has not waited
	// the bound (it takes its turn later).
	var nBarge, nLeft, nTurn int // the bounded table's own moves happened
	passOn := func(n string) []int {
		if q := mdl.queue[n]; bounded && len(q) > 0 && !q[0].starved {
			if len(mdl.held[n]) == 0 || mdl.compatible(n, q[0].mode) {
				nLeft++
			}
			return nil
		}
		return mdl.process(n)
	}
	var w Wakes
	deliver := func() { tb.Deliver(&w, nil) }
	checkWatches := func(step int, what string) {
		t.Helper()
		perName := map[string]int{}
		for id, mw := range watches {
			a := agents[mw.agent]
			gen, ok := tb.WatchGen(a, mw.ref)
			require.True(t, ok, "seed %d step %d (%s): watch %d gone", seed, step, what, id)
			if gen != mw.gen {
				nRung++
			}
			if st := nameState(mw.name); st != mw.state && gen == mw.gen {
				t.Fatalf("seed %d step %d (%s): %q changed (%s -> %s) but watch %d was not rung", seed, step, what, mw.name, mw.state, st, id)
			}
			out, gen2, err := tb.WatchCheck(a, mw.ref, &w)
			deliver()
			require.NoError(t, err)
			require.Equal(t, gen, gen2, "gen moved without a change")
			// Removed when grantable now, or (fired) when it was at the end
			// of one of this step's changes (a reap makes several).
			ready := mw.mode != ModeAny && grantableNow(mw.name, mw.mode)
			if ready {
				require.Equal(t, WatchRemoved, out, "seed %d step %d (%s): watch %d on %q mode %d", seed, step, what, id, mw.name, mw.mode)
			} else if out == WatchRemoved {
				require.NotEqual(t, uint32(ModeAny), mw.mode, "a watch of any change is never removed by WatchCheck")
				require.NotEqual(t, mw.gen, gen, "seed %d step %d (%s): watch %d removed without a change", seed, step, what, id)
				ready = true
			}
			if ready {
				nReady++
				delete(watches, id)
				continue
			}
			mw.gen, mw.state = gen, nameState(mw.name)
			perName[mw.name]++
		}
		for _, n := range names {
			ni, err := tb.Name(agents[0], n, Hash(n))
			deliver()
			require.NoError(t, err)
			require.Len(t, ni.Watchers, perName[n], "watchers of %q", n)
			if perName[n] > 0 {
				require.True(t, ni.Live)
			}
		}
	}
	checkAll := func(step int, what string) {
		t.Helper()
		if err := tb.check(true); err != nil {
			t.Fatalf("seed %d step %d (%s): %v", seed, step, what, err)
		}
		checkWatches(step, what)
		if err := tb.check(true); err != nil {
			t.Fatalf("seed %d step %d (%s, after the watch checks): %v", seed, step, what, err)
		}
		held, pending, err := tb.Snapshot(nil)
		require.NoError(t, err)
		// Compare with the model: holders as sets, queues in order.
		gotHeld := map[string][]int{}
		for _, li := range held {
			gotHeld[li.Name] = append(gotHeld[li.Name], int(li.Slot))
		}
		gotPend := map[string][]int{}
		for _, li := range pending {
			gotPend[li.Name] = append(gotPend[li.Name], int(li.Slot))
		}
		for _, n := range names {
			var wantHeld, wantPend []int
			for _, r := range mdl.held[n] {
				wantHeld = append(wantHeld, int(reqs[r.id].ref.Slot))
			}
			for _, r := range mdl.queue[n] {
				wantPend = append(wantPend, int(reqs[r.id].ref.Slot))
			}
			sort.Ints(wantHeld)
			g := slices.Clone(gotHeld[n])
			sort.Ints(g)
			if !slices.Equal(g, wantHeld) || !slices.Equal(gotPend[n], wantPend) {
				t.Fatalf("seed %d step %d (%s) name %q: held %v pending %v, model held %v pending %v",
					seed, step, what, n, g, gotPend[n], wantHeld, wantPend)
			}
		}
	}
	// Verify a grant the model made is visible as HELD with a fresh token.
	confirm := func(ids []int) {
		for _, id := range ids {
			r := reqs[id]
			st, tok, ok := tb.Status(agents[r.agent], r.ref)
			require.True(t, ok)
			require.Equal(t, uint8(SlotHeld), st, "request %d should be granted", id)
			require.Greater(t, tok, mdl.last[r.name], "token must increase on %q", r.name)
			mdl.last[r.name] = tok
		}
	}
	for step := 0; step < steps; step++ {
		op := rng.IntN(100)
		ai := rng.IntN(nAgents)
		a := agents[ai]
		name := names[rng.IntN(len(names))]
		var what string
		if rng.IntN(8) == 0 { // watch or unwatch
			what = fmt.Sprintf("watch %q agent %d", name, ai)
			if mine := slices.Collect(func(yield func(int) bool) {
				for id, mw := range watches {
					if mw.agent == ai && !yield(id) {
						return
					}
				}
			}); len(mine) > 0 && rng.IntN(2) == 0 {
				slices.Sort(mine)
				id := mine[rng.IntN(len(mine))]
				what = fmt.Sprintf("unwatch %d agent %d", id, ai)
				require.NoError(t, tb.Unwatch(a, watches[id].ref, &w), what)
				deliver()
				delete(watches, id)
				checkAll(step, what)
				continue
			}
			mode := uint32(rng.IntN(3))
			what += fmt.Sprintf(" mode %d", mode)
			r, err := tb.Claim(a, Hash(name))
			if err != nil {
				require.ErrorIs(t, err, ErrTableFull, what)
				continue
			}
			out, err := tb.Watch(a, r, name, Hash(name), mode, 1, &w)
			deliver()
			if err != nil {
				require.ErrorIs(t, err, ErrTableFull, what)
				require.Equal(t, uint32(ModeAny), mode, what)
				checkAll(step, what)
				continue
			}
			if mode != ModeAny && grantableNow(name, mode) {
				require.Equal(t, WatchReady, out, what)
			} else {
				require.Equal(t, WatchLinked, out, what)
				gen, ok := tb.WatchGen(a, r)
				require.True(t, ok)
				nLinked++
				watches[nextID] = &mwatch{agent: ai, name: name, mode: mode, ref: r, gen: gen, state: nameState(name)}
				nextID++
			}
			checkAll(step, what)
			continue
		}
		switch {
		case op < 45: // acquire
			mode := uint32(ModeExclusive)
			if rng.IntN(3) == 0 {
				mode = ModeShared
			}
			ifAvail := rng.IntN(6) == 0
			steal := !ifAvail && mode == ModeExclusive && rng.IntN(15) == 0
			what = fmt.Sprintf("acquire %q agent %d mode %d ifAvail %v steal %v", name, ai, mode, ifAvail, steal)
			ref, out, tok, err := tb.Acquire(a, name, Hash(name), mode, ifAvail, steal, &w)
			deliver()
			if q := mdl.queue[name]; bounded && err == nil && !steal && len(q) > 0 && q[0].starved && mdl.compatible(name, q[0].mode) {
				confirm(mdl.process(name)) // an arrival serves a starved head on its way (serveStarved)
			}
			if err != nil {
				require.ErrorIs(t, err, ErrTableFull, what)
				inUse := 0
				for _, n := range names {
					watched := false
					for _, mw := range watches {
						watched = watched || mw.name == n
					}
					if len(mdl.held[n])+len(mdl.queue[n]) > 0 || watched {
						inUse++
					}
				}
				if strings.Contains(err.Error(), "MaxResources") {
					require.GreaterOrEqual(t, inUse, g.MaxResources, "%s: table full with only %d names in use", what, inUse)
					require.Zero(t, len(mdl.held[name])+len(mdl.queue[name]), "%s: a name in use has an entry", what)
				}
				break
			}
			id := nextID
			nextID++
			r := mreq{agent: ai, mode: mode, id: id}
			switch {
			case steal:
				require.Equal(t, Granted, out, what)
				for _, h := range mdl.held[name] {
					delete(reqs, h.id) // stolen: the victims' slots are STOLEN until their owners free them
				}
				mdl.held[name] = []mreq{r}
			case grantableNow(name, mode):
				require.Equal(t, Granted, out, what)
				if len(mdl.queue[name]) > 0 {
					nBarge++
				}
				mdl.held[name] = append(mdl.held[name], r)
			case ifAvail:
				require.Equal(t, NotAvailable, out, what)
				continue
			default:
				require.Equal(t, Queued, out, what)
				mdl.queue[name] = append(mdl.queue[name], r)
			}
			reqs[id] = &live{agent: ai, name: name, ref: ref, id: id}
			if out == Granted {
				require.Greater(t, tok, mdl.last[name], what)
				mdl.last[name] = tok
			}
		case op < 75: // release a held request of this agent
			id, r := pick(rng, reqs, mdl, ai, true)
			if r == nil {
				continue
			}
			what = fmt.Sprintf("release %d %q agent %d", id, r.name, ai)
			require.NoError(t, tb.Release(a, r.ref, &w), what)
			deliver()
			mdl.remove(r.name, id)
			delete(reqs, id)
			// A bounded table's fast hold released by its CAS leaves the
			// queue as it is, even behind a starved head (the next arrival
			// or the head itself serves it); one moved to the held list
			// meanwhile is released under the latch (passOn).
			if e := r.ref.Slot - uint32(tb.l.MaxRequests); bounded && r.ref.Slot >= uint32(tb.l.MaxRequests) &&
				uint32(atomic.LoadUint64(tb.u64(tb.entryOff(e)+enFast))) == fastIdle {
				break
			}
			confirm(passOn(r.name))
		case bounded && op < 82: // a bounded table: a head takes its turn, or has waited the bound
			q := mdl.queue[name]
			if len(q) == 0 {
				continue
			}
			if rng.IntN(3) == 0 {
				what = fmt.Sprintf("age the head %d of %q", q[0].id, name)
				q[0].starved = true
				*tb.u64(tb.slotOff(reqs[q[0].id].ref.Slot) + slEnqueue) = uint64(nowNano() - 2*int64(MaxFairnessBound))
				break
			}
			// Any waiting request asks; only a compatible head is granted.
			id := q[0].id
			if rng.IntN(2) == 0 {
				id = q[rng.IntN(len(q))].id
			}
			r := reqs[id]
			what = fmt.Sprintf("take turn %d %q agent %d", id, name, r.agent)
			got, err := tb.TakeTurn(agents[r.agent], r.ref, &w)
			deliver()
			require.NoError(t, err, what)
			want := q[0].id == id && mdl.compatible(name, q[0].mode)
			require.Equal(t, want, got, what)
			if want {
				nTurn++
				confirm(mdl.process(name))
			}
		case op < 88: // abort a waiting request of this agent
			id, r := pick(rng, reqs, mdl, ai, false)
			if r == nil {
				continue
			}
			what = fmt.Sprintf("abort %d %q agent %d", id, r.name, ai)
			out, _, err := tb.Abort(a, r.ref, &w)
			deliver()
			require.NoError(t, err, what)
			require.Equal(t, NotAvailable, out, what)
			mdl.remove(r.name, id)
			delete(reqs, id)
			confirm(passOn(r.name))
		case op < 92: // the agent dies and is reaped by another
			what = fmt.Sprintf("kill agent %d", ai)
			live0.kill(pids[ai])
			reaper := agents[(ai+1)%nAgents]
			n, err := tb.ReapDead(reaper, &w)
			deliver()
			require.NoError(t, err)
			require.Equal(t, 1, n, what)
			for id, mw := range watches {
				if mw.agent == ai {
					delete(watches, id)
				}
			}
			// The reaper removes the dead agent's requests in slot order, each
			// followed by its name's passOn (with starved heads the order
			// matters: a removal may grant an aged head and the shared run
			// behind it before the next removal).
			var dead []int
			for id, r := range reqs {
				if r.agent == ai {
					dead = append(dead, id)
				}
			}
			slices.SortFunc(dead, func(x, y int) int { return int(reqs[x].ref.Slot) - int(reqs[y].ref.Slot) })
			var granted []int
			for _, id := range dead {
				r := reqs[id]
				mdl.remove(r.name, id)
				delete(reqs, id)
				granted = append(granted, passOn(r.name)...)
			}
			confirm(slices.DeleteFunc(granted, func(id int) bool { return reqs[id] == nil })) // not those removed next
			register(ai)
		default: // the victims of steals free their stolen slots
			what = "free stolen"
			for s := uint32(0); s < tb.l.slots; s++ { // the entries' reserved slots too
				sw := *tb.u64(tb.slotOff(s) + slWord)
				if wordState(sw) == SlotStolen {
					for _, ag := range agents {
						if ag.Idx == wordAgent(sw) {
							require.True(t, tb.FreeStolen(ag, Ref{Slot: s, Serial: wordSerial(sw)}))
						}
					}
				}
			}
		}
		checkAll(step, what)
	}
	if steps >= 1000 {
		require.Positive(t, nLinked, "no watch was linked")
		require.Positive(t, nReady, "no watch became ready")
		require.Positive(t, nRung, "no watch was rung")
	}
	t.Logf("watches: %d linked, %d ready, %d rung", nLinked, nReady, nRung)
	if bounded {
		t.Logf("bounded: %d barges, %d names left to their heads, %d turns taken", nBarge, nLeft, nTurn)
		require.Positive(t, nBarge)
		require.Positive(t, nLeft)
		require.Positive(t, nTurn)
	}
}
