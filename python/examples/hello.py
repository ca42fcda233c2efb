"""The README's example: take the lock "invoices" on the default table (the
one Go programs and `shmlocks exec` use: $SHMLOCKS_TABLE, else
/tmp/shmlocks-UID/shmlocks.tbl) and show who holds what.

    make lib && python3 python/examples/hello.py
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import shmlocks  # noqa: E402

with shmlocks.lock("invoices", timeout=5) as l:
    print('holding "invoices" with fencing token %d' % l.token)
    print(json.dumps([h for h in shmlocks.query()["held"] if h["name"] == "invoices"]))
