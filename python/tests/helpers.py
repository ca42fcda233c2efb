"""The kit of the cross-language tests: the programs they run (built once per
test run into a temporary folder), agents that speak agent.py's line
protocol, and bounded waits (every wait has a deadline; "still blocked" is
checked over a quiet period, never assumed after a sleep)."""

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
sys.path.insert(0, os.path.join(ROOT, "python"))

import shmlocks  # noqa: E402
from shmlocks import _lib  # noqa: E402

QUIET = 0.3       # a request must stay blocked this long to count as blocked
EVENTUALLY = 15.0  # anything expected must happen within this

_bin = None


def _build():
    """Builds the programs into a temporary folder: the Go agent, the C agent,
    the shmlocks command (libshmlocks.so itself comes from make lib, or
    $SHMLOCKS_LIB). Raises SkipTest with the reason when a tool is missing."""
    global _bin
    if _bin is not None:
        return _bin
    lib = _lib.library_path()
    if not os.path.exists(lib):
        raise unittest.SkipTest("no %s: run 'make lib' (needs go and gcc) or set SHMLOCKS_LIB" % lib)
    for tool in ("go", os.environ.get("CC", "gcc")):
        if shutil.which(tool) is None:
            raise unittest.SkipTest("the cross-language tests need %s on PATH" % tool)
    d = tempfile.mkdtemp(prefix="shmlocks-langtest-")
    atexit.register(shutil.rmtree, d, True)
    go = ["go", "build", "-o"]
    subprocess.run(go + [os.path.join(d, "goagent"), "./capi/agents/goagent"], cwd=ROOT, check=True)
    subprocess.run(go + [os.path.join(d, "shmlocks"), "./cmd/shmlocks"], cwd=ROOT, check=True)
    libdir = os.path.dirname(os.path.abspath(lib))
    subprocess.run([os.environ.get("CC", "gcc"), "-Wall", "-O2", "-I", os.path.join(ROOT, "capi"), "-o",
                    os.path.join(d, "cagent"), os.path.join(ROOT, "capi/agents/cagent/agent.c"),
                    "-L", libdir, "-lshmlocks", "-Wl,-rpath," + libdir], check=True)
    _bin = d
    return d


def program(name):
    return os.path.join(_build(), name)


class Agent:
    """A process of agent.py's protocol: go, c or python."""

    def __init__(self, kind, table, deadline=120):
        cmd = {"go": [program("goagent")], "c": [program("cagent")],
               "python": [sys.executable, os.path.join(HERE, "agent.py")]}[kind]
        env = dict(os.environ, SHMLOCKS_TABLE=table, AGENT_DEADLINE=str(deadline))
        self.kind = kind
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.lines = LineReader(self.p.stdout)
        self.expect("ready")

    def send(self, cmd):
        self.p.stdin.write((cmd + "\n").encode())
        self.p.stdin.flush()

    def expect(self, prefix, timeout=EVENTUALLY):
        line = self.lines.read(timeout)
        if line is None:
            raise AssertionError("%s agent: no line within %.0fs (expected %r)" % (self.kind, timeout, prefix))
        if not line.startswith(prefix):
            raise AssertionError("%s agent: got %r, expected %r" % (self.kind, line, prefix))
        return line

    def acquired(self, timeout=EVENTUALLY):
        """The token of the grant the agent reports next."""
        return int(self.expect("acquired", timeout).split()[1])

    def silent(self, what, period=QUIET):
        """Asserts the agent says nothing for period (e.g. still blocked)."""
        line = self.lines.read(period)
        if line is not None:
            raise AssertionError("%s agent: %s, but it said %r" % (self.kind, what, line))

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(EVENTUALLY)  # reaped: a zombie still answers kill(pid, 0)

    def close(self):
        if self.p.poll() is None:
            try:
                self.send("exit")
            except BrokenPipeError:
                pass
            try:
                self.p.wait(EVENTUALLY)
            except subprocess.TimeoutExpired:
                self.kill()
        self.p.stdin.close()
        self.p.stdout.close()


class LineReader:
    """Lines of a pipe, read with a deadline."""

    def __init__(self, f):
        self.fd, self.buf = f.fileno(), b""

    def read(self, timeout):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


class Exec:
    """shmlocks exec holding name while `read` waits: prints "acquired TOKEN"
    when granted and exits when told to (release)."""

    def __init__(self, table, name):
        self.p = subprocess.Popen([program("shmlocks"), "exec", "-t", table, name, "--", "sh", "-c",
                                   'echo "acquired $SHMLOCKS_TOKEN"; read x'],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.kind = "exec"
        self.lines = LineReader(self.p.stdout)

    acquired, silent, expect = Agent.acquired, Agent.silent, Agent.expect

    def release(self):
        self.p.stdin.write(b"\n")
        self.p.stdin.close()
        self.p.wait(EVENTUALLY)
        self.p.stdout.close()

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(EVENTUALLY)


def eventually(cond, what, timeout=EVENTUALLY):
    """Polls cond (a check of outside state, not a stand-in for a signal)
    until it is true or the deadline passes."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("not within %.0fs: %s" % (timeout, what))
        time.sleep(0.01)


def pending(table, name):
    """The pending requests of name in table, in queue order."""
    return [p for p in table.query()["pending"] if p["name"] == name]


def held(table, name):
    return [h for h in table.query()["held"] if h["name"] == name]


class TableTest(unittest.TestCase):
    """A test with a table file of its own (self.path) and a Table on it (self.t)."""

    def setUp(self):
        _build()
        self.dir = tempfile.mkdtemp(prefix="shmlocks-pytest-")
        self.path = os.path.join(self.dir, "t.tbl")
        self.t = shmlocks.Table(self.path)
        self.cleanups = []

    def tearDown(self):
        for c in reversed(self.cleanups):
            c()
        try:
            self.t.close()
        except shmlocks.Error:
            pass
        shutil.rmtree(self.dir, True)

    def agent(self, kind):
        a = Agent(kind, self.path)
        self.cleanups.append(a.close)
        return a

    def exec_(self, name):
        e = Exec(self.path, name)
        self.cleanups.append(e.close)
        return e


def dumps(x):
    return json.dumps(x, indent=1)
