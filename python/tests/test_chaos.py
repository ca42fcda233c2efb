"""Python and Go processes take one exclusive name over and over while the
test SIGKILLs them at random: never two holders at once, by two checks
independent of shmlocks:

  - each holder takes a POSIX record lock on a file; if another process has
    it, the holder logs that process's pid (F_GETLK) and waits: that process
    must be one the test SIGKILLed (the kernel drops a dead process's record
    lock when its last thread has exited, which can come after the survivors
    reaped its agent: measured, under load), never a live one;
  - each holder writes enter/mid/exit lines with its token to one O_APPEND
    log, where no line of an earlier grant may follow the enter of a later
    one, except from a killed process (a write in flight in another thread
    when it was killed)."""

import os
import random
import time

from helpers import Agent, TableTest

SECONDS = float(os.environ.get("SHMLOCKS_LANG_CHAOS_SECONDS", "6"))


class Chaos(TableTest):
    def test_python_and_go_never_hold_one_name_at_once(self):
        seed = int(os.environ.get("SHMLOCKS_LANG_CHAOS_SEED", time.time_ns() % 100000))
        rnd = random.Random(seed)
        occ, log = os.path.join(self.dir, "occ"), os.path.join(self.dir, "log")
        kinds = ["python", "python", "go", "go"]
        agents = []

        def start(kind):
            a = Agent(kind, self.path)
            a.send("chaos job %s %s" % (occ, log))
            return a
        try:
            agents = [start(k) for k in kinds]
            kills, killed = {"python": 0, "go": 0}, set()
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                time.sleep(rnd.uniform(0.05, 0.25))  # the pace of the kills, not a synchronisation
                i = rnd.randrange(len(agents))
                agents[i].kill()
                kills[agents[i].kind] += 1
                killed.add(agents[i].p.pid)
                agents[i].close()
                agents[i] = start(kinds[i])
        finally:
            for a in agents:
                a.kill()
                a.close()
        with open(log) as f:
            lines = [l.split() for l in f]
        msg = "seed %d (SHMLOCKS_LANG_CHAOS_SEED), log %s" % (seed, log)
        blocked = [l for l in lines if l[0] == "blocked"]
        live = [l for l in blocked if int(l[3]) not in killed]
        self.assertEqual(live, [], "a live process held the record lock while another held the name: " + msg)
        top, holders, late = 0, {}, 0
        for n, (what, tok, pid, *_) in enumerate(lines):
            tok = int(tok)
            if what == "blocked":
                continue
            if what != "enter" and tok != top and int(pid) in killed:
                late += 1
                continue
            if what == "enter":
                self.assertGreater(tok, top, "line %d: grant %d entered after grant %d (%s)" % (n, tok, top, msg))
                top = tok
                holders[tok] = pid
            else:
                self.assertEqual(tok, top, "line %d: %s of grant %d after grant %d entered: two holders (%s)"
                                 % (n, what, tok, top, msg))
        by_kind = {}
        for tok, pid in holders.items():
            by_kind[pid] = by_kind.get(pid, 0) + 1
        print("\nchaos %.0fs seed %d: %d grants by %d processes, kills %s; waits for a killed holder's "
              "record lock %d, its late lines %d" % (SECONDS, seed, len(holders), len(by_kind), kills, len(blocked),
                                                     late))
        self.assertGreater(len(holders), 20, "the workload ran (" + msg + ")")
        self.assertTrue(kills["python"] > 0 and kills["go"] > 0, "both kinds killed: %s" % kills)
