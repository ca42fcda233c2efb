"""A test agent: takes locks of the table $SHMLOCKS_TABLE on command.

The agents of every language (this one, capi/agents/goagent, capi/agents/cagent)
speak one line protocol: after opening the table they print "ready"; then,
one command per line on stdin, one answer per line on stdout:

    acquire NAME [shared] [ifavail] [steal] [timeout=MS]
                        -> acquired TOKEN | error CODE_NAME MESSAGE
    release             -> released | error CODE_NAME MESSAGE   (the latest lock)
    waitlost MS         -> lost | notlost   (the latest lock's lost descriptor / channel)
    chaos NAME OCC LOG  -> never returns: takes NAME over and over; while it
                           holds it, holds a POSIX record lock on OCC (if
                           another process has it, appends "blocked TOKEN PID
                           HOLDERPID" and waits) and appends
                           "enter|mid|exit TOKEN PID" lines to LOG (O_APPEND)
    exit                -> (exits 0)

Every agent has a watchdog: it exits after $AGENT_DEADLINE seconds (60)."""

import fcntl
import os
import random
import select
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import shmlocks  # noqa: E402


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def occupy(fd):
    """Takes a POSIX record lock on fd without waiting; 0 if taken, else the
    pid of the process that holds it (F_GETLK)."""
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return 0
        except OSError:
            pass
        r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        typ, _, _, _, pid = struct.unpack("hhqqi4x", r)
        if typ != fcntl.F_UNLCK:
            return pid


def chaos(table, name, occ, log):
    occ_fd = os.open(occ, os.O_RDWR | os.O_CREAT, 0o600)
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    pid = os.getpid()
    while True:
        with table.lock(name) as l:
            holder = occupy(occ_fd)
            if holder:
                # Someone holds the record lock: the test checks that it is a
                # process it SIGKILLed (the kernel drops the lock when the
                # last thread of a dead process has exited, which may come
                # after its agent was reaped), then we wait for it.
                os.write(log_fd, b"blocked %d %d %d\n" % (l.token, pid, holder))
                fcntl.lockf(occ_fd, fcntl.LOCK_EX)
            os.write(log_fd, b"enter %d %d\n" % (l.token, pid))
            for _ in range(random.randrange(4)):
                time.sleep(random.random() / 1000)
                os.write(log_fd, b"mid %d %d\n" % (l.token, pid))
            os.write(log_fd, b"exit %d %d\n" % (l.token, pid))
            fcntl.lockf(occ_fd, fcntl.LOCK_UN)


def main():
    deadline = float(os.environ.get("AGENT_DEADLINE", "60"))
    threading.Timer(deadline, lambda: os._exit(3)).start()
    table = shmlocks.Table(os.environ["SHMLOCKS_TABLE"])
    out("ready")
    latest = None
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        try:
            if f[0] == "acquire":
                timeout = None
                for a in f[2:]:
                    if a.startswith("timeout="):
                        timeout = int(a[8:]) / 1000
                latest = table.acquire(f[1], shared="shared" in f, if_available="ifavail" in f,
                                       steal="steal" in f, timeout=timeout)
                out("acquired %d" % latest.token)
            elif f[0] == "release":
                latest.release()
                out("released")
            elif f[0] == "waitlost":
                r, _, _ = select.select([latest.fileno()], [], [], int(f[1]) / 1000)
                out("lost" if r and latest.lost() else "notlost")
            elif f[0] == "chaos":
                chaos(table, f[1], f[2], f[3])
            elif f[0] == "exit":
                os._exit(0)
            else:
                out("error usage unknown command %r" % f[0])
        except shmlocks.Error as e:
            out("error %s %s" % (e.code_name, e))
    os._exit(0)


if __name__ == "__main__":
    main()
