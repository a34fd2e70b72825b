"""A small stand-in for the Hugging Face hub, on 127.0.0.1, for the sync tests.

The hub cannot be reached from the machines these tests run on, so `aleph.sync.hub` is
tested through huggingface_hub itself against this server. It implements the part of the
hub's HTTP API that huggingface_hub uses for what aleph does: create a repo
(POST /api/repos/create), repo info at a revision (GET /api/models/<repo>/revision/<rev>, each file with its size),
preupload (always answering "regular", so content travels inline in the commit; it never
advertises LFS or xet), commit (POST /api/models/<repo>/commit/<rev>, NDJSON: file,
deletedFile, deletedFolder; a parentCommit that is not the head is refused with 412) and
download (HEAD/GET /<repo>/resolve/<rev>/<path> with X-Repo-Commit, ETag and
Content-Length). Files are stored for real, by sha256 under a directory, and every commit
is kept, so a test pulls back what it pushed. With `token` set, every request must carry
it as a bearer token (401 otherwise), as the real hub does for private repos.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES = [
    ("POST", re.compile(r"/api/repos/create"), "create"),
    ("GET", re.compile(rf"/api/models/{_REPO}/revision/(?P<rev>[^/]+)"), "info"),
    ("POST", re.compile(rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)"), "preupload"),
    ("POST", re.compile(rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)"), "commit"),
    ("GET", re.compile(rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)"), "resolve"),
    ("HEAD", re.compile(rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)"), "resolve"),
]


class FakeHub:
    """The server and its state: repos {id: {"head": sha, "commits": {sha: {path: blob}}}}."""

    def __init__(self, root: Path, token: str | None = None) -> None:
        self.blobs = Path(root) / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.listed: dict[str, int | None] = {}  # path -> the size the listing says instead
        self.bodies: dict[str, object] = {}  # path -> fn(handler) answering its GET instead
        self.listing: object = None  # raw 200 body, or fn(handler), answering every listing
        self.hang: set[str] = set()  # routes (create, commit, ...) that never answer
        self._released = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._released.set()  # a hung answer ends with the server
        self.server.shutdown()
        self.server.server_close()

    # --- state -------------------------------------------------------------------------------
    def _put_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        (self.blobs / sha).write_bytes(data)
        return sha

    def _commit(self, repo: str, files: dict[str, str]) -> str:
        r = self.repos[repo]
        sha = hashlib.sha1(json.dumps([r.get("head"), files, len(r["commits"])],
                                      sort_keys=True).encode()).hexdigest()
        r["commits"][sha], r["head"] = dict(files), sha
        return sha

    def files_at(self, repo: str, rev: str) -> tuple[str, dict[str, str]] | None:
        r = self.repos.get(repo)
        if r is None:
            return None
        sha = r["head"] if rev == "main" else rev
        return (sha, r["commits"][sha]) if sha in r["commits"] else None

    def blob(self, sha: str) -> Path:
        return self.blobs / sha


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the test output stays readable
            pass

        def _dispatch(self, method: str) -> None:
            path = urlsplit(self.path).path
            hub.requests.append((method, path))
            if hub.token and self.headers.get("authorization") != f"Bearer {hub.token}":
                self._json(401, {"error": "Invalid credentials"},
                           {"X-Error-Message": "Invalid credentials in Authorization header"})
                return
            for m, pattern, name in _ROUTES:
                match = pattern.fullmatch(path)
                if m == method and match:
                    if name in hub.hang:
                        hub._released.wait()
                        return
                    with hub.lock:
                        getattr(self, name)(**{k: unquote(v) for k, v in match.groupdict().items()})
                    return
            self._json(404, {"error": f"not implemented by the fake hub: {method} {path}"})

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_HEAD(self) -> None:
            self._dispatch("HEAD")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def _json(self, code: int, obj, headers: dict | None = None) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self, what: str, code: str) -> None:
            self._json(404, {"error": f"{what} not found"}, {"X-Error-Code": code})

        # --- routes --------------------------------------------------------------------------
        def create(self) -> None:
            body = json.loads(self._body())
            repo = f"{body['organization']}/{body['name']}"
            if repo in hub.repos:
                self._json(409, {"error": "You already created this model repo",
                                 "url": f"{hub.endpoint}/{repo}"})
                return
            hub.repos[repo] = {"commits": {}, "head": None}
            hub._commit(repo, {".gitattributes": hub._put_blob(b"*.safetensors filter=lfs\n")})
            self._json(200, {"url": f"{hub.endpoint}/{repo}", "name": repo})

        def info(self, repo: str, rev: str) -> None:
            found = hub.files_at(repo, rev)
            if found is None:
                self._missing(f"repo {repo}", "RepoNotFound")
                return
            sha, files = found
            if callable(hub.listing):
                hub.listing(self)
                return
            if hub.listing is not None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(hub.listing)))
                self.end_headers()
                self.wfile.write(hub.listing)
                return
            self._json(200, {"id": repo, "sha": sha, "private": True,
                             "siblings": [{"rfilename": p, "size": hub.listed.get(
                                 p, hub.blob(files[p]).stat().st_size)} for p in sorted(files)]})

        def preupload(self, repo: str, rev: str) -> None:
            body = json.loads(self._body())
            if repo not in hub.repos:
                self._missing(f"repo {repo}", "RepoNotFound")
                return
            self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                        "shouldIgnore": False, "oid": None}
                                       for f in body["files"]]})

        def commit(self, repo: str, rev: str) -> None:
            lines = [json.loads(x) for x in self._body().splitlines() if x.strip()]
            found = hub.files_at(repo, rev)
            if found is None:
                self._missing(f"repo {repo}", "RepoNotFound")
                return
            head, files = found[0], dict(found[1])
            parent = lines[0]["value"].get("parentCommit") if lines[0]["key"] == "header" else None
            if parent is not None and parent != head:
                self._json(412, {"error": f"parent commit {parent} is not the head {head}"})
                return
            for line in lines[1:]:
                key, value = line["key"], line["value"]
                if key == "file":
                    files[value["path"]] = hub._put_blob(base64.b64decode(value["content"]))
                elif key == "deletedFile":
                    files.pop(value["path"], None)
                elif key == "deletedFolder":
                    files = {p: b for p, b in files.items()
                             if not p.startswith(value["path"].rstrip("/") + "/")}
                else:
                    self._json(400, {"error": f"the fake hub takes regular files only, got {key}"})
                    return
            sha = hub._commit(repo, files)
            self._json(200, {"commitUrl": f"{hub.endpoint}/{repo}/commit/{sha}",
                             "commitOid": sha, "pullRequestUrl": None})

        def resolve(self, repo: str, rev: str, path: str) -> None:
            found = hub.files_at(repo, rev)
            if found is None:
                self._missing(f"revision {rev} of {repo}", "RevisionNotFound")
                return
            sha, files = found
            if path not in files:
                self._missing(f"{path} at {rev}", "EntryNotFound")
                return
            if self.command == "GET" and path in hub.bodies:
                try:
                    hub.bodies[path](self)
                except OSError:  # the client hung up: what a bounded pull does
                    pass
                return
            data = hub.blob(files[path]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", f'"{files[path]}"')
            self.send_header("X-Repo-Commit", sha)
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(data)

    return Handler
