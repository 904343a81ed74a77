"""A runtime that knows nothing of the invoker, as OpenWhisk's own are: it takes no arguments,
reads none of the invoker's environment, and serves OpenWhisk's action protocol on 0.0.0.0:8080
of whatever network it is in. /init takes python code defining `main`; /run calls it in this
process and ends its output with OpenWhisk's log sentinels."""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"
action = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        global action
        length = int(self.headers.get("Content-Length") or 0)
        message = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/init":
            scope = {}
            exec(message["value"]["code"], scope)
            action = scope[message["value"].get("main") or "main"]
            self.answer(200, {"ok": True})
        elif self.path == "/run" and action is not None:
            try:
                result = action(message.get("value") or {})
            except Exception as e:
                result = {"error": str(e)}
            print(SENTINEL, flush=True)
            print(SENTINEL, file=sys.stderr, flush=True)
            self.answer(200, result)
        else:
            self.answer(404, {"error": "no such route, or not initialised"})


HTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
