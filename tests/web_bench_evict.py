"""Drops an OPFS store's data file from the page cache, for the cold-read rows of tests/web_bench.rs.

The browser cannot do it, so the bench asks this server: GET /evict?size=N finds the regular files of exactly N
bytes under the roots (Chromium's temporary profiles: its OPFS files live there under "File System"), writes
back dirty pages (sync) and drops their cached pages (posix_fadvise DONTNEED); only those files are touched.

    python3 tests/web_bench_evict.py --port 18502 &
"""

import argparse
import glob
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def files_of_size(roots, size):
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == size:
                        yield path
                except OSError:
                    pass


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=18502)
    parser.add_argument("--roots", default="/tmp/org.chromium.Chromium.scoped_dir.*", help="glob of the folders to search")
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlparse(self.path)
            size = int(parse_qs(url.query).get("size", ["0"])[0])
            if url.path != "/evict" or size <= 0:
                self.send_error(400, "GET /evict?size=BYTES")
                return
            done = []
            for path in files_of_size(glob.glob(args.roots), size):
                try:
                    evict(path)
                    done.append(path)
                except OSError:
                    pass
            body = json.dumps({"evicted": len(done)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
