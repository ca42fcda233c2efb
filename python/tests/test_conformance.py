"""The conformance cases of manager/managertest (managertest.go) that the C
ABI can express, run through the Python module: each Table is an agent of
its own, requests in the background run on threads (as AcquireAsync runs
goroutines)."""

import queue
import threading
import unittest

from helpers import EVENTUALLY, QUIET, TableTest, eventually, held, pending

import shmlocks


class Background:
    """A request on a thread: MustBlock, MustGrant and MustFail of managertest."""

    def __init__(self, table, name, **kw):
        self.q = queue.Queue()

        def run():
            try:
                self.q.put((table.acquire(name, **kw), None))
            except shmlocks.Error as e:
                self.q.put((None, e))
        threading.Thread(target=run, daemon=True).start()

    def must_block(self, tc, what):
        try:
            l, e = self.q.get(timeout=QUIET)
        except queue.Empty:
            return
        tc.fail("%s: not blocked (lock %r, error %r)" % (what, l, e))

    def must_grant(self, tc, what):
        try:
            l, e = self.q.get(timeout=EVENTUALLY)
        except queue.Empty:
            tc.fail("%s: not granted within %ss" % (what, EVENTUALLY))
        tc.assertIsNone(e, what)
        return l

    def must_fail(self, tc, exc, what):
        try:
            l, e = self.q.get(timeout=EVENTUALLY)
        except queue.Empty:
            tc.fail("%s: did not fail within %ss" % (what, EVENTUALLY))
        tc.assertIsInstance(e, exc, what)


class Conformance(TableTest):
    def open(self):
        t = shmlocks.Table(self.path)
        self.addCleanup(lambda: _close(t))
        return t

    def wait_pending(self, name, n):
        eventually(lambda: len(pending(self.t, name)) == n, "%d pending on %s" % (n, name))

    def test_exclusive_across_clients(self):
        a, b = self.open(), self.open()
        l = a.acquire("x")
        self.assertEqual((l.name, l.shared), ("x", False))
        ch = Background(b, "x")
        ch.must_block(self, "exclusive of another client while held")
        ch2 = Background(a, "x")
        self.wait_pending("x", 2)
        ch2.must_block(self, "exclusive of the same client while held")
        l.release()
        l2 = ch.must_grant(self, "first waiter")
        ch2.must_block(self, "second waiter while the first holds")
        self.assertGreater(l2.token, l.token)
        l2.release()
        ch2.must_grant(self, "second waiter").release()

    def test_shared_together(self):
        a, b = self.open(), self.open()
        s1, s2 = a.acquire("s", shared=True), b.acquire("s", shared=True)
        self.assertNotEqual(s1.token, s2.token)
        x = Background(a, "s")
        x.must_block(self, "exclusive while shared held")
        s1.release()
        x.must_block(self, "exclusive while one shared holder remains")
        s2.release()
        x.must_grant(self, "exclusive after the shared holders").release()

    def test_shared_never_overtakes_exclusive(self):
        a, b = self.open(), self.open()
        s1 = a.acquire("r", shared=True)
        x = Background(b, "r")
        self.wait_pending("r", 1)
        s2 = Background(a, "r", shared=True)
        self.wait_pending("r", 2)
        s2.must_block(self, "shared behind a queued exclusive")
        s1.release()
        xl = x.must_grant(self, "exclusive")
        s2.must_block(self, "shared while exclusive held")
        xl.release()
        s2.must_grant(self, "shared after the exclusive").release()

    def test_fifo_per_request(self):
        ms = [self.open(), self.open()]
        h = ms[0].acquire("q")
        chs = []
        for i in range(6):
            chs.append(Background(ms[i % 2], "q", shared=(i % 3 == 2)))
            self.wait_pending("q", i + 1)
        h.release()
        last = h.token
        for i, ch in enumerate(chs):
            l = ch.must_grant(self, "request %d" % i)
            for later in chs[i + 1:]:
                self.assertTrue(later.q.empty(), "a later request was granted before request %d was released" % i)
            self.assertGreater(l.token, last)
            last = l.token
            l.release()

    def test_no_barging_past_queue(self):
        a, b, c = self.open(), self.open(), self.open()
        l = a.acquire("b")
        x = Background(b, "b")
        self.wait_pending("b", 1)
        l.release()
        with self.assertRaises(shmlocks.NotAvailable):
            c.acquire("b", if_available=True).release()
        x.must_grant(self, "the queued request").release()

    def test_abort_head_lets_shared_in(self):
        a, b = self.open(), self.open()
        s1 = a.acquire("r", shared=True)
        tok = shmlocks.CancelToken()
        self.addCleanup(tok.free)
        x = Background(b, "r", cancel=tok)
        self.wait_pending("r", 1)
        s2 = Background(b, "r", shared=True)
        s3 = Background(a, "r", shared=True)
        self.wait_pending("r", 3)
        s2.must_block(self, "shared behind exclusive")
        tok.cancel()
        x.must_fail(self, shmlocks.Aborted, "aborted exclusive")
        for l in (s1, s2.must_grant(self, "s2 after the abort"), s3.must_grant(self, "s3 after the abort")):
            l.release()

    def test_abort_leaves_nothing(self):
        a, b = self.open(), self.open()
        h = a.acquire("a")
        with self.assertRaises(shmlocks.Timeout):
            b.acquire("a", timeout=QUIET)
        self.wait_pending("a", 0)
        h.release()
        b.acquire("a", if_available=True).release()

    def test_if_available(self):
        a, b = self.open(), self.open()
        l = a.acquire("n", if_available=True)
        with self.assertRaises(shmlocks.NotAvailable):
            b.acquire("n", if_available=True)
        with self.assertRaises(shmlocks.NotAvailable):
            with b.lock("n", if_available=True, shared=True):
                pass
        self.assertEqual(pending(self.t, "n"), [])
        l.release()
        s1 = a.acquire("n", shared=True)
        s2 = b.acquire("n", shared=True, if_available=True)
        x = Background(a, "n")
        self.wait_pending("n", 1)
        with self.assertRaises(shmlocks.NotAvailable):
            b.acquire("n", shared=True, if_available=True)
        s1.release()
        s2.release()
        x.must_grant(self, "exclusive").release()

    def test_steal(self):
        a, b, c = self.open(), self.open(), self.open()
        l = a.acquire("n")
        self.assertFalse(l.lost())
        waiting = Background(b, "n")
        self.wait_pending("n", 1)
        st = c.acquire("n", steal=True)
        eventually(l.lost, "the victim's lock lost")
        with self.assertRaises(shmlocks.Stolen):
            l.release()
        self.assertGreater(st.token, l.token)
        waiting.must_block(self, "request queued before the steal, while the stealer holds")
        h, p = held(self.t, "n"), pending(self.t, "n")
        self.assertEqual(([x["clientId"] for x in h], [x["clientId"] for x in p]), ([c.client_id], [b.client_id]))
        st.release()
        w = waiting.must_grant(self, "queued request after the stealer")
        self.assertGreater(w.token, st.token)
        w.release()
        nxt = a.acquire("n")
        self.assertGreater(nxt.token, w.token)
        nxt.release()

    def test_with_block_raises_stolen(self):
        a, b = self.open(), self.open()
        with self.assertRaises(shmlocks.Stolen):
            with a.lock("n"):
                b.acquire("n", steal=True).release()

    def test_query_order_and_clients(self):
        a, b = self.open(), self.open()
        self.assertNotEqual(a.client_id, b.client_id)
        h = a.acquire("q", shared=True)
        want = [(b, False), (a, True), (b, True), (a, False)]
        chs = []
        for i, (m, shared) in enumerate(want):
            chs.append(Background(m, "q", shared=shared))
            self.wait_pending("q", i + 1)
        hs, ps = held(b, "q"), pending(b, "q")
        self.assertEqual([(x["clientId"], x["mode"], x["token"]) for x in hs], [(a.client_id, "shared", h.token)])
        self.assertTrue(all(x["pid"] > 0 for x in hs + ps))
        self.assertEqual([(x["clientId"], x["mode"]) for x in ps],
                         [(m.client_id, "shared" if s else "exclusive") for m, s in want])
        h.release()
        for i, ch in enumerate(chs):
            ch.must_grant(self, "request %d" % i).release()
        self.assertEqual(held(a, "q") + pending(a, "q"), [])

    def test_tokens_increase(self):
        a, b = self.open(), self.open()
        last = 0
        for i in range(20):
            l = (a, b)[i % 2].acquire("t", steal=(i % 5 == 4))
            self.assertGreater(l.token, last, "grant %d" % i)
            last = l.token
            l.release()

    def test_validation_order(self):
        m = self.open()
        for name, kw in (("-x", {}), ("v", {"steal": True, "if_available": True}),
                         ("v", {"steal": True, "shared": True}), ("v" * 257, {})):
            with self.assertRaises(shmlocks.NotSupported, msg="%r %r" % (name[:8], kw)) as cm:
                m.acquire(name, **kw)
        self.assertIn("MaxNameLen (256)", str(cm.exception), "the message names the limit")
        m.acquire("v" * 256).release()  # exactly MaxNameLen works
        with shmlocks.CancelToken() as done:
            done.cancel()
            for kw in ({}, {"if_available": True}, {"steal": True}, {"shared": True}):
                with self.assertRaises(shmlocks.Aborted, msg=repr(kw)):
                    m.acquire("v", cancel=done, **kw)
                with self.assertRaises(shmlocks.Timeout, msg=repr(kw)):
                    m.acquire("v", timeout=0, **kw)
        self.assertEqual(pending(self.t, "v"), [])
        m.close()
        with self.assertRaises(shmlocks.Closed):
            m.acquire("-x")

    def test_names_are_bytes(self):
        a = self.open()
        for n in (b"a\x00b", "naïve", b"\xff\xfe"):
            l = a.acquire(n)
            q = held(self.t, n if isinstance(n, str) else n.decode("utf-8", "replace"))
            self.assertEqual(len(q), 1, repr(n))
            if n == b"\xff\xfe":
                self.assertEqual(q[0]["nameBase64"], "//4=")
            with self.assertRaises(shmlocks.NotAvailable):
                self.t.acquire(n, if_available=True)
            l.release()

    def test_release_twice(self):
        a, b = self.open(), self.open()
        l = a.acquire("r")
        l.release()
        l2 = b.acquire("r")
        with self.assertRaises(shmlocks.BadHandle):
            l.release()
        self.assertEqual([x["clientId"] for x in held(self.t, "r")], [b.client_id])
        l2.release()

    def test_close(self):
        a, b = self.open(), self.open()
        l = a.acquire("c")
        fd = l.fileno()
        other = b.acquire("d")
        pend = Background(a, "d")
        waiter = Background(b, "c")
        self.wait_pending("c", 1)
        self.wait_pending("d", 1)
        a.close()
        eventually(l.lost, "a lock released by close is lost")
        import select
        self.assertEqual(select.select([fd], [], [], EVENTUALLY)[0], [fd])
        pend.must_fail(self, shmlocks.Closed, "pending request of a closed table")
        w = waiter.must_grant(self, "waiter of another client after close")
        with self.assertRaises(shmlocks.Closed):
            l.release()
        with self.assertRaises(shmlocks.Closed):
            a.close()
        with self.assertRaises(shmlocks.Closed):
            a.acquire("c")
        with self.assertRaises(shmlocks.Closed):
            a.query()
        self.assertEqual((len(held(self.t, "d")), len(pending(self.t, "d"))), (1, 0))
        w.release()
        other.release()


def _close(t):
    try:
        t.close()
    except shmlocks.Error:
        pass


if __name__ == "__main__":
    unittest.main()
