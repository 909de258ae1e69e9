#!/usr/bin/env python3
"""A fake API Gateway `@connections` endpoint on loopback for the Lambda-runtime tier.

    fake_connections.py POSTS_FILE

`POST /live/@connections/{id}` appends {"connection_id": id, "frame": <the posted JSON>,
"gone": false} as one line to POSTS_FILE and answers 200; an id starting with `gone-`
answers 410 Gone (as API Gateway does for a closed connection) and is recorded with
"gone": true. Prints the endpoint (http://127.0.0.1:<port>/live) on its first line, then
serves until killed. (A script, not a Rust binary: building one more package of the
workspace in the tier's build would resolve the functions' features differently.)
"""

import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POSTS = sys.argv[1]
PREFIX = "/live/@connections/"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (the http.server API)
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        if not self.path.startswith(PREFIX):
            self.send_response(404)
            self.end_headers()
            return
        connection = urllib.parse.unquote(self.path[len(PREFIX):])
        try:
            frame = json.loads(body)
        except ValueError:
            frame = body.decode(errors="replace")
        gone = connection.startswith("gone-")
        with open(POSTS, "a", encoding="utf-8") as out:
            out.write(json.dumps({"connection_id": connection, "frame": frame, "gone": gone}) + "\n")
        if gone:
            answer = b'{"message":"gone"}'
            self.send_response(410)
            self.send_header("x-amzn-errortype", "GoneException")
        else:
            answer = b""
            self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"http://127.0.0.1:{server.server_address[1]}/live", flush=True)
server.serve_forever()
