"""shmlocks: the W3C Web Locks API for the processes of one machine, on the
lock table that Go programs (package manager), C programs (libshmlocks.so)
and the shmlocks command share.

    import shmlocks
    with shmlocks.lock("invoices", timeout=5) as l:
        write_invoices(fencing_token=l.token)

    async with shmlocks.lock("invoices") as l:   # cancelling the task aborts the request
        ...

    shmlocks.query()   # {"held": [...], "pending": [...]}

Standard library only: ctypes over libshmlocks.so ('make lib'), found through
$SHMLOCKS_LIB, beside this package, in lib/ of its source tree, or on the
loader's path, and loaded on first use. The table is table= if given, else
$SHMLOCKS_TABLE, else the user's default table, as the shmlocks command.

Fork: the library's Go runtime does not survive fork. A process that forks
before its first use of shmlocks is fine (gunicorn without --preload,
multiprocessing's spawn); a child forked after it gets ForkError from every
call, never a hang. See docs/c-abi.md.
"""

import atexit
import os
import threading

from . import _lib
from ._errors import (Aborted, BadHandle, Closed, Corrupt, Deadlock, Error, ForkError, InternalError,
                      InvalidArgument, LibraryNotFound, NotAvailable, NotSupported, OpenError, Stolen,
                      TableError, TableFull, Timeout, Unsafe)
from ._table import CancelToken, Lock, Table, _LockRequest

__all__ = ["lock", "query", "table", "Table", "Lock", "CancelToken", "Error", "NotSupported", "Aborted", "Timeout",
           "NotAvailable", "Stolen", "Closed", "TableFull", "TableError", "Corrupt", "Unsafe", "Deadlock",
           "BadHandle", "InvalidArgument", "ForkError", "OpenError", "InternalError", "LibraryNotFound"]

_tables = {}
_tables_mu = threading.Lock()


def table(path=None):
    """The process's shared Table of path (None: $SHMLOCKS_TABLE, else the
    default table), opened on first use and closed at exit."""
    return _shared_table(path)


def _shared_table(path):
    if path is None:
        path = os.environ.get("SHMLOCKS_TABLE") or None
    key = "" if path is None else os.fspath(path)
    t = _tables.get(key)
    if t is None:
        with _tables_mu:
            t = _tables.get(key)
            if t is None:
                t = _tables[key] = Table(path)
    return t


def lock(name, shared=False, if_available=False, steal=False, timeout=None, table=None):
    """Requests the lock name for a `with` or `async with` block and releases it
    at the end: the block receives the Lock (token, name, lost(), fileno()).

    shared: a shared lock (else exclusive). if_available: NotAvailable unless
    grantable at once. steal: take it from its holders (they see it lost).
    timeout: seconds (None: wait for ever; Timeout when it passes). Leaving
    the block raises Stolen if the lock was stolen meanwhile."""
    return _LockRequest(lambda: _shared_table(table), name, shared, if_available, steal, timeout)


def query(table=None):
    """Every agent's held locks and pending requests in the table, as a dict
    {"held": [...], "pending": [...]}."""
    return _shared_table(table).query()


@atexit.register
def _close_all():
    if _lib._forked_from is not None:
        return
    for t in list(_tables.values()):
        try:
            t.close()
        except Error:
            pass
