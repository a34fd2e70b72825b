"""A Hugging Face hub destination: a model repo, one commit per push.

A run's files are mirrored at `runs/<run>/<path>` beside its index `.aleph-sync.json`; a
push is one commit (changed files, deletions, new index), so the repo moves between
complete snapshots or not at all, and a pull fetches every file at the head commit it read
once. Token and endpoint are huggingface_hub's (HF_TOKEN, HF_ENDPOINT).

Others may write the repo: a listed name that is not a plain relative path is refused,
listed sizes are checked before a download (no index over INDEX_MAX, no file of another
size than its index records), and commits and ETags must be hex digests (`aleph._hub`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aleph.sync.index as ix
from aleph._hub import check_commit, guard_hub
from aleph.sync.dest import Destination, pause_hook, scrub
from aleph.sync.index import Snapshot, SyncError
from aleph.sync.select import Item

INDEX_NAME = ".aleph-sync.json"
BRANCH = "main"


class HubDestination(Destination):
    def __init__(self, repo_id: str, endpoint: str | None = None) -> None:
        from huggingface_hub import HfApi

        self.repo_id, self.spec, self.endpoint = repo_id, f"hf:{repo_id}", endpoint
        self.api = HfApi(endpoint=endpoint)
        self._created = False
        self._sizes: dict[str, dict[str, int | None]] = {}  # commit -> {file: size listed}

    @contextlib.contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        """A hub that cannot be reached, refuses the token or answers an error, as one
        SyncError naming the destination (token masked): not a traceback from httpx."""
        import httpx

        try:
            yield
        except (OSError, httpx.HTTPError) as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            hint = (" (no access: is HF_TOKEN set, to a token with access to this repo?)"
                    if status in (401, 403) else "")
            first = (str(e).strip().splitlines() or [""])[0]
            raise SyncError(scrub(f"sync destination {self.spec}: {what} failed: "
                                  f"{type(e).__name__}: {first}{hint}")) from None

    def _head(self, revision: str = BRANCH):
        """(commit sha, file names) at `revision`, their listed sizes kept; None when the repo
        does not exist. A name that is not a plain relative path is refused."""
        from huggingface_hub.errors import RepositoryNotFoundError

        with self._calling("reading the repo"):
            try:
                info = self.api.repo_info(self.repo_id, revision=revision, files_metadata=True)
            except RepositoryNotFoundError:
                return None
        check_commit(info.sha, f"sync destination {self.spec}")
        sizes = {s.rfilename: s.size for s in info.siblings or []}
        for name in sizes:
            ix.check_rel(name, f"sync destination {self.spec}@{info.sha[:12]}: the repo lists a file")
        self._sizes[info.sha] = sizes
        return info.sha, list(sizes)

    def _check_size(self, name: str, revision: str, size: int | None, most: int | None) -> None:
        """Refuse, before downloading it, a file whose size the listing reports as other than
        `size` (or above `most`); a hub that reports none is checked after the download."""
        if revision not in self._sizes:
            self._head(revision)
        listed = self._sizes.get(revision, {}).get(name)
        if listed is not None and ((size is not None and listed != size)
                                   or (most is not None and listed > most)):
            want = (f"{size:,} B as its index records" if size is not None else
                    f"at most {most:,} B (the cap on an index)")
            raise SyncError(f"sync destination {self.spec}@{revision[:12]}: {name}: listed as "
                            f"{listed:,} B, expected {want}; not downloaded")

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
        self._check_size(name, head[0], None, ix.INDEX_MAX)
        with tempfile.TemporaryDirectory(prefix="aleph-sync-") as tmp:
            with open(self._download(name, head[0], Path(tmp)), "rb") as f:
                data = f.read(ix.INDEX_MAX + 1)  # bounded: one byte more tells "too large"
        if len(data) > ix.INDEX_MAX:
            raise SyncError(f"sync destination {where}: larger than {ix.INDEX_MAX:,} B (the cap on "
                            "an index)")
        return Snapshot(ix.parse(data, where), head[0])

    def _download(self, name: str, revision: str, local_dir: Path) -> Path:
        from huggingface_hub import hf_hub_download

        guard_hub()  # the file's ETag and commit checked before the library uses them
        with self._calling(f"downloading {name} at {revision[:12]}"):
            return Path(hf_hub_download(self.repo_id, name, revision=revision,
                                        local_dir=local_dir, endpoint=self.endpoint))

    def publish(self, run: str, index: dict, sends: list[Item], drops: list[str],
                previous: Snapshot | None, rewrite: frozenset[str] = frozenset()) -> str:
        # `rewrite` needs nothing more here: every file in `sends` is uploaded whole.
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        if not self._created:
            with self._calling("creating the repo"):
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
        with self._calling(f"the commit of {len(sends)} file(s) of {run}"):
            info = self.api.create_commit(
                self.repo_id, ops, commit_message=f"aleph sync {run} step {index.get('step')}",
                parent_commit=previous.revision if previous else None)
        return info.oid

    def fetch(self, run: str, snap: Snapshot, rel: str, out: Path, scratch: Path) -> None:
        name = f"{run}/{rel}"
        self._check_size(name, snap.revision, snap.files[rel]["size"], None)
        got = self._download(name, snap.revision, scratch)
        os.replace(got, out)
