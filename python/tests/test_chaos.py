"""Python and Go processes take one exclusive name over and over while the
test SIGKILLs them at random: never two holders at once, by two checks
independent of shmlocks: each holder takes flock(2) on a file without
waiting (refused while another holder has it: the kernel drops it at death,
before the survivors can reap the dead holder's lock), and writes
enter/mid/exit lines with its token to one O_APPEND log, where no line of an
earlier grant may follow the enter of a later one."""

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
            kills = {"python": 0, "go": 0}
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                time.sleep(rnd.uniform(0.05, 0.25))  # the pace of the kills, not a synchronisation
                i = rnd.randrange(len(agents))
                agents[i].kill()
                kills[agents[i].kind] += 1
                agents[i].close()
                agents[i] = start(kinds[i])
        finally:
            for a in agents:
                a.kill()
                a.close()
        with open(log) as f:
            lines = [l.split() for l in f]
        msg = "seed %d (SHMLOCKS_LANG_CHAOS_SEED), log %s" % (seed, log)
        v = [l for l in lines if l[0] == "violation"]
        self.assertEqual(len(v), 0, "flock found a second holder %d times, first %s: %s" % (len(v), v[:3], msg))
        top, holders = 0, {}
        for n, (what, tok, pid) in enumerate(lines):
            tok = int(tok)
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
        print("\nchaos %.0fs seed %d: %d grants by %d processes, kills %s" % (SECONDS, seed, len(holders),
                                                                        len(by_kind), kills))
        self.assertGreater(len(holders), 20, "the workload ran (" + msg + ")")
        self.assertTrue(kills["python"] > 0 and kills["go"] > 0, "both kinds killed: %s" % kills)
