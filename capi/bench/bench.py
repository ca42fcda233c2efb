"""Uncontended acquire+release from Python: the shmlocks module against
fcntl.flock, in one process (make bench-lang; docs/benchmarks.md).

    python3 capi/bench/bench.py TABLE LOCKFILE N

prints one line per figure: "<name> <ns per pair>"."""

import fcntl
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
import shmlocks  # noqa: E402


def measure(fn, n):
    fn(n // 10)  # warm up
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def main():
    table, lockfile, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = shmlocks.Table(table)

    def with_lock(k):
        for _ in range(k):
            with t.lock("bench"):
                pass

    def acquire_release(k):
        acq = t.acquire
        for _ in range(k):
            acq("bench").release()

    fd = os.open(lockfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def flock(k):
        f, ex, un = fcntl.flock, fcntl.LOCK_EX, fcntl.LOCK_UN
        for _ in range(k):
            f(fd, ex)
            f(fd, un)

    print("py-shmlocks-with %.0f" % measure(with_lock, n))
    print("py-shmlocks-acquire %.0f" % measure(acquire_release, n))
    print("py-flock %.0f" % measure(flock, n))
    t.close()


if __name__ == "__main__":
    main()
