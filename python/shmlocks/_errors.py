"""The exceptions of shmlocks, one per error code of shmlocks.h."""


class Error(Exception):
    """Base of every shmlocks error. code is the C error code (SHMLOCKS_ERR_*),
    code_name its name."""

    code = -1
    code_name = "SHMLOCKS_ERR_UNKNOWN"


class NotSupported(Error, ValueError):
    """A name starting with '-' or longer than the table's MaxNameLen, or a
    forbidden option mix (steal with if_available or shared)."""
    code, code_name = 1, "SHMLOCKS_ERR_NOT_SUPPORTED"


class Aborted(Error):
    """The request was cancelled before it was granted."""
    code, code_name = 2, "SHMLOCKS_ERR_ABORTED"


class Timeout(Error, TimeoutError):
    """The timeout passed before the lock was granted."""
    code, code_name = 3, "SHMLOCKS_ERR_TIMEOUT"


class NotAvailable(Error):
    """if_available=True and the lock was not grantable at once."""
    code, code_name = 4, "SHMLOCKS_ERR_NOT_AVAILABLE"


class Stolen(Error):
    """The lock was stolen (or its holder reaped) while held."""
    code, code_name = 5, "SHMLOCKS_ERR_STOLEN"


class Closed(Error):
    """The table was closed."""
    code, code_name = 6, "SHMLOCKS_ERR_CLOSED"


class TableFull(Error):
    """No free name, request or agent entry in the table; nothing held is disturbed."""
    code, code_name = 7, "SHMLOCKS_ERR_TABLE_FULL"


class TableError(Error):
    """The table cannot be used: not a lock table, an unsafe location, or the
    file cannot be opened."""


class Corrupt(TableError):
    """The file is not a valid lock table."""
    code, code_name = 8, "SHMLOCKS_ERR_CORRUPT"


class Unsafe(TableError):
    """The table or its directory could be controlled by another user."""
    code, code_name = 9, "SHMLOCKS_ERR_UNSAFE"


class Deadlock(Error):
    """The request was the victim of a wait-for cycle."""
    code, code_name = 10, "SHMLOCKS_ERR_DEADLOCK"


class BadHandle(Error):
    """A lock or table that was released or closed already."""
    code, code_name = 11, "SHMLOCKS_ERR_BAD_HANDLE"


class InvalidArgument(Error, ValueError):
    """A bad argument (an unknown option, a wrong type)."""
    code, code_name = 12, "SHMLOCKS_ERR_INVALID"


class ForkError(Error):
    """shmlocks was used in a process forked after the library was loaded:
    the Go runtime inside it does not survive fork."""
    code, code_name = 13, "SHMLOCKS_ERR_FORK"


class OpenError(TableError):
    """The table file could not be opened or created."""
    code, code_name = 14, "SHMLOCKS_ERR_OPEN"


class InternalError(Error):
    """A bug in the library (a recovered panic); the process is unharmed."""
    code, code_name = 15, "SHMLOCKS_ERR_INTERNAL"


class LibraryNotFound(Error, ImportError):
    """libshmlocks.so could not be loaded (see SHMLOCKS_LIB)."""


BY_CODE = {c.code: c for c in (NotSupported, Aborted, Timeout, NotAvailable, Stolen, Closed,
                               TableFull, Corrupt, Unsafe, Deadlock, BadHandle, InvalidArgument,
                               ForkError, OpenError, InternalError)}


def from_code(code, message):
    """The exception for a C error code and its message."""
    cls = BY_CODE.get(code, Error)
    e = cls(message)
    if cls is Error:
        e.code = code
    return e
