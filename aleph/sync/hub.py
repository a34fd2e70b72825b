"""A Hugging Face hub destination: a model repo, one commit per push.

A run's files are mirrored at `runs/<run>/<path>` beside its index `.aleph-sync.json`; a
push is one commit (changed files, deletions, new index), so the repo moves between
complete snapshots or not at all, and a pull fetches every file at the head commit it read
once. Token and endpoint are huggingface_hub's (HF_TOKEN, HF_ENDPOINT).

Others may write the repo: a listed name that is not a plain relative path is refused,
listed sizes are checked before a download (a size must be listed: no index over INDEX_MAX,
no file of another size than its index records), and commits and ETags must be hex digests
(`aleph._hub`). The listing and each download are one GET of ours (`_get`), bounded in bytes
(a file: its listed size; the listing: `PullLimits.listing_max`; an error's body:
`ERROR_BODY_MAX`) and time (a deadline of `answer_s` + size / `min_rate`, cut when slower
than `min_rate`); the library's own listing call would read any length, with no timeout.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aleph.sync.index as ix
from aleph._hub import check_commit, check_etag
from aleph._io import open_write_nofollow, parse_json_bytes, read_chunked, short_repr
from aleph._signals import alarm_at
from aleph.errors import AlephError
from aleph.sync.dest import Destination, pause_hook, scrub
from aleph.sync.index import Snapshot, SyncError
from aleph.sync.select import Item

INDEX_NAME = ".aleph-sync.json"
BRANCH = "main"
ERROR_BODY_MAX = 64 << 10
"""Bytes of an error answer's body read for its message."""


@dataclass(frozen=True)
class PullLimits:
    """The time bounds of one hub download (its bytes: the size listed) or push (the bytes
    sent)."""

    min_rate: float = 32 * 1024
    """Bytes/s a body must average over each `window_s`, else refused."""
    window_s: float = 60.0
    """Seconds over which `min_rate` is measured; also the longest wait for one read."""
    answer_s: float = 60.0
    """Seconds for the answer's headers; the deadline is this + size / min_rate."""
    listing_max: int = 64 << 20
    """Bytes a repo listing may have (about 400,000 files)."""


PULL_LIMITS = PullLimits()


class HubDestination(Destination):
    def __init__(self, repo_id: str, endpoint: str | None = None) -> None:
        from huggingface_hub import HfApi

        self.repo_id, self.spec, self.endpoint = repo_id, f"hf:{repo_id}", endpoint
        self.api = HfApi(endpoint=endpoint)
        self._created = False
        self._sizes: dict[str, dict[str, int | None]] = {}  # commit -> {file: size listed}
        self.limits = PULL_LIMITS

    @contextlib.contextmanager
    def _calling(self, what: str, expected: str = "an answer huggingface_hub can read"
                 ) -> Iterator[None]:
        """A hub that cannot be reached, refuses the token, answers an error or an answer the
        library cannot parse (not JSON, a field of the wrong type), as one SyncError naming
        the destination (token masked): not a traceback. Our own refusals pass as they are."""
        import httpx

        try:
            yield
        except AlephError:
            raise
        except Exception as e:  # noqa: BLE001  (whatever the library raised on a bad answer)
            status = getattr(getattr(e, "response", None), "status_code", None)
            hint = (" (no access: is HF_TOKEN set, to a token with access to this repo?)"
                    if status in (401, 403) else "")
            first = (str(e).strip().splitlines() or [""])[0]
            first = f"{type(e).__name__}: {first if len(first) <= 200 else first[:197] + '...'}"
            why = (f"{first}{hint}" if isinstance(e, OSError | httpx.HTTPError)
                   else f"the hub's answer is not {expected} ({first})")
            raise SyncError(scrub(f"sync destination {self.spec}: {what} failed: {why}")) from None

    def _head(self, revision: str = BRANCH):
        """(commit sha, file names) at `revision`, their listed sizes kept; None when the repo
        does not exist. The listing is read by one bounded GET (not the library's, which reads
        it whole and waits forever); a name that is not a plain relative path is refused."""
        from huggingface_hub.errors import RepositoryNotFoundError

        url = f"{self.api.endpoint}/api/models/{self.repo_id}/revision/{quote(revision, safe='')}"
        with self._get(f"{url}?blobs=true", "reading the repo", self.limits.listing_max,
                       "a repo listing may have", "a repo listing") as (r, chunks):
            try:
                _raise_for_status(r, chunks)
            except RepositoryNotFoundError:
                return None
            info = parse_json_bytes(b"".join(chunks))
            sha = check_commit(info.get("sha") if isinstance(info, dict) else None,
                               f"sync destination {self.spec}")
            siblings = info.get("siblings")
            siblings = [] if siblings is None else siblings  # as huggingface_hub reads it
            if not isinstance(siblings, list) or not all(isinstance(x, dict) for x in siblings):
                raise ValueError(f"siblings {short_repr(siblings, 80)}, expected a list of objects")
            where = f"sync destination {self.spec}@{sha[:12]}: the repo lists a file"
            sizes = {ix.check_rel(x.get("rfilename"), where): x.get("size") for x in siblings}
        self._sizes[sha] = sizes
        return sha, list(sizes)

    def _check_size(self, name: str, revision: str, size: int | None, most: int | None) -> int:
        """The listed size of `name`; refused, before downloading it, when the listing gives
        none, or one other than `size` (or above `most`)."""
        if revision not in self._sizes:
            self._head(revision)
        listed = self._sizes.get(revision, {}).get(name)
        if type(listed) is not int or listed < 0:
            raise SyncError(f"sync destination {self.spec}@{revision[:12]}: {name}: listed "
                            f"without a size ({short_repr(listed, 40)}), expected its size in "
                            "bytes (a pull downloads at most that many); not downloaded")
        if (size is not None and listed != size) or (most is not None and listed > most):
            want = (f"{size:,} B as its index records" if size is not None else
                    f"at most {most:,} B (the cap on an index)")
            raise SyncError(f"sync destination {self.spec}@{revision[:12]}: {name}: listed as "
                            f"{listed:,} B, expected {want}; not downloaded")
        return listed

    def runs(self) -> list[str]:
        head = self._head()
        if head is None:
            raise SyncError(f"sync destination {self.spec}: no such repo (or no access: is "
                            "HF_TOKEN set?)")
        suffix = "/" + INDEX_NAME
        return sorted(n[: -len(suffix)] for n in head[1] if n.endswith(suffix))

    def latest(self, run: str) -> Snapshot | None:
        head = self._head()
        name = f"{run}/{INDEX_NAME}"
        if head is None or name not in head[1]:
            return None
        where = f"{self.spec}@{head[0][:12]}:{name}"
        size = self._check_size(name, head[0], None, ix.INDEX_MAX)
        with tempfile.TemporaryDirectory(prefix="aleph-sync-") as tmp:
            self._download(name, head[0], Path(tmp) / "index", size)
            data = read_chunked(Path(tmp) / "index", ix.INDEX_MAX)
        return Snapshot(ix.parse(data, where), head[0])

    @contextlib.contextmanager
    def _get(self, url: str, what: str, most: int, bound: str, expected: str):
        """(answer, its body's chunks) of one GET of `url`, under `_calling`: the body at most
        `most` bytes (`bound` says why), within the deadline `PullLimits` gives that size."""
        import httpx
        from huggingface_hub import get_token
        from huggingface_hub.utils import get_session

        lim = self.limits
        headers = {"Accept-Encoding": "identity", "User-Agent": "aleph-e1/runs-pull"}
        if token := get_token():
            headers["Authorization"] = f"Bearer {token}"  # httpx drops it across origins
        deadline = time.monotonic() + lim.answer_s + most / lim.min_rate
        late = SyncError(f"sync destination {self.spec}: {what}: not done within its deadline "
                         f"({lim.answer_s:g} s + {most:,} B at {lim.min_rate:,.0f} B/s); "
                         "nothing pulled")
        where = f"sync destination {self.spec}: {what}"
        with self._calling(what, expected), alarm_at(deadline, late), get_session().stream(
                "GET", url, headers=headers, follow_redirects=True,
                timeout=httpx.Timeout(lim.window_s)) as r:
            if r.status_code < 400:
                yield r, _chunks(r, most, f"the {most:,} B {bound}", deadline, lim, late, where)
                return
            body = bytearray()  # an error's message: ERROR_BODY_MAX bytes, at the same rate
            for chunk in _chunks(r, 1 << 62, "", min(deadline, time.monotonic() + lim.answer_s
                                                     + ERROR_BODY_MAX / lim.min_rate),
                                 lim, late, where):
                body += chunk
                if len(body) >= ERROR_BODY_MAX:
                    break
            yield r, iter([bytes(body[:ERROR_BODY_MAX])])

    def _download(self, name: str, revision: str, out: Path, size: int) -> None:
        """At most `size` bytes of `name` at `revision` into `out`, by one GET: its ETag and
        commit checked (`aleph._hub`), a Content-Length or encoding other than the file's own
        refused before a byte is written, the body at its first byte past `size`, at the
        deadline (`PullLimits`), or below the minimum rate."""
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(self.repo_id, name, revision=revision, endpoint=self.endpoint)
        what = f"downloading {name} at {revision[:12]}"
        with self._get(url, what, size, "listed", "a file") as (r, chunks):
            _raise_for_status(r, chunks)
            hub = (r.history or [r])[0].headers  # the hub's own answer, before any redirect
            if (commit := hub.get("x-repo-commit")) is not None:
                check_commit(commit, f"hub answer for {short_repr(url, 200)}")
            check_etag((hub.get("x-linked-etag") or hub.get("etag") or "").removeprefix("W/")
                       .strip('"'), url)
            length, coding = r.headers.get("content-length"), r.headers.get("content-encoding")
            if (length is not None and length.strip() != str(size)) or coding not in (
                    None, "", "identity"):
                raise SyncError(f"sync destination {self.spec}: {what}: the answer has "
                                f"Content-Length {short_repr(length, 40)}, Content-Encoding "
                                f"{short_repr(coding, 40)}; expected {size:,} B as listed, "
                                "unencoded; nothing written")
            with os.fdopen(open_write_nofollow(out, truncate=True), "wb") as f:
                for chunk in chunks:
                    f.write(chunk)

    def publish(self, run: str, index: dict, sends: list[Item], drops: list[str],
                previous: Snapshot | None, rewrite: frozenset[str] = frozenset()) -> str:
        # `rewrite` needs nothing more here: every file in `sends` is uploaded whole.
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        if not self._created:
            with self._calling("creating the repo"), self._bounded("creating the repo", 0):
                self.api.create_repo(self.repo_id, private=True, exist_ok=True)
            self._created = True
        ops = []
        for n, item in enumerate(sends, start=1):
            content = item.data if item.data is not None else str(item.path)
            ops.append(CommitOperationAdd(path_in_repo=f"{run}/{item.rel}", path_or_fileobj=content))
            pause_hook(n)
        ops += [CommitOperationDelete(path_in_repo=f"{run}/{rel}") for rel in drops]
        ops.append(CommitOperationAdd(path_in_repo=f"{run}/{INDEX_NAME}",
                                      path_or_fileobj=ix.encode(index)))
        what = f"the commit of {len(sends)} file(s) of {run}"
        with self._calling(what), self._bounded(what, sum(i.size for i in sends)):
            info = self.api.create_commit(
                self.repo_id, ops, commit_message=f"aleph sync {run} step {index.get('step')}",
                parent_commit=previous.revision if previous else None)
        return info.oid

    def _bounded(self, what: str, sent: int):
        """A deadline (`PullLimits`: the answer's time + `sent` bytes at the minimum rate) on
        a call into huggingface_hub, which waits on a silent hub forever. SIGALRM: the main
        thread only (`aleph runs push`); the trainer's sync thread is bounded by its stop."""
        lim = self.limits
        return alarm_at(time.monotonic() + lim.answer_s + sent / lim.min_rate, SyncError(
            f"sync destination {self.spec}: {what}: not done within its deadline "
            f"({lim.answer_s:g} s + {sent:,} B at {lim.min_rate:,.0f} B/s); the destination "
            "keeps its previous snapshot"))

    def prune(self, run: str) -> None:
        """Nothing: the hub keeps a run's history as commits."""

    def fetch(self, run: str, snap: Snapshot, rel: str, out: Path, scratch: Path) -> None:
        name = f"{run}/{rel}"
        size = self._check_size(name, snap.revision, snap.files[rel]["size"], None)
        self._download(name, snap.revision, out, size)


def _raise_for_status(r, chunks) -> None:
    """huggingface_hub's error for an error answer (RepositoryNotFoundError, 401, ...), made
    from its body as `_get` read it (at most ERROR_BODY_MAX bytes, at the minimum rate): the
    library's check would read it whole, at any rate."""
    import httpx
    from huggingface_hub.utils import hf_raise_for_status

    if r.status_code < 400:
        return
    body = b"".join(chunks)
    keep = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in (
        "content-encoding", "content-length", "transfer-encoding")]
    hf_raise_for_status(httpx.Response(r.status_code, headers=keep,
                                       content=body, request=r.request))


def _chunks(r, most: int, bound: str, deadline: float, lim: PullLimits, late: Exception,
            where: str) -> Iterator[bytes]:
    """The raw body of `r`: at most `most` bytes, refused at the first byte more (`bound`
    names that many), at `deadline`, or when slower than `lim.min_rate` over a window."""
    got, window, since = 0, 0, time.monotonic()
    for chunk in r.iter_raw():
        if got + len(chunk) > most:
            raise SyncError(f"{where}: the body is longer than {bound}; refused at its first "
                            "byte more, nothing pulled")
        yield chunk
        got, window, now = got + len(chunk), window + len(chunk), time.monotonic()
        if now > deadline:
            raise late
        if now - since >= lim.window_s:
            if window / (now - since) < lim.min_rate:
                raise SyncError(f"{where}: {window / (now - since):,.0f} B/s over "
                                f"{now - since:.1f} s, below the minimum "
                                f"{lim.min_rate:,.0f} B/s; nothing pulled")
            since, window = now, 0
