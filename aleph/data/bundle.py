"""The offline bundle: what a real run fetches from the Hugging Face hub, as plain files.

`aleph data fetch` writes it where there is network; an air-gapped VM gets a copy, and the
loaders look there before the hub. Layout ($ALEPH_OFFLINE_BUNDLE, else <work>/data/offline):

  bundle.json          format, version, tokenizers {name: {dir, fingerprint, revision,
                       files: {name: sha256}}}, sts {task: {dataset, revision, split, pairs,
                       file, sha256}}
  tokenizers/<name>/   a saved tokenizer ("org/name" stored as "org--name")
  sts/<task>.jsonl     one {"sentence1", "sentence2", "score"} per line, in the split's order

Items are written atomically and bundle.json last, so it lists only complete items. An STS
task fetched under another pin than the code's is refused by name.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from aleph._io import (
    atomic_write_json,
    atomic_write_text,
    check_record,
    fsync_dir,
    read_chunked,
    read_json_record,
    sha256_bytes,
    sha256_file,
    short_repr,
    work_root,
)
from aleph.errors import DataError

FORMAT = "aleph-offline-bundle"
VERSION = 1
MANIFEST = "bundle.json"
MANIFEST_MAX_BYTES = 16 << 20  # names, revisions and hashes of a few tokenizers and tasks
STS_MAX_BYTES = 256 << 20  # an STS task's pairs (STS-B's test split is about 0.5 MB)
# Hub tokenizers pinned to a commit: bert-base-uncased's main-branch snapshot as seen in
# public caches and scripts since 2024 (E1-FACTS.md, "Pins for evaluation"; not re-checked
# against the hub from here: a wrong pin fails the download loudly, never silently).
BERT_BASE_UNCASED_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"
TOKENIZER_PINS = {"bert-base-uncased": BERT_BASE_UNCASED_REVISION,
                  "google-bert/bert-base-uncased": BERT_BASE_UNCASED_REVISION}


def bundle_root() -> Path:
    """$ALEPH_OFFLINE_BUNDLE, else <work root>/data/offline."""
    env = os.environ.get("ALEPH_OFFLINE_BUNDLE")
    return Path(env).expanduser().absolute() if env else work_root() / "data" / "offline"


def fetch_hint() -> str:
    """The sentence the offline errors end with: where a bundle would be looked for."""
    return (f"or an offline bundle in {bundle_root()} (made by `aleph data fetch` on a machine "
            "with network, then copied there; ALEPH_OFFLINE_BUNDLE names another directory)")


def _slug(name: str) -> str:
    return name.replace("/", "--")


def read_manifest(root: Path | None = None) -> dict[str, Any] | None:
    """The bundle's manifest, or None when there is no bundle; a broken one is a DataError."""
    path = (root if root is not None else bundle_root()) / MANIFEST
    if not path.is_file():
        return None
    try:  # a bundle copied from elsewhere: a regular file (no link), bounded size and depth
        man = read_json_record(path, MANIFEST_MAX_BYTES)
        if (got := (man.get("format"), man.get("version"))) != (FORMAT, VERSION):
            raise ValueError(f"format {got!r}, expected ({FORMAT!r}, {VERSION})")
        return check_record(man, {"tokenizers": dict, "sts": dict})
    except ValueError as e:
        raise DataError(f"{path}: {e}; re-run `aleph data fetch`") from None


def _update_manifest(root: Path, section: str, name: str, entry: dict) -> None:
    man = read_manifest(root) or {"format": FORMAT, "version": VERSION, "tokenizers": {}, "sts": {}}
    man[section][name] = entry
    atomic_write_json(root / MANIFEST, man)


def tokenizer_dir(name: str, root: Path | None = None) -> Path | None:
    """The bundle's copy of hub tokenizer `name`, or None when the bundle has none."""
    root = root if root is not None else bundle_root()
    man = read_manifest(root)
    if man is None or name not in man["tokenizers"]:
        return None
    d = root / "tokenizers" / _slug(name)
    if not d.is_dir():
        raise DataError(f"{root / MANIFEST}: lists tokenizer {name!r} but {d} is missing; "
                        "re-run `aleph data fetch` or copy the whole bundle directory")
    return d


MAX_TOKENIZER_FILE_BYTES = 64 << 20  # bert-base-uncased's largest file is ~0.7 MB


def tokenizer_files(directory: str | os.PathLike) -> dict[str, str]:
    """{file name: sha256} of the regular files of a tokenizer directory (links and other
    entries left out; a file over MAX_TOKENIZER_FILE_BYTES refused)."""
    out = {}
    for entry in sorted(Path(directory).iterdir()):
        st = entry.lstat()
        if not stat.S_ISREG(st.st_mode):
            continue
        if st.st_size > MAX_TOKENIZER_FILE_BYTES:
            raise DataError(f"{entry}: {st.st_size:,} bytes, more than a tokenizer file holds "
                            f"(at most {MAX_TOKENIZER_FILE_BYTES:,})")
        out[entry.name] = sha256_file(entry)
    return out


def save_pretrained_atomic(tokenizer, out_dir: str | Path) -> Path:
    """`tokenizer.save_pretrained` into a temporary sibling, fsynced, renamed over `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
        fsync_dir(out_dir.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def add_tokenizer(root: Path, name: str, tokenizer, fingerprint: str) -> Path:
    """Save hub tokenizer `name` into the bundle with each file's sha256; its directory."""
    final = save_pretrained_atomic(tokenizer, root / "tokenizers" / _slug(name))
    _update_manifest(root, "tokenizers", name,
                     {"dir": f"tokenizers/{final.name}", "fingerprint": fingerprint,
                      "revision": TOKENIZER_PINS.get(name), "files": tokenizer_files(final)})
    return final


def pairs_jsonl(pairs) -> str:
    """One {"sentence1", "sentence2", "score"} JSON object per line: the bundle's task file."""
    return "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n"
                   for a, b, s in pairs)


def add_sts(root: Path, task: str, dataset: str, revision: str, split: str,
            pairs: tuple[tuple[str, str, float], ...], expected_pairs: int | None = None) -> Path:
    """Write an STS task's pairs into the bundle; a pair count other than `expected_pairs`
    (when given) is refused, nothing written."""
    if expected_pairs is not None and len(pairs) != expected_pairs:
        raise DataError(f"STS task {task!r}: {dataset}@{revision[:12]} {split} gave "
                        f"{len(pairs):,} pairs, its pinned split has {expected_pairs:,}; not "
                        "written to the bundle (a changed or partial download)")
    path = root / "sts" / f"{task}.jsonl"
    atomic_write_text(path, pairs_jsonl(pairs))
    _update_manifest(root, "sts", task, {
        "dataset": dataset, "revision": revision, "split": split, "pairs": len(pairs),
        "file": f"sts/{task}.jsonl", "sha256": sha256_file(path)})
    return path


def sts_file(task: str, dataset: str, revision: str, root: Path | None = None) -> Path | None:
    """The bundle's file of STS task `task` fetched from `dataset` at `revision`; None when
    it has no such task; a DataError when it has it under another pin or damaged."""
    root = root if root is not None else bundle_root()
    man = read_manifest(root)
    if man is None or task not in man["sts"]:
        return None
    entry = man["sts"][task]
    if not isinstance(entry, dict):
        raise DataError(f"{root / MANIFEST}: STS task {task!r}: {short_repr(entry, 80)}, expected "
                        "an object; re-run `aleph data fetch`")
    if (entry.get("dataset"), entry.get("revision")) != (dataset, revision):
        raise DataError(
            f"{root / MANIFEST}: STS task {task!r} was fetched from {entry.get('dataset')}@"
            f"{str(entry.get('revision'))[:12]}, this code pins {dataset}@{revision[:12]}; "
            "re-run `aleph data fetch` on a machine with network and copy the bundle again")
    path = root / "sts" / f"{task}.jsonl"  # the name fetch writes; the entry's `file` not followed
    try:  # a bundle copied from elsewhere: a regular file, no link, bounded
        same = sha256_bytes(read_chunked(path, STS_MAX_BYTES)) == entry.get("sha256")
    except OSError:
        same = False
    if not same:
        raise DataError(f"{path}: missing or its sha256 differs from {root / MANIFEST} (or "
                        "not a regular file); copy the bundle again")
    return path


def pinned_sts_sha256(task: str, dataset: str, revision: str, root: Path | None = None) -> str | None:
    """The sha256 the bundle recorded for STS task `task` fetched from `dataset` at
    `revision`, or None when it has none."""
    try:
        man = read_manifest(root if root is not None else bundle_root())
    except DataError:
        return None  # a broken bundle pins nothing; loading from it says why
    entry = (man or {"sts": {}})["sts"].get(task)
    if not isinstance(entry, dict) or (entry.get("dataset"), entry.get("revision")) != (dataset, revision):
        return None
    return entry["sha256"] if isinstance(entry.get("sha256"), str) else None
