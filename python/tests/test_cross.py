"""One table, four kinds of process: Python (the module), C (libshmlocks.so),
Go (package manager) and the shmlocks command share one name's locks with
one set of semantics."""

import os
import select
import signal
import subprocess
import sys
import unittest

import helpers
from helpers import EVENTUALLY, TableTest, eventually, held, pending

import shmlocks


class Exclusion(TableTest):
    def test_python_holder_excludes_go(self):
        py, go = self.agent("python"), self.agent("go")
        py.send("acquire inv")
        t1 = py.acquired()
        go.send("acquire inv")
        go.silent("a Go request must wait while a Python process holds the name")
        go2 = self.agent("go")
        go2.send("acquire inv ifavail")
        go2.expect("error SHMLOCKS_ERR_NOT_AVAILABLE")
        py.send("release")
        py.expect("released")
        self.assertGreater(go.acquired(), t1)

    def test_go_holder_excludes_python_and_c(self):
        go, py, c = self.agent("go"), self.agent("python"), self.agent("c")
        go.send("acquire inv")
        t1 = go.acquired()
        py.send("acquire inv")
        py.silent("a Python request must wait while a Go process holds the name")
        c.send("acquire inv ifavail")
        c.expect("error SHMLOCKS_ERR_NOT_AVAILABLE")
        with self.assertRaises(shmlocks.NotAvailable):
            self.t.acquire("inv", if_available=True)
        go.send("release")
        go.expect("released")
        self.assertGreater(py.acquired(), t1)


class FIFOAcrossLanguages(TableTest):
    def test_fifo_and_tokens_across_c_python_go_and_exec(self):
        """A Python holder, then C, Python, Go and shmlocks exec queued in that
        order: granted in that order, one at a time, tokens increasing."""
        name = "job"
        holder = self.t.acquire(name)
        waiters = []
        for kind in ("c", "python", "go", "exec", "c", "go"):
            if kind == "exec":
                w = self.exec_(name)
            else:
                w = self.agent(kind)
                w.send("acquire " + name)
            waiters.append(w)
            eventually(lambda: len(pending(self.t, name)) == len(waiters),
                       "the %s request queued %d-th" % (kind, len(waiters)))
        q = pending(self.t, name)
        self.assertEqual([p["pid"] for p in q], [w.p.pid for w in waiters[:3]] + [q[3]["pid"]] + [w.p.pid for w in waiters[4:]],
                         "query lists the queue in arrival order")
        last = holder.token
        holder.release()
        for i, w in enumerate(waiters):
            tok = w.acquired()
            self.assertGreater(tok, last, "%s (%d-th) token" % (w.kind, i))
            last = tok
            for later in waiters[i + 1:]:
                line = later.lines.read(0)
                self.assertIsNone(line, "%s granted before the %s ahead of it released" % (later.kind, w.kind))
            if w.kind == "exec":
                w.release()
            else:
                w.send("release")
                w.expect("released")
        self.assertEqual(held(self.t, name), [])


class Death(TableTest):
    def test_sigkilled_python_holder_is_reaped_like_go(self):
        for kind in ("python", "go"):
            with self.subTest(holder=kind):
                holder, c = self.agent(kind), self.agent("c")
                holder.send("acquire d")
                t1 = holder.acquired()
                c.send("acquire d")
                c.silent("waits while the %s holder lives" % kind)
                holder.kill()
                self.assertGreater(c.acquired(EVENTUALLY), t1, "granted after the %s holder's death" % kind)
                c.send("release")
                c.expect("released")

    def test_sigkilled_waiter_leaves_the_queue(self):
        holder = self.t.acquire("w")
        py, go = self.agent("python"), self.agent("go")
        py.send("acquire w")
        eventually(lambda: len(pending(self.t, "w")) == 1, "python queued")
        go.send("acquire w")
        eventually(lambda: len(pending(self.t, "w")) == 2, "go queued")
        py.kill()
        eventually(lambda: len(pending(self.t, "w")) == 1, "the dead Python waiter reaped from the queue")
        holder.release()
        go.acquired()


class Lost(TableTest):
    def test_python_sees_its_stolen_lock_through_the_descriptor(self):
        py, go = self.agent("python"), self.agent("go")
        py.send("acquire s")
        py.acquired()
        py.send("waitlost 200")
        py.expect("notlost")
        go.send("acquire s steal")
        go.acquired()
        py.send("waitlost %d" % (EVENTUALLY * 1000))
        py.expect("lost")
        py.send("release")
        py.expect("error SHMLOCKS_ERR_STOLEN")

    def test_c_sees_its_stolen_lock_through_the_descriptor(self):
        c = self.agent("c")
        c.send("acquire s")
        c.acquired()
        stealer = self.t.acquire("s", steal=True)
        c.send("waitlost %d" % (EVENTUALLY * 1000))
        c.expect("lost")
        c.send("release")
        c.expect("error SHMLOCKS_ERR_STOLEN")
        stealer.release()

    def test_lost_in_this_process(self):
        other = shmlocks.Table(self.path)
        self.addCleanup(other.close)
        l = self.t.acquire("x")
        fd = l.fileno()
        self.assertEqual(select.select([fd], [], [], 0.05)[0], [])
        self.assertFalse(l.lost())
        s = other.acquire("x", steal=True)
        self.assertEqual(select.select([fd], [], [], EVENTUALLY)[0], [fd])
        self.assertTrue(l.lost())
        with self.assertRaises(shmlocks.Stolen):
            l.release()
        with self.assertRaises(shmlocks.BadHandle):
            l.release()
        s.release()


if __name__ == "__main__":
    unittest.main()
