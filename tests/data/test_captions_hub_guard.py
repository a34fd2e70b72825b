"""A hub caption dataset (`--captions org/ds`) downloads through aleph._hub's checks like a
hub tokenizer or teacher: a mirror's ETag of `../` segments never becomes a path, whatever
the tokenizer is (a local directory installs no guard of its own)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
COMMIT = "b" * 40


def _server(parquet: bytes, etag: str) -> ThreadingHTTPServer:
    """Dataset org/ds at COMMIT: its info, tree listings and files, each file's ETag `etag`."""
    listing = [{"type": "file", "path": "data/train.parquet", "size": len(parquet), "oid": "c" * 40}]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, code: int, body: bytes, **headers: str) -> None:
            self.send_response(code)
            for k, v in {"X-Repo-Commit": COMMIT, **headers}.items():
                self.send_header(k.replace("_", "-"), v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path.startswith("/api/datasets/org/ds/tree"):
                self._send(200, json.dumps(listing).encode(), Content_Type="application/json")
            elif path.startswith("/api/datasets/org/ds"):
                info = {"id": "org/ds", "sha": COMMIT, "private": False, "disabled": False,
                        "gated": False, "siblings": [{"rfilename": "data/train.parquet"}],
                        "cardData": {}, "tags": []}
                self._send(200, json.dumps(info).encode(), Content_Type="application/json")
            elif "/resolve/" in path and path.endswith(".parquet"):
                self._send(200, parquet, ETag=f'"{etag}"')
            else:
                self._send(404, b"", X_Error_Code="EntryNotFound")

        do_HEAD = do_GET

        def do_POST(self) -> None:  # paths-info
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(200, json.dumps(listing).encode(), Content_Type="application/json")

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def test_a_hub_caption_dataset_with_a_climbing_etag_writes_nothing_there(tmp_path):
    from aleph.data.tokenizer import train_wordpiece

    captions = [f"a dog number {i} runs" for i in range(64)]
    train_wordpiece(captions, tmp_path / "tok")
    buf = io.BytesIO()
    pq.write_table(pa.table({"caption": captions}), buf)
    victim = tmp_path / "victim"
    server = _server(buf.getvalue(), "../" * 40 + str(victim).lstrip("/"))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ALEPH_WORK": str(tmp_path / "work"),
           "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_DATASETS_OFFLINE", None)
    try:
        r = subprocess.run([sys.executable, "-m", "aleph", "data", "tokens", "--captions", "org/ds",
                            "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "st")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert not victim.exists(), sorted(os.listdir(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "captions dataset 'org/ds': hub answer for " in lines[0] and "ETag '../../" in lines[0]
