"""huggingface_hub against a server the project does not trust (an HF_ENDPOINT mirror).

huggingface_hub turns what the server says into cache paths unchecked: an ETag becomes
`blobs/<etag>` and `locks/<repo>/<etag>.lock`, X-Repo-Commit `snapshots/<commit>/` (on a 404
`.no_exist/<commit>/`), a listing's names paths under the snapshot. An ETag of `../`
segments wrote a file where the server chose, outside HF_HOME.

- `guard_hub()` wraps the two functions every per-file answer passes through
  (`get_hf_file_metadata`, a 404's headers included, and `_get_metadata_or_catch_error`,
  which also rebuilds answers from a cached listing): an ETag that is not 8-128 hex digits
  or a commit not 40 raises `HubAnswerRefused` (exit 2) before a byte is written. A
  version lacking either function is refused (fails closed).
- `check_commit` and `check_repo_name` check a listing before any of its names is used.
"""

from __future__ import annotations

import re

from aleph._io import plain_relative, short_repr
from aleph.errors import AlephError

ETAG = re.compile(r"[0-9a-fA-F]{8,128}")  # git blob sha1, LFS sha256, quoted or weak
COMMIT = re.compile(r"[0-9a-f]{40}")
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


def _check_answer(url: object, etag: object, commit: object) -> None:
    """A server's ETag and commit for `url`, each checked when it is there."""
    if commit is not None:
        check_commit(commit, _where(url))
    if etag is not None:
        check_etag(etag, url)


def check_commit(commit: object, where: str) -> str:
    if not (isinstance(commit, str) and COMMIT.fullmatch(commit)):
        raise HubAnswerRefused(f"{where}: commit {short_repr(commit, 80)} is not a 40-hex-digit "
                               "commit id; refused before huggingface_hub made a path of it")
    return commit


def check_repo_name(name: object, where: str) -> str:
    """`name` if it is a plain relative POSIX path of a repo file."""
    if not plain_relative(name):
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
            _check_answer(url, None, headers.get("X-Repo-Commit"))
            raise
        _check_answer(url, m.etag, m.commit_hash)
        return m

    def checked_either(*args, **kwargs):
        got = either(*args, **kwargs)
        _check_answer(*got[:3])  # (url, etag, commit, ...)
        return got

    setattr(checked_metadata, _MARK, True)
    setattr(checked_either, _MARK, True)
    fd.get_hf_file_metadata = checked_metadata
    fd._get_metadata_or_catch_error = checked_either
