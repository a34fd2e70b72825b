"""A stand-in for the Hugging Face hub's dataset file downloads, on 127.0.0.1.

It serves what `huggingface_hub.get_hf_file_metadata` and `hf_hub_download` ask of a
dataset repo's LFS file: HEAD/GET /datasets/<repo>/resolve/<rev>/<path>, where <rev> is
"main", a full commit id or a prefix of one (a short id), answered with X-Repo-Commit (the
full id), X-Linked-Etag (the file's sha256, as the hub gives an LFS file's oid),
X-Linked-Size and Content-Length; a GET with `Range: bytes=N-` gets 206 and the rest.
Knobs for the tests: `cut_gets` (the next that many GETs send only `cut_at` bytes of their
body and close the connection: an interrupted download), `corrupt` (serve the bytes with
one flipped, under the true record: a damaged download) and `token` (401 without it).
Hostile servers: `extra` (GETs send that many bytes more than the file, with no
Content-Length, closing the connection), `encoded` (GETs send these bytes with
`Content-Encoding: gzip`, whatever was asked), `trickle` (GETs send one byte every that
many seconds), `self_redirect` (requests of that method get a relative 302 to their own
path), `linked_size` (the X-Linked-Size header's text) and `redirect_gets` (GETs get a 302
to this origin, the same path), `error_body` (GETs get a 500 with a JSON body of that many
bytes; `error_sent` logs the bytes of each that the client took). `auth_seen` logs each request's Authorization header and
`times` its arrival (time.time()). `trickle_head`: HEADs get their status line, then a
header one byte every that many seconds, never ending.
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_RESOLVE = re.compile(r"/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")


class FakeDatasetHub:
    """Files {repo: {commit: {path: bytes}}}; `requests` logs (method, path, Range)."""

    def __init__(self, token: str | None = None) -> None:
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}
        self.token = token
        self.cut_gets, self.cut_at, self.corrupt = 0, 0, False
        self.extra, self.encoded, self.trickle = 0, b"", 0.0
        self.self_redirect: str | None = None
        self.linked_size: str | None = None
        self.redirect_gets: str | None = None
        self.error_body = 0
        self.error_sent: list[int] = []
        self.auth_seen: list[str | None] = []
        self.times: list[float] = []
        self.trickle_head = 0.0
        self.requests: list[tuple[str, str, str | None]] = []
        self.server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)

    def add(self, repo: str, commit: str, files: dict[str, bytes]) -> None:
        self.repos.setdefault(repo, {})[commit] = dict(files)

    def resolve(self, repo: str, rev: str) -> str | None:
        commits = list(self.repos.get(repo, {}))
        if rev == "main":
            return commits[-1] if commits else None
        hits = [c for c in commits if c.startswith(rev)] if len(rev) >= 7 else []
        return hits[0] if len(hits) == 1 else None

    def __enter__(self) -> FakeDatasetHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that hung up: expected here
            super().handle_error(request, client_address)


def _handler(hub: FakeDatasetHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _error(self, code: int, message: str, error_code: str) -> None:
            body = message.encode()
            self.send_response(code)
            self.send_header("X-Error-Code", error_code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self, get: bool) -> None:
            path = urlsplit(self.path).path
            hub.requests.append((self.command, path, self.headers.get("range")))
            hub.auth_seen.append(self.headers.get("authorization"))
            hub.times.append(time.time())
            if hub.trickle_head and not get:
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    while True:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(hub.trickle_head)
                except OSError:  # the client hung up
                    self.close_connection = True
                    return
            if get and hub.redirect_gets:
                self.send_response(302)
                self.send_header("Location", hub.redirect_gets + path)  # another origin
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if get and hub.error_body:
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(hub.error_body))
                self.end_headers()
                hub.error_sent.append(0)
                try:
                    for left in range(hub.error_body, 0, -(1 << 16)):
                        self.wfile.write(b" " * min(left, 1 << 16))
                        hub.error_sent[-1] += min(left, 1 << 16)
                except OSError:  # the client hung up after the bytes it wanted
                    self.close_connection = True
                return
            if hub.self_redirect == self.command:
                self.send_response(302)
                self.send_header("Location", path)  # relative: to itself
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if hub.token and self.headers.get("authorization") != f"Bearer {hub.token}":
                self._error(401, "Invalid credentials in Authorization header", "GatedRepo")
                return
            m = _RESOLVE.fullmatch(path)
            if not m:
                self._error(404, f"not served by the fake: {path}", "EntryNotFound")
                return
            repo, rev, name = (unquote(v) for v in m.groups())
            commit = hub.resolve(repo, rev)
            if commit is None:
                self._error(404, f"revision {rev} of {repo} not found", "RevisionNotFound")
                return
            data = hub.repos[repo][commit].get(name)
            if data is None:
                self._error(404, f"{name} not found at {rev}", "EntryNotFound")
                return
            sha = hashlib.sha256(data).hexdigest()
            if hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start = 0
            rng = self.headers.get("range")
            if get and rng:
                start = int(re.fullmatch(r"bytes=(\d+)-\d*", rng).group(1))
            body = data[start:] + b"x" * hub.extra if not hub.encoded else hub.encoded
            self.send_response(206 if start else 200)
            self.send_header("Content-Type", "application/octet-stream")
            if hub.encoded and get:
                self.send_header("Content-Encoding", "gzip")
            if hub.extra and get:  # the body ends when the connection closes
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(body) if get else len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')  # the git blob's
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", hub.linked_size or str(len(data)))
            self.send_header("X-Repo-Commit", commit)
            self.end_headers()
            if not get:
                return
            if hub.trickle:
                try:
                    for i in range(len(body)):
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                        time.sleep(hub.trickle)
                except OSError:  # the client hung up: the test is over
                    pass
                return
            if hub.cut_gets > 0:
                hub.cut_gets -= 1
                self.wfile.write(body[: hub.cut_at])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            self._serve(get=False)

        def do_GET(self) -> None:
            self._serve(get=True)

    return Handler
