"""A hub mirror that lies, on 127.0.0.1: what a stranger's HF_ENDPOINT may answer.

It serves one model repo at one commit: the repo listing (GET /api/models/<repo>[/revision/
<rev>], also /tree/) names `files` plus any `extra_names` (e.g. `../x`, `/abs`), and a file
(HEAD/GET /<repo>/resolve/<rev>/<path>) is answered with the ETag and X-Repo-Commit the test
sets (e.g. an ETag of `../` segments aimed at a victim path). Every request is recorded.
Used by the hub-guard tests of both environments (the E1 stack's huggingface_hub 1.x and the
teacher set's 0.36), so it imports nothing of aleph and nothing of huggingface_hub.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HostileHub:
    """The server; `etag` / `commit` override the honest headers of every file answer."""

    def __init__(self, repo: str, files: dict[str, bytes], etag: str | None = None,
                 commit: str | None = None, extra_names: tuple[str, ...] = ()) -> None:
        self.repo, self.files, self.extra_names = repo, files, extra_names
        self.etag, self.commit = etag, commit
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)

    def __enter__(self) -> HostileHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(hub: HostileHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _answer(self) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            names = sorted(hub.files) + list(hub.extra_names)
            if path.startswith(f"/api/models/{hub.repo}"):
                if "/tree/" in path:
                    body = [{"type": "file", "path": n, "size": len(hub.files.get(n, b"")),
                             "oid": "0" * 40} for n in names]
                else:
                    body = {"id": hub.repo, "modelId": hub.repo, "sha": COMMIT,
                            "private": False, "siblings": [
                                {"rfilename": n, "size": len(hub.files.get(n, b""))}
                                for n in names]}
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                return
            prefix = f"/{hub.repo}/resolve/"
            if path.startswith(prefix):
                name = path[len(prefix):].split("/", 1)[-1]
                data = hub.files.get(name)
                if data is None:
                    self._send(404, b'{"error": "entry not found"}', {
                        "X-Error-Code": "EntryNotFound", "X-Repo-Commit": hub.commit or COMMIT,
                        "Content-Type": "application/json"})
                    return
                etag = hub.etag if hub.etag is not None else hashlib.sha1(data).hexdigest()
                self._send(200, data, {"ETag": f'"{etag}"',
                                       "X-Repo-Commit": hub.commit or COMMIT,
                                       "Content-Type": "application/octet-stream"})
                return
            self._send(404, b'{"error": "not served"}', {"Content-Type": "application/json"})

        do_GET = do_HEAD = _answer

    return Handler
