"""Loading libshmlocks.so (on first use) and calling it through ctypes.

The library holds a Go runtime, which does not survive fork: a child forked
after the library was loaded would hang on its first call. So the library is
loaded lazily, on the first call that needs it, and a process that forked
after loading it gets ForkError from every call (os.register_at_fork), before
anything reaches the library (whose own check returns SHMLOCKS_ERR_FORK too).
"""

import ctypes
import os
import threading

from ._errors import ForkError, LibraryNotFound, from_code

_load_lock = threading.Lock()
_lib = None
_load_pid = None
_forked_from = None


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("message", ctypes.c_char * 508)]


_u64 = ctypes.c_uint64
_p_u64 = ctypes.POINTER(ctypes.c_uint64)
_p_err = ctypes.POINTER(_Error)
_p_char_p = ctypes.POINTER(ctypes.c_void_p)

_SIGNATURES = {
    "shmlocks_abi_version": ([], ctypes.c_int),
    "shmlocks_open": ([ctypes.c_char_p, ctypes.c_char_p, _p_u64, _p_err], ctypes.c_int),
    "shmlocks_close": ([_u64, _p_err], ctypes.c_int),
    "shmlocks_cancel_new": ([_p_u64, _p_err], ctypes.c_int),
    "shmlocks_cancel": ([_u64, _p_err], ctypes.c_int),
    "shmlocks_cancel_free": ([_u64, _p_err], ctypes.c_int),
    # shmlocks_request and shmlocks_release, the lock's fast path, have no
    # argtypes (their conversion would double a lock's cost): their callers
    # pass ctypes objects of the exact C types (_table.py).
    "shmlocks_request": (None, ctypes.c_int),
    "shmlocks_release": (None, ctypes.c_int),
    "shmlocks_lost": ([_u64, ctypes.POINTER(ctypes.c_int), _p_err], ctypes.c_int),
    "shmlocks_lost_fd": ([_u64, ctypes.POINTER(ctypes.c_int), _p_err], ctypes.c_int),
    "shmlocks_query": ([_u64, _p_char_p, ctypes.POINTER(ctypes.c_size_t), _p_err], ctypes.c_int),
    "shmlocks_client_id": ([_u64, _p_char_p, _p_err], ctypes.c_int),
    "shmlocks_free": ([ctypes.c_void_p], None),
}

ABI_VERSION = 1


def library_path():
    """Where the library is looked for: $SHMLOCKS_LIB, else libshmlocks.so beside
    this package, else lib/ of the source tree this package is in (make lib),
    else the system loader's search path."""
    env = os.environ.get("SHMLOCKS_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "libshmlocks.so"),
              os.path.join(here, os.pardir, os.pardir, "lib", "libshmlocks.so")):
        if os.path.exists(p):
            return os.path.normpath(p)
    return "libshmlocks.so"


def _after_fork_in_child():
    global _forked_from
    if _lib is not None:
        _forked_from = _load_pid


os.register_at_fork(after_in_child=_after_fork_in_child)


def lib():
    """The loaded library (loading it on first use); ForkError after a fork."""
    global _lib, _load_pid
    if _forked_from is not None:
        raise ForkError(
            "shmlocks: this process (%d) was forked from %d after it loaded libshmlocks, whose Go runtime "
            "does not survive fork: import is lazy, so use shmlocks only in the children (e.g. gunicorn "
            "without --preload, multiprocessing's 'spawn' start method)" % (os.getpid(), _forked_from))
    if _lib is not None:
        return _lib
    with _load_lock:
        if _lib is None:
            path = library_path()
            try:
                l = ctypes.CDLL(path)  # CDLL: every call releases the GIL
            except OSError as e:
                raise LibraryNotFound(
                    "shmlocks: cannot load %s: %s (build it with 'make lib', or set SHMLOCKS_LIB; "
                    "a Go c-shared library cannot be loaded by musl libc)" % (path, e)) from None
            for fn, (args, res) in _SIGNATURES.items():
                f = getattr(l, fn)
                if args is not None:
                    f.argtypes = args
                f.restype = res
            v = l.shmlocks_abi_version()
            if v < ABI_VERSION:
                raise LibraryNotFound("shmlocks: %s has ABI version %d, this module needs %d" % (path, v, ABI_VERSION))
            _load_pid = os.getpid()
            _lib = l
    return _lib


def check(rc, err):
    """Raises the exception of a non-zero return code."""
    if rc != 0:
        raise from_code(rc, err.message.decode("utf-8", "replace"))


def new_error():
    return _Error()


_tls = threading.local()


def scratch():
    """This thread's outputs of a request: (lock, token, error) and pointers
    to them (a call releases the GIL: threads cannot share them)."""
    try:
        return _tls.s
    except AttributeError:
        h, tok, err = ctypes.c_uint64(), ctypes.c_uint64(), _Error()
        _tls.s = s = (h, tok, err, ctypes.byref(h), ctypes.byref(tok), ctypes.byref(err))
        return s


def take_string(l, p):
    """A string returned by the library, freed."""
    try:
        return ctypes.string_at(p.value)
    finally:
        l.shmlocks_free(p)
