"""The Python examples run and print what they promise."""

import os
import subprocess
import sys
import tempfile
import unittest

from helpers import ROOT, _build, _lib


class Examples(unittest.TestCase):
    def test_tokenrefresh_one_refresh_per_expiry(self):
        _build()
        out = subprocess.run([sys.executable, os.path.join(ROOT, "python/examples/tokenrefresh.py")],
                             capture_output=True, text=True, timeout=180)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("4 workers made 80 calls; the token expired 7 times and was refreshed 7 times; logouts: 0",
                      out.stdout)

    def test_hello(self):
        _build()
        with tempfile.TemporaryDirectory() as d:  # a table of its own, not the user's default
            env = dict(os.environ, SHMLOCKS_TABLE=os.path.join(d, "t.tbl"))
            out = subprocess.run([sys.executable, os.path.join(ROOT, "python/examples/hello.py")],
                                 capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertRegex(out.stdout, r'holding "invoices" with fencing token \d+')

    def test_c_hello_is_the_doc_example_and_runs(self):
        d = _build()
        src = os.path.join(ROOT, "capi/examples/hello.c")
        with open(os.path.join(ROOT, "docs/c-abi.md")) as f:
            doc = f.read().split("```c\n", 1)[1].split("```\n", 1)[0]
        with open(src) as f:
            self.assertEqual(f.read(), doc, "docs/c-abi.md's C example is capi/examples/hello.c")
        libdir = os.path.dirname(os.path.abspath(_lib.library_path()))
        exe = os.path.join(d, "hello")
        subprocess.run([os.environ.get("CC", "gcc"), "-Wall", "-Werror", "-I", os.path.join(ROOT, "capi"), "-o", exe,
                        src, "-L", libdir, "-lshmlocks", "-Wl,-rpath," + libdir], check=True, timeout=120)
        with tempfile.TemporaryDirectory() as t:
            out = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, SHMLOCKS_TABLE=os.path.join(t, "t.tbl")))
        self.assertEqual((out.returncode, out.stdout), (0, "holding invoices, fencing token 1\n"), out.stderr)


if __name__ == "__main__":
    unittest.main()
