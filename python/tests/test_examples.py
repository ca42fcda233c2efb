"""The Python examples run and print what they promise."""

import os
import subprocess
import sys
import tempfile
import unittest

from helpers import ROOT, _build


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


if __name__ == "__main__":
    unittest.main()
