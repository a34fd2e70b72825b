"""huggingface_hub against a server the project does not trust (an HF_ENDPOINT mirror).

huggingface_hub (0.36 in the teacher set, 1.x in the E1 stack) turns what the server says
into paths without checking it: a file's ETag becomes `blobs/<etag>` and
`locks/<repo>/<etag>.lock` in the cache (and part of a `.incomplete` name beside a
local_dir), the X-Repo-Commit header becomes `snapshots/<commit>/` and, on a 404,
`.no_exist/<commit>/`; a repo listing's names become paths under the snapshot. An ETag of
`../` segments wrote a file and its lock where the server chose, outside HF_HOME.

- `guard_hub()` wraps the two functions through which every per-file answer reaches those
  paths (`file_download.get_hf_file_metadata`, the HEAD, including the headers of a 404,
  and `file_download._get_metadata_or_catch_error`, which also rebuilds answers from a
  cached tree listing), so an ETag that is not 8-128 hex digits or a commit that is not 40
  hex digits raises `HubAnswerRefused` (one line, exit 2) before the library writes a byte.
  Installed once per process, for every later download; it only ever refuses. If a
  huggingface_hub version lacks either function the guard refuses to run (fails closed).
- `check_commit` and `check_repo_name` check a listing (its commit, its file names: no
  `..` or `.` part, not absolute, no backslash, no empty part, no control character) before
  any of its names is used.
"""

from __future__ import annotations

import re

from aleph._io import short_repr
from aleph.errors import AlephError

ETAG = re.compile(r"[0-9a-fA-F]{8,128}")  # git blob sha1, LFS sha256, quoted or weak
COMMIT = re.compile(r"[0-9a-f]{40}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MARK = "_aleph_guarded"


class HubAnswerRefused(AlephError):
    """A hub server answered a name, ETag or commit that is not what the hub sends; nothing
    was written."""


def _where(url: object) -> str:
    return f"hub answer for {short_repr(str(url), 200)}" if url else "hub answer"


def check_etag(etag: object, url: object = None) -> None:
    if not (isinstance(etag, str) and ETAG.fullmatch(etag)):
        raise HubAnswerRefused(f"{_where(url)}: ETag {short_repr(etag, 80)} is not a hex "
                               "digest (8-128 hex digits); refused before huggingface_hub "
                               "made a path of it")


def check_commit(commit: object, where: str) -> str:
    if not (isinstance(commit, str) and COMMIT.fullmatch(commit)):
        raise HubAnswerRefused(f"{where}: commit {short_repr(commit, 80)} is not a 40-hex-digit "
                               "commit id; refused before huggingface_hub made a path of it")
    return commit


def check_repo_name(name: object, where: str) -> str:
    """`name` if it is a plain relative POSIX path of a repo file."""
    if (not isinstance(name, str) or not name or name.startswith("/") or "\\" in name
            or _CONTROL.search(name) or any(p in ("", ".", "..") for p in name.split("/"))):
        raise HubAnswerRefused(f"{where}: the repo lists a file {short_repr(name, 120)}, not a "
                               "plain relative path (no '..', no absolute path, no backslash, "
                               "no empty part); nothing was downloaded")
    return name


def guard_hub() -> None:
    """Install the checks of the module docstring into huggingface_hub (idempotent)."""
    from huggingface_hub import file_download as fd

    meta = getattr(fd, "get_hf_file_metadata", None)
    either = getattr(fd, "_get_metadata_or_catch_error", None)
    if meta is None or either is None:
        raise HubAnswerRefused("huggingface_hub: this version lacks get_hf_file_metadata or "
                               "_get_metadata_or_catch_error, where aleph checks a server's "
                               "ETags and commits; refusing to download unchecked")
    if getattr(meta, _MARK, False) and getattr(either, _MARK, False):
        return

    def checked_metadata(*args, **kwargs):
        url = kwargs.get("url", args[0] if args else None)
        try:
            m = meta(*args, **kwargs)
        except Exception as e:  # a 404's X-Repo-Commit becomes .no_exist/<commit>/
            headers = getattr(getattr(e, "response", None), "headers", None) or {}
            commit = headers.get("X-Repo-Commit")
            if commit is not None:
                check_commit(commit, _where(url))
            raise
        if m.commit_hash is not None:
            check_commit(m.commit_hash, _where(url))
        if m.etag is not None:
            check_etag(m.etag, url)
        return m

    def checked_either(*args, **kwargs):
        got = either(*args, **kwargs)
        url, etag, commit = got[0], got[1], got[2]
        if etag is not None:
            check_etag(etag, url)
        if commit is not None:
            check_commit(commit, _where(url))
        return got

    setattr(checked_metadata, _MARK, True)
    setattr(checked_either, _MARK, True)
    fd.get_hf_file_metadata = checked_metadata
    fd._get_metadata_or_catch_error = checked_either
