"""Table (an agent of a lock table), Lock (a grant) and the context managers."""

import asyncio
import ctypes
import json
import threading

from . import _lib
from ._errors import BadHandle, Closed, Error, NotAvailable, Stolen

SHARED, IF_AVAILABLE, STEAL = 1, 2, 4
_NO_TIMEOUT, _NO_CANCEL = ctypes.c_int64(-1), ctypes.c_uint64(0)


def _name_bytes(name):
    if isinstance(name, str):
        return name.encode("utf-8", "surrogateescape")
    if isinstance(name, (bytes, bytearray, memoryview)):
        return bytes(name)
    raise TypeError("shmlocks: a lock name is str or bytes, not %s" % type(name).__name__)


def _timeout_ms(timeout):
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("shmlocks: timeout %r is negative (None waits for ever)" % (timeout,))
    return int(timeout * 1000 + 0.999)  # a timeout > 0 never rounds to 0 ms (which fails at once)


class Lock:
    """A granted lock. Release it (or leave the with block) when done."""

    __slots__ = ("name", "token", "shared", "table", "_h", "__weakref__")

    # _h is the library's lock handle (an int).

    def __init__(self, name, token, shared, table, handle):
        self.name, self.token, self.shared, self.table, self._h = name, token, shared, table, handle

    def release(self):
        """Releases the lock. Stolen if it was stolen or reaped while held,
        Closed if its table was closed; BadHandle if released already."""
        l, s = _lib.lib(), _lib.scratch()
        rc = l.shmlocks_release(ctypes.c_uint64(self._h), s[5])
        if rc:
            _lib.check(rc, s[2])

    def lost(self):
        """True if the lock was stolen, reaped or its table closed since it was granted."""
        l, err, out = _lib.lib(), _lib.new_error(), ctypes.c_int()
        _lib.check(l.shmlocks_lost(self._h, ctypes.byref(out), ctypes.byref(err)), err)
        return bool(out.value)

    def fileno(self):
        """A descriptor that becomes readable when the lock is lost (for select,
        poll or loop.add_reader). The library owns it; it closes at release."""
        l, err, out = _lib.lib(), _lib.new_error(), ctypes.c_int()
        _lib.check(l.shmlocks_lost_fd(self._h, ctypes.byref(out), ctypes.byref(err)), err)
        return out.value

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        try:
            self.release()
        except (Stolen, Closed):
            if et is None:
                raise  # the section did not run under the lock to its end
        return False

    def __repr__(self):
        return "<shmlocks.Lock %r %s token=%d>" % (self.name, "shared" if self.shared else "exclusive", self.token)


class _Claim:
    """The outcome of a request made on another thread, owned by exactly one
    side: the waiter that takes it, or, once the waiter gave up (cancelled,
    interrupted), the thread itself, which releases a grant that came late."""

    def __init__(self):
        self.mu = threading.Lock()
        self.result = None  # (lock, None) or (None, exception)
        self.abandoned = False

    def finish(self, result):
        """Called by the thread; True if the waiter will take result."""
        with self.mu:
            if not self.abandoned:
                self.result = result
                return True
        if result[0] is not None:
            _release_quietly(result[0])
        return False

    def abandon(self):
        """Called by the waiter that gives up: releases a grant already made."""
        with self.mu:
            self.abandoned = True
            result, self.result = self.result, None
        if result is not None and result[0] is not None:
            _release_quietly(result[0])


def _release_quietly(lock):
    try:
        lock.release()
    except Error:
        pass


class Table:
    """An agent (a Web Locks client) of a lock table file. path None: the
    default table ($SHMLOCKS_TABLE, else the user's default, as the shmlocks
    command). options (used when the file is created): maxResources,
    maxRequests, maxAgents, maxNameLen, fileMode, fairness ("bounded:1ms")."""

    def __init__(self, path=None, **options):
        l, err, h = _lib.lib(), _lib.new_error(), ctypes.c_uint64()
        p = None if path is None else str(path).encode()
        o = json.dumps(options).encode() if options else None
        _lib.check(l.shmlocks_open(p, o, ctypes.byref(h), ctypes.byref(err)), err)
        self._h, self.path = h.value, path
        self._hc = ctypes.c_uint64(h.value)

    def close(self):
        """Releases every lock taken through this Table and deregisters it."""
        l, err = _lib.lib(), _lib.new_error()
        _lib.check(l.shmlocks_close(self._h, ctypes.byref(err)), err)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def client_id(self):
        l, err, p = _lib.lib(), _lib.new_error(), ctypes.c_void_p()
        _lib.check(l.shmlocks_client_id(self._h, ctypes.byref(p), ctypes.byref(err)), err)
        return _lib.take_string(l, p).decode()

    def query(self):
        """Every agent's held locks and pending requests (pending in queue
        order per name): {"held": [...], "pending": [...]}, each with name,
        mode, clientId, pid (and a holder's token)."""
        l, err, p = _lib.lib(), _lib.new_error(), ctypes.c_void_p()
        _lib.check(l.shmlocks_query(self._h, ctypes.byref(p), None, ctypes.byref(err)), err)
        return json.loads(_lib.take_string(l, p))

    def lock(self, name, shared=False, if_available=False, steal=False, timeout=None):
        """A context manager for `with` and `async with` that requests name and
        holds it for the block (see shmlocks.lock)."""
        return _LockRequest(self, name, shared, if_available, steal, timeout)

    def _call(self, nb, flags, ms, cancel):
        l, s = _lib.lib(), _lib.scratch()
        rc = l.shmlocks_request(self._hc, nb, ctypes.c_size_t(len(nb)), ctypes.c_uint32(flags),
                                _NO_TIMEOUT if ms < 0 else ctypes.c_int64(ms),
                                _NO_CANCEL if not cancel else ctypes.c_uint64(cancel), s[3], s[4], s[5])
        if rc:
            _lib.check(rc, s[2])
        return s[0].value, s[1].value

    def acquire(self, name, shared=False, if_available=False, steal=False, timeout=None, cancel=None):
        """Waits until name is granted and returns its Lock (release it).
        cancel: a CancelToken another thread may cancel (Aborted). The wait is
        interruptible (KeyboardInterrupt) in the main thread."""
        nb, flags, ms = self._args(name, shared, if_available, steal, timeout)
        if cancel is not None:
            return self._grant(name, shared, self._call(nb, flags, ms, cancel.handle))
        if flags & (IF_AVAILABLE | STEAL) or ms == 0:
            return self._grant(name, shared, self._call(nb, flags, ms, 0))
        try:  # without waiting first: one call on the uncontended path
            return self._grant(name, shared, self._call(nb, flags | IF_AVAILABLE, ms, 0))
        except NotAvailable:
            pass
        if threading.current_thread() is not threading.main_thread():
            return self._grant(name, shared, self._call(nb, flags, ms, 0))
        # The main thread waits where a signal (Ctrl-C) can reach it: the
        # request runs on a thread of its own, abandoned on an exception.
        claim, done = _Claim(), threading.Event()
        cancel = CancelToken()
        self._start(claim, nb, flags, ms, name, shared, cancel, done.set)
        try:
            done.wait()
        except BaseException:
            cancel.cancel()
            claim.abandon()
            raise
        return self._take(claim)

    async def acquire_async(self, name, shared=False, if_available=False, steal=False, timeout=None):
        """acquire for asyncio: the wait runs on a thread of its own; cancelling
        the task aborts the request, and a grant that raced with the
        cancellation is released."""
        nb, flags, ms = self._args(name, shared, if_available, steal, timeout)
        if flags & (IF_AVAILABLE | STEAL) or ms == 0:
            return self._grant(name, shared, self._call(nb, flags, ms, 0))
        try:
            return self._grant(name, shared, self._call(nb, flags | IF_AVAILABLE, ms, 0))
        except NotAvailable:
            pass
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def wake():
            try:
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))
            except RuntimeError:  # the loop is closed: nobody will take the grant
                claim.abandon()

        claim, cancel = _Claim(), CancelToken()
        self._start(claim, nb, flags, ms, name, shared, cancel, wake)
        try:
            await fut
        except BaseException:
            cancel.cancel()
            claim.abandon()
            raise
        return self._take(claim)

    def _args(self, name, shared, if_available, steal, timeout):
        flags = (SHARED if shared else 0) | (IF_AVAILABLE if if_available else 0) | (STEAL if steal else 0)
        return _name_bytes(name), flags, _timeout_ms(timeout)

    def _grant(self, name, shared, ht):
        return Lock(name, ht[1], bool(shared), self, ht[0])

    def _start(self, claim, nb, flags, ms, name, shared, cancel, notify):
        def run():
            try:
                res = (self._grant(name, shared, self._call(nb, flags, ms, cancel.handle)), None)
            except BaseException as e:
                res = (None, e)
            finally:
                cancel.free()
            if claim.finish(res):
                notify()
        threading.Thread(target=run, name="shmlocks-request", daemon=True).start()

    @staticmethod
    def _take(claim):
        with claim.mu:
            res, claim.result = claim.result, None
        if res[1] is not None:
            raise res[1]
        return res[0]


class CancelToken:
    """Aborts the requests made with it (Table.acquire(cancel=...)), waiting
    or later, with Aborted: cancel() may be called from any thread. Free it
    (free(), or a with block) once those requests returned."""

    def __init__(self):
        l, err, h = _lib.lib(), _lib.new_error(), ctypes.c_uint64()
        _lib.check(l.shmlocks_cancel_new(ctypes.byref(h), ctypes.byref(err)), err)
        self.handle = h.value
        self.mu = threading.Lock()

    def cancel(self):
        with self.mu:
            if self.handle:
                err = _lib.new_error()
                _lib.lib().shmlocks_cancel(self.handle, ctypes.byref(err))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    def free(self):
        with self.mu:
            h, self.handle = self.handle, 0
        if h:
            err = _lib.new_error()
            _lib.lib().shmlocks_cancel_free(h, ctypes.byref(err))


class _LockRequest:
    """What lock() returns: `with` acquires in __enter__, `async with` in
    __aenter__; both release at the end of the block."""

    __slots__ = ("_t", "_a", "_l")

    def __init__(self, table, name, shared, if_available, steal, timeout):
        self._t, self._a, self._l = table, (name, shared, if_available, steal, timeout), None

    def __enter__(self):
        t = self._t() if callable(self._t) else self._t
        self._l = t.acquire(*self._a)
        return self._l

    def __exit__(self, et, ev, tb):
        l, self._l = self._l, None
        return l.__exit__(et, ev, tb)

    async def __aenter__(self):
        t = self._t() if callable(self._t) else self._t
        self._l = await t.acquire_async(*self._a)
        return self._l

    async def __aexit__(self, et, ev, tb):
        l, self._l = self._l, None
        return l.__exit__(et, ev, tb)



