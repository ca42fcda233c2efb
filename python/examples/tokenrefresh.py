"""The seeds' cross-process token refresh, in Python: worker processes (a
gunicorn or celery pool, say) call an API with a shared access token; when
it expires they all get 401 at once, and the refresh token that renews it is
single-use: spent twice, the session ends (a logout).

  - A call holds "auth" shared: calls run together, never during a refresh.
  - On 401 a worker takes "auth" exclusive (waiting for the calls in flight),
    re-reads the stored token, and refreshes only if it is still the one that
    failed: the workers that queued behind the first find the new token and
    spend nothing. So: one refresh per expiry, whatever the interleaving.

The auth server is an HTTP server in the parent process, on loopback: it
expires the access token after every 10th call and counts refreshes and
logouts (a refresh token presented twice). The workers are processes of this
script, sharing a lock table in a temporary folder with Go and C programs
that would use it too ($SHMLOCKS_TABLE):

    make lib && python3 python/examples/tokenrefresh.py
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import shmlocks  # noqa: E402

WORKERS, THREADS, CALLS_EACH, EXPIRE_EVERY = 4, 2, 10, 10
TOTAL = WORKERS * THREADS * CALLS_EACH


class Server:
    def __init__(self):
        self.mu = threading.Lock()
        self.gen, self.calls, self.expired = 1, 0, False
        self.expiries = self.refreshes = self.logouts = 0

    def call(self, access):
        with self.mu:
            if self.expired or access != "a%d" % self.gen:
                return 401
            self.calls += 1
            if self.calls % EXPIRE_EVERY == 0 and self.calls < TOTAL:
                self.expired, self.expiries = True, self.expiries + 1
            return 200

    def refresh(self, rt):
        with self.mu:
            if rt != "r%d" % self.gen:
                self.logouts += 1
                return 401, {}
            self.gen, self.expired, self.refreshes = self.gen + 1, False, self.refreshes + 1
            return 200, {"access": "a%d" % self.gen, "refresh": "r%d" % self.gen}


def serve(srv):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/call":
                code, out = srv.call(body["access"]), {}
            else:
                code, out = srv.refresh(body["refresh"])
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def read_store(path):
    with open(path) as f:
        return json.load(f)


def write_store(path, tokens):
    tmp = "%s.%d.%d" % (path, os.getpid(), threading.get_ident())
    with open(tmp, "w") as f:
        json.dump(tokens, f)
    os.rename(tmp, path)


def worker(url, store):
    def run():
        done = 0
        while done < CALLS_EACH:
            with shmlocks.lock("auth", shared=True, timeout=30):
                access = read_store(store)["access"]
                status, _ = post(url + "/call", {"access": access})
            if status == 200:
                done += 1
                continue
            with shmlocks.lock("auth", timeout=30):  # exclusive: no call runs now
                st = read_store(store)
                if st["access"] == access:  # nobody refreshed since our call failed
                    status, new = post(url + "/refresh", {"refresh": st["refresh"]})
                    if status != 200:
                        raise SystemExit("refresh refused: logged out")
                    write_store(store, new)
    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        return worker(sys.argv[2], sys.argv[3])
    srv = Server()
    httpd = serve(srv)
    url = "http://127.0.0.1:%d" % httpd.server_address[1]
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "tokens.json")
        write_store(store, {"access": "a1", "refresh": "r1"})
        env = dict(os.environ, SHMLOCKS_TABLE=os.path.join(d, "locks.tbl"))
        procs = [subprocess.Popen([sys.executable, __file__, "worker", url, store], env=env) for _ in range(WORKERS)]
        failed = [p for p in procs if p.wait(120) != 0]
    httpd.shutdown()
    print("%d workers made %d calls; the token expired %d times and was refreshed %d times; logouts: %d"
          % (WORKERS, srv.calls, srv.expiries, srv.refreshes, srv.logouts))
    if failed or srv.refreshes != srv.expiries or srv.logouts:
        sys.exit(1)


if __name__ == "__main__":
    main()
