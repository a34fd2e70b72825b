"""`aleph data fetch --captions`: E1's caption file from the hub, pinned, verified, resumable.

`CaptionEmporium/conceptual-captions-cc12m-llavanext` (CC-BY-SA-4.0): one `train.jsonl.gz`
of 10,965,172 records (3.58 GB) at the public record's short revision `1c24bdb`. The first
download resolves it to a commit through the hub's file record (commit, size, LFS sha256),
downloads into a hidden `.fetch/` partial file (resumed with a Range request, which
`hf_hub_download` does not do), checks size and sha256, and only then moves it to
`<dest>/train.jsonl.gz` and writes its record `train.jsonl.gz.fetch.json`. Later calls
check the file against the record without network. The record proves only that the file
matches it (whoever writes one can write the other); an expected sha256 from elsewhere
(`--sha256`, or CAPTIONS_SHA256) is what a forger cannot set. The HTTP half is `fetch_http`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

import aleph.data.fetch_http as fetch_http
import aleph.data.readers as readers
from aleph._io import atomic_write_json, fsync_dir, read_json_record, work_root
from aleph.data.fetch_http import FetchLimits
from aleph.errors import DataError

CAPTIONS_REPO = "CaptionEmporium/conceptual-captions-cc12m-llavanext"
CAPTIONS_FILE = "train.jsonl.gz"
CAPTIONS_REVISION = "1c24bdb"  # the public record's short id; resolved and recorded at first use
CAPTIONS_LICENCE = "CC-BY-SA-4.0"
# The sha256 of train.jsonl.gz at CAPTIONS_REVISION, from a source other than the file's own
# record: not known where this code was written (no network), so None: set it to the hub's LFS
# sha256 once read on a trusted machine; until then `--sha256 HEX` supplies it per call.
CAPTIONS_SHA256: str | None = None
RECORD_SUFFIX = ".fetch.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


def captions_dir() -> Path:
    """Where E1's data lives: <work>/data/e1."""
    return work_root() / "data" / "e1"


def _verify(path: Path, size: int, sha256: str) -> str | None:
    """None when the regular file `path` has `size` bytes and that sha256, else what differs."""
    have = readers.check_regular(path).st_size
    if have != size:
        return f"{have:,} bytes, expected {size:,}"
    h = hashlib.sha256()
    with readers.open_regular(path) as f:
        while block := f.read(8 << 20):
            h.update(block)
    return None if h.hexdigest() == sha256 else f"sha256 {h.hexdigest()}, expected {sha256}"


def _expected_sha256(given: str | None, repo: str, filename: str, revision: str) -> str | None:
    """The digest the file must have: `given` (--sha256), else CAPTIONS_SHA256 for E1's own
    file at its pinned revision, else None (then only the hub's record vouches for it)."""
    if given is not None:
        digest = given.strip().lower()
        if not _HEX64.fullmatch(digest):
            raise DataError(f"--sha256 {given[:80]!r}: expected 64 hex digits")
        return digest
    if (repo, filename, revision) == (CAPTIONS_REPO, CAPTIONS_FILE, CAPTIONS_REVISION):
        return CAPTIONS_SHA256
    return None


def _expect_source(given: str | None) -> str:
    return "--sha256" if given is not None else "CAPTIONS_SHA256 in aleph/data/fetch.py"


RECORD_MAX_BYTES = 64 << 10  # the record is a few hundred bytes
_RECORD_FIELDS = {"repo": str, "file": str, "revision": str, "commit": (_HEX40, "hex digits"),
                  "size": (int, "a size in bytes"), "sha256": (_HEX64, "hex digits")}


def read_record(path: Path) -> dict:
    """A fetch record (`read_json_record`: bounded, no link followed, _RECORD_FIELDS
    checked); else a DataError naming the file and the field."""
    try:
        return read_json_record(path, RECORD_MAX_BYTES, _RECORD_FIELDS)
    except ValueError as e:
        raise DataError(f"fetch record {path}: {e}; expected the JSON file this command "
                        "writes: move it away and fetch again") from None


def _hub_record(repo: str, filename: str, revision: str, endpoint: str | None,
                limits: FetchLimits) -> dict:
    """commit, size and sha256 of `filename` at `revision`, from the hub's file record
    (`fetch_http.file_record`: a HEAD with bounded redirects and time)."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, filename, repo_type="dataset", revision=revision, endpoint=endpoint)
    what = f"the hub's record of {repo}/{filename} at {revision}"
    try:
        meta = fetch_http.file_record(url, what, limits)
    except DataError:
        raise
    except Exception as e:  # offline, unknown repo/revision, 401: huggingface_hub raises many types
        first = (str(e).splitlines() or [""])[0][:300]  # may quote the server: bounded
        raise DataError(f"cannot read {what} ({type(e).__name__}: {first}); needs network "
                        "access to the hub (and HF_TOKEN if the repo is gated), or a copied file "
                        "and its record") from None
    commit, sha, size = meta["commit"], meta["sha256"], meta["size"]
    if not _HEX40.fullmatch(commit) or not _HEX64.fullmatch(sha):
        raise DataError(f"{what} lacks a full commit id or an LFS sha256 (commit "
                        f"{commit[:80]!r}, etag {sha[:80]!r}); expected an LFS file record")
    return {"commit": commit, "size": size, "sha256": sha}


def fetch_captions(dest: str | os.PathLike | None = None, revision: str = CAPTIONS_REVISION,
                   endpoint: str | None = None, repo: str = CAPTIONS_REPO,
                   filename: str = CAPTIONS_FILE, say=lambda line: None,
                   limits: FetchLimits | None = None, expect_sha256: str | None = None) -> Path:
    """The caption file under `dest` (default <work>/data/e1), checked, downloaded if
    needed; `expect_sha256` (else CAPTIONS_SHA256) is the digest it must have."""
    limits = limits if limits is not None else FetchLimits.from_env()
    dest = Path(dest).expanduser() if dest is not None else captions_dir()
    dest.mkdir(parents=True, exist_ok=True)
    final, record_path = dest / filename, dest / (filename + RECORD_SUFFIX)
    expect = _expected_sha256(expect_sha256, repo, filename, revision)
    record = None
    if os.path.lexists(record_path):
        record = read_record(record_path)
        if (record["repo"], record["file"], record["revision"]) != (repo, filename, revision):
            raise DataError(f"{record_path} records {record['repo']}/{record['file']} at "
                            f"{record['revision']}, not {repo}/{filename} at {revision}")
        if expect is not None and record["sha256"] != expect:
            raise DataError(f"{record_path} records sha256 {record['sha256']}, not the expected "
                            f"{expect} ({_expect_source(expect_sha256)}); the record and its file "
                            "are not this file: move them away and fetch again")
    if record is not None and os.path.lexists(final):
        bad = _verify(final, record["size"], record["sha256"])
        if bad:
            raise DataError(f"{final}: {bad} (its record {record_path.name}, commit "
                            f"{record['commit'][:12]}); it is not replaced: move it away and run "
                            "this again to download a good copy")
        what = (f"sha256 {record['sha256']}, the expected digest ({_expect_source(expect_sha256)})"
                if expect is not None else
                f"sha256 {record['sha256'][:16]}…; the record names {repo} at commit "
                f"{record['commit'][:12]} but cannot prove it (whoever wrote the file can write "
                "its record): pass --sha256 with a digest you trust to check the file itself")
        say(f"{final}: matches its record {record_path.name}: {record['size']:,} bytes, {what} "
            "(no download)")
        return final
    hub = _hub_record(repo, filename, revision, endpoint, limits)
    if expect is not None and hub["sha256"] != expect:
        raise DataError(f"the hub's record of {repo}/{filename} at {revision} gives sha256 "
                        f"{hub['sha256']} (commit {hub['commit'][:12]}), not the expected {expect} "
                        f"({_expect_source(expect_sha256)}); refused, nothing downloaded")
    if record is not None and (record["commit"], record["size"], record["sha256"]) != (
            hub["commit"], hub["size"], hub["sha256"]):
        raise DataError(f"{repo} revision {revision} now resolves to commit {hub['commit']} "
                        f"(size {hub['size']:,}, sha256 {hub['sha256'][:16]}…), but "
                        f"{record_path} recorded {record['commit']} (size {record['size']:,}, "
                        f"sha256 {record['sha256'][:16]}…); refused: the captions would change")
    entry = {"repo": repo, "file": filename, "revision": revision, **hub,
             "licence": CAPTIONS_LICENCE}
    if os.path.lexists(final):  # a copy placed without its record: kept only if it is this file
        bad = _verify(final, hub["size"], hub["sha256"])
        if bad:
            raise DataError(f"{final} exists without a record and is not {repo}/{filename} at "
                            f"{hub['commit'][:12]}: {bad}; it is not replaced: move it away")
    else:
        _download(dest, final, entry, endpoint, say, limits)
    atomic_write_json(record_path, {**entry, "fetched_utc": datetime.now(UTC)
                                    .strftime("%Y-%m-%dT%H:%M:%SZ")})
    say(f"{final}: {hub['size']:,} bytes, sha256 {hub['sha256']}, {repo} at commit "
        f"{hub['commit']} ({CAPTIONS_LICENCE}); record {record_path.name}")
    return final


def _download(dest: Path, final: Path, entry: dict, endpoint: str | None, say,
              limits: FetchLimits) -> None:
    """GET the file at its commit into .fetch/<file>.<sha256 prefix>.part, resuming
    (`fetch_http.get_into`, every bound of `limits`), then verify and move it into place."""
    from huggingface_hub import hf_hub_url

    partial_dir = dest / ".fetch"  # hidden: a partial download never looks like the file
    try:
        partial_dir.mkdir()
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(partial_dir).st_mode):  # a link to elsewhere: not ours
            raise DataError(f"{partial_dir} is not a directory this command made (a symbolic "
                            "link or a file); expected a directory: move it away") from None
    part = partial_dir / f"{entry['file']}.{entry['sha256'][:16]}.part"
    url = hf_hub_url(entry["repo"], entry["file"], repo_type="dataset", revision=entry["commit"],
                     endpoint=endpoint)
    size, error = entry["size"], ""
    deadline = time.monotonic() + limits.deadline_s  # one for the whole download
    for attempt in range(limits.attempts):
        have = fetch_http.partial_size(part)
        if time.monotonic() >= deadline:
            raise DataError(f"download of {entry['repo']}/{entry['file']} not done within the "
                            f"{limits.deadline_s:g} s deadline ({have:,} of {size:,} bytes; "
                            f"limit: {fetch_http.ENV_PREFIX}DEADLINE_S; {error}); run the same "
                            f"command again to resume from {part}")
        if have > size:  # not a prefix of this file: start again
            part.unlink()
            have = 0
        if have == size:
            break
        say(f"downloading {entry['repo']}/{entry['file']} at {entry['commit'][:12]}: "
            f"{have:,} of {size:,} bytes here, fetching the rest into {part}")
        try:
            fetch_http.get_into(url, part, have, size, limits, deadline)
        except DataError:
            raise
        except Exception as e:  # network, HTTP errors: huggingface_hub and httpx raise many types
            error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            if attempt + 1 < limits.attempts and time.monotonic() + 1.0 < deadline:
                time.sleep(1.0)
    have = fetch_http.partial_size(part)
    if have < size:
        raise DataError(f"download of {entry['repo']}/{entry['file']} at {entry['commit'][:12]} "
                        f"stopped at {have:,} of {size:,} bytes ({error}); run the same command "
                        f"again to resume from {part}")
    bad = _verify(part, size, entry["sha256"])
    if bad:
        part.unlink()  # ours (a regular file, checked above), and damaged: nothing kept
        _remove_empty(partial_dir)
        raise DataError(f"downloaded {entry['file']} is damaged: {bad} (the hub's record for "
                        f"commit {entry['commit'][:12]}); deleted, nothing kept under {dest}: "
                        "run the command again")
    os.replace(part, final)
    fsync_dir(dest)
    _remove_empty(partial_dir)


def _remove_empty(directory: Path) -> None:
    """Remove `directory` if it is empty (never what someone else put in it)."""
    try:
        directory.rmdir()
    except OSError:
        pass
