"""The module and the ABI under misuse: fork, bad input through the C
functions themselves, asyncio cancellation and the lost descriptor in an
event loop."""

import asyncio
import ctypes
import multiprocessing
import os
import select
import subprocess
import sys
import textwrap
import time

from helpers import EVENTUALLY, QUIET, ROOT, TableTest, eventually, held, pending

import shmlocks
from shmlocks import _lib


def run_child(fn):
    """Runs fn in a forked child; returns (exit status, its output), within a deadline."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal_alarm = __import__("signal")
        signal_alarm.alarm(int(EVENTUALLY))  # a hang ends the child (SIGALRM), never the test
        try:
            out = fn()
            os.write(w, str(out).encode())
            os._exit(0)
        except BaseException as e:
            os.write(w, ("%s: %s" % (type(e).__name__, e)).encode())
            os._exit(1)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, st = os.waitpid(pid, 0)
    return st, data.decode()


class Fork(TableTest):
    def test_forked_child_gets_fork_error_never_a_hang(self):
        l = self.t.acquire("f")
        for what, fn in (("acquire", lambda: shmlocks.Table(self.path).acquire("g")),
                         ("release", l.release), ("query", self.t.query)):
            st, out = run_child(fn)
            self.assertEqual(os.waitstatus_to_exitcode(st), 1, "%s in the child: %s" % (what, out))
            self.assertTrue(out.startswith("ForkError: "), out)
            self.assertIn("forked from %d" % os.getpid(), out)
        # The C library's own check, without the module's: every function says FORK.
        def raw():
            err, h = _lib.new_error(), ctypes.c_uint64()
            rcs = [_lib._lib.shmlocks_open(self.path.encode(), None, ctypes.byref(h), ctypes.byref(err)),
                   _lib._lib.shmlocks_release(ctypes.c_uint64(l._h), ctypes.byref(err))]
            return "%s %s" % (rcs, err.message.decode())
        st, out = run_child(raw)
        self.assertEqual(os.waitstatus_to_exitcode(st), 0, out)
        self.assertTrue(out.startswith("[13, 13] shmlocks: called in process"), out)
        # Nothing the parent holds was lost, and it still works.
        self.assertFalse(l.lost())
        self.assertEqual([h["pid"] for h in held(self.t, "f")], [os.getpid()])
        l.release()
        self.t.acquire("f").release()

    def test_forked_child_does_not_keep_a_dead_parents_locks(self):
        # A holder forks a child that outlives it (a pre-forking server's
        # worker): the child closes the library's descriptors of the table
        # at the fork, so the parent's SIGKILL frees its lock for the next
        # holder while the child still runs.
        code = textwrap.dedent("""
            import os, sys, time
            sys.path.insert(0, %r)
            import shmlocks
            l = shmlocks.Table(%r).acquire("orphaned")
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            print(pid, flush=True)
            time.sleep(60)
        """) % (os.path.join(ROOT, "python"), self.path)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        child = None
        try:
            child = int(p.stdout.readline())
            eventually(lambda: len(held(self.t, "orphaned")) == 1, "the parent holds it")
            p.kill()
            p.wait()
            os.kill(child, 0)  # the forked child still runs
            l = self.t.acquire("orphaned", timeout=EVENTUALLY)
            l.release()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            if child:
                os.kill(child, 9)

    def test_multiprocessing_fork_and_spawn(self):
        self.t.query()  # loaded in this process
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as p:
            r = p.apply_async(_child_acquire, (self.path,))
            self.assertTrue(r.get(EVENTUALLY).startswith("ForkError"), "fork after load")
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as p:
            r = p.apply_async(_child_acquire, (self.path,))
            self.assertTrue(r.get(EVENTUALLY * 2).startswith("token "), "spawn loads its own")

    def test_fork_before_load_is_fine(self):
        code = textwrap.dedent("""
            import os, sys
            sys.path.insert(0, %r)
            import shmlocks
            pid = os.fork()  # imported, not loaded: the child loads its own
            with shmlocks.lock("x", table=%r, timeout=10) as l:
                print(("child" if pid == 0 else "parent"), l.token, flush=True)
            if pid:
                os.waitpid(pid, 0)
        """) % (os.path.join(ROOT, "python"), self.path)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=EVENTUALLY * 2, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(sorted(l.split()[0] for l in out.stdout.splitlines()), ["child", "parent"])


def _child_acquire(path):
    try:
        with shmlocks.lock("m", table=path, timeout=10) as l:
            return "token %d" % l.token
    except shmlocks.Error as e:
        return "%s: %s" % (type(e).__name__, e)


class Interrupt(TableTest):
    def test_ctrl_c_withdraws_a_waiting_request_of_the_main_thread(self):
        h = self.t.acquire("k")
        code = textwrap.dedent("""
            import sys
            sys.path.insert(0, %r)
            import shmlocks
            try:
                shmlocks.lock("k", table=%r).__enter__()
                print("granted?!", flush=True)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
        """) % (os.path.join(ROOT, "python"), self.path)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            eventually(lambda: len(pending(self.t, "k")) == 1, "the child's request queued")
            p.send_signal(__import__("signal").SIGINT)
            out, _ = p.communicate(timeout=EVENTUALLY)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(out, "interrupted\n")
        self.assertEqual(pending(self.t, "k"), [])
        h.release()
        self.assertEqual(held(self.t, "k"), [])


class BadInput(TableTest):
    """Bad input through the C functions: an error with a code and a message,
    never a crash, a hang or a lost lock."""

    def call(self, fn, *args):
        err = _lib.new_error()
        rc = getattr(_lib._lib, fn)(*args, ctypes.byref(err))
        return rc, err.message.decode()

    def test_handles_and_pointers(self):
        l = self.t.acquire("h")
        other = self.t.acquire("h2")
        th = ctypes.c_uint64(self.t._h)
        junk = os.path.join(self.dir, "junk.tbl")
        with open(junk, "wb") as f:
            f.write(b"not a lock table" * 512)
        out, tok = ctypes.c_uint64(), ctypes.c_uint64()
        u64 = ctypes.c_uint64
        cases = [
            ("release of a table handle", "shmlocks_release", (th,), 11, "not a lock handle"),
            ("release of 0", "shmlocks_release", (u64(0),), 12, "lock handle is 0"),
            ("release of garbage", "shmlocks_release", (u64(0xdeadbeef),), 11, "not a lock handle"),
            ("release of a never-issued lock", "shmlocks_release", (u64(0x52 << 56 | 999999),), 11, "not live"),
            ("request on a lock handle", "shmlocks_request",
             (u64(l._h), b"x", ctypes.c_size_t(1), 0, ctypes.c_int64(-1), u64(0), ctypes.byref(out), ctypes.byref(tok)),
             11, "not a table handle"),
            ("NULL name with a length", "shmlocks_request",
             (th, None, ctypes.c_size_t(5), 0, ctypes.c_int64(-1), u64(0), ctypes.byref(out), ctypes.byref(tok)),
             12, "name is NULL"),
            ("a huge name length", "shmlocks_request",
             (th, b"x", ctypes.c_size_t(1 << 40), 0, ctypes.c_int64(-1), u64(0), ctypes.byref(out), ctypes.byref(tok)),
             1, "MaxNameLen (256)"),
            ("unknown flag bits", "shmlocks_request",
             (th, b"x", ctypes.c_size_t(1), 0x80, ctypes.c_int64(-1), u64(0), ctypes.byref(out), ctypes.byref(tok)),
             12, "unknown bits 0x80"),
            ("NULL outputs", "shmlocks_request",
             (th, b"x", ctypes.c_size_t(1), 0, ctypes.c_int64(-1), u64(0), None, None), 12, "NULL"),
            ("a freed cancel token", "shmlocks_request",
             (th, b"x", ctypes.c_size_t(1), 0, ctypes.c_int64(-1), u64(0x53 << 56 | 999999), ctypes.byref(out),
              ctypes.byref(tok)), 11, "cancel token handle"),
            ("lost_fd with NULL", "shmlocks_lost_fd", (u64(l._h), None), 12, "NULL"),
            ("query with NULL", "shmlocks_query", (th, None, None), 12, "NULL"),
            ("open with an unknown option", "shmlocks_open",
             (self.path.encode(), b'{"maxNames": 3}', ctypes.byref(out)), 12, 'unknown field "maxNames"'),
            ("open of a file that is not a table", "shmlocks_open",
             (junk.encode(), None, ctypes.byref(out)), 8, "junk.tbl"),
            ("open in a missing directory", "shmlocks_open",
             (b"/nonexistent-dir/x/t.tbl", None, ctypes.byref(out)), 14, "/nonexistent-dir"),
        ]
        for what, fn, args, code, msg in cases:
            with self.subTest(what):
                rc, m = self.call(fn, *args)
                self.assertEqual(rc, code, "%s: %s" % (what, m))
                self.assertIn(msg, m)
        # Nothing held was lost.
        self.assertFalse(l.lost() or other.lost())
        self.assertEqual(sorted(h["name"] for h in held(self.t, "h") + held(self.t, "h2")), ["h", "h2"])
        l.release()
        other.release()

    def test_double_release_across_threads(self):
        """Two threads release one handle: one succeeds, the other is refused."""
        import threading
        for _ in range(50):
            l = self.t.acquire("d")
            res = []
            ts = [threading.Thread(target=lambda: res.append(self.call("shmlocks_release", ctypes.c_uint64(l._h))[0]))
                  for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(EVENTUALLY)
            self.assertEqual(sorted(res), [0, 11])
        self.assertEqual(held(self.t, "d"), [])


class Async(TableTest):
    def test_async_with_and_cancel_aborts_the_request(self):
        other = shmlocks.Table(self.path)
        self.addCleanup(other.close)

        async def main():
            async with self.t.lock("a") as l:
                t1 = l.token
                task = asyncio.ensure_future(_hold(other, "a"))
                await asyncio.to_thread(eventually, lambda: len(pending(self.t, "a")) == 1, "queued")
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await asyncio.wait_for(task, EVENTUALLY)
                await asyncio.to_thread(eventually, lambda: pending(self.t, "a") == [], "the request withdrawn")
            async with shmlocks.lock("a", table=self.path, timeout=EVENTUALLY) as l2:
                self.assertGreater(l2.token, t1)
        asyncio.run(main())

    def test_grant_racing_the_cancel_is_released(self):
        """Cancel a waiting task at the moment its grant comes, many times: a
        grant that arrived after the cancel is released, never kept."""
        other = shmlocks.Table(self.path)
        self.addCleanup(other.close)

        async def main():
            for i in range(30):
                h = self.t.acquire("r")
                task = asyncio.ensure_future(_hold(other, "r"))
                await asyncio.to_thread(eventually, lambda: len(pending(self.t, "r")) == 1, "queued")
                h.release()
                await asyncio.sleep((i % 6) * 0.0002)  # varies which side wins; correctness does not depend on it
                task.cancel()
                try:
                    await asyncio.wait_for(task, EVENTUALLY)
                except asyncio.CancelledError:
                    pass
                await asyncio.to_thread(eventually, lambda: held(self.t, "r") == [] and pending(self.t, "r") == [],
                                        "nothing held or queued after the cancel (round %d)" % i)
        asyncio.run(main())

    def test_lost_descriptor_in_the_event_loop(self):
        other = shmlocks.Table(self.path)
        self.addCleanup(other.close)

        async def main():
            loop = asyncio.get_running_loop()
            l = await self.t.acquire_async("e")
            lost = loop.create_future()
            loop.add_reader(l.fileno(), lambda: lost.done() or lost.set_result(True))
            await asyncio.sleep(QUIET)
            self.assertFalse(lost.done())
            await asyncio.to_thread(lambda: other.acquire("e", steal=True).release())
            self.assertTrue(await asyncio.wait_for(lost, EVENTUALLY))
            loop.remove_reader(l.fileno())
            with self.assertRaises(shmlocks.Stolen):
                l.release()
        asyncio.run(main())


async def _hold(table, name):
    async with table.lock(name):
        await asyncio.sleep(3600)


if __name__ == "__main__":
    import unittest
    unittest.main()
