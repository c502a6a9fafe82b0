"""The upstream behind Envoy in the end-to-end test: answers 200 to everything and counts what reached it, by the
x-user header and by path (/export or not). GET /__counts (sent to it directly, not through Envoy) returns the
counts as JSON. Usage: python3 upstream.py PORT"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/__counts":
            with lock:
                body = json.dumps(counts).encode()
        else:
            kind = "export" if self.path.startswith("/export") else "plain"
            key = f"{self.headers.get('x-user', '')}|{kind}"
            with lock:
                counts[key] = counts.get(key, 0) + 1
            body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
