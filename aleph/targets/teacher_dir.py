"""A teacher model directory, checked before transformers is given it.

A directory someone handed over (or a hub mirror filled) may ask transformers to run its
own Python: an `auto_map` in config.json or tokenizer_config.json names classes in the
directory's .py files, which transformers imports after an interactive "[y/N]" prompt
unless `trust_remote_code=False`. Every loader here passes that; `check_model_dir` refuses
such a directory before anything of it is loaded, in one line, whatever stdin holds:

- every entry is a regular file or a directory (a FIFO or device named tokenizer.json would
  block or never end the tokenizer's read); sub-directories are not read by the loaders;
- no symbolic link (links are never followed out of an input directory: their target's
  bytes would be loaded and hashed into the plan); in a hub snapshot, where the library
  links each file to its blob, a link must lead to a regular file under the repo's `blobs/`;
- every JSON file but tokenizer.json (the tokenizers library's own format, no auto classes)
  is a UTF-8 JSON object of at most JSON_MAX bytes, none holds `auto_map`, and config.json
  names a `model_type` the installed transformers knows.

Returns the config and the files' sha256 (read through the descriptor that was checked).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

from aleph._io import file_kind, open_regular, read_json_bounded, short_repr
from aleph.errors import ConfigError

JSON_MAX = 64 << 20  # a config or tokenizer_config is kilobytes; vocab.json a few MB
_NOT_CHECKED = ("tokenizer.json",)


@dataclass(frozen=True)
class ModelDir:
    """A checked teacher directory: its config.json and {file name: sha256} of its files."""

    path: str
    config: dict
    files_sha256: dict[str, str]


def _refuse(path: str, what: str) -> ConfigError:
    return ConfigError(f"teacher directory {path}: {what}; refused before anything of it was "
                       "loaded (a teacher is a plain saved model: regular files, no code)")


def _entry(path: str, name: str, blobs: str | None) -> str | None:
    """The path to read entry `name` through (a link's target in a hub snapshot); None for
    a sub-directory."""
    full = os.path.join(path, name)
    st = os.lstat(full)
    if stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(full)
        root = os.path.realpath(blobs) if blobs is not None else None
        inside = root is not None and os.path.commonpath([target, root]) == root
        if not inside:
            raise _refuse(path, f"{name} is a symbolic link to {short_repr(target)}; links "
                          "are not followed out of a teacher directory (copy the file in)")
        st = os.stat(target)
        full = target
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, f"{name} is {file_kind(st.st_mode)}; expected a regular file")
    return full


def _sha256(path: str, name: str) -> str:
    try:
        with os.fdopen(open_regular(path, follow=False), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as e:  # swapped for a link or a FIFO since it was checked
        raise _refuse(os.path.dirname(path), f"{name}: {e.strerror or e}") from None


def check_model_dir(path: str, known_types: set[str] | frozenset[str],
                    blobs: str | None = None, hash_limit: int | None = None) -> ModelDir:
    """Check teacher directory `path` (module docstring); `known_types`: the model types
    the installed transformers has classes for; `blobs`: the hub cache's blob directory
    the links of a snapshot lead to (None: a local directory, where no link is accepted).
    Files larger than `hash_limit` bytes (every file, for -1) are checked but not hashed."""
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise _refuse(path, f"cannot list it ({e.strerror})") from None
    files, config = {}, None
    for name in names:
        full = _entry(path, name, blobs)
        if full is None:
            continue
        files[name] = full
        if not name.endswith(".json") or name in _NOT_CHECKED:
            continue
        try:
            obj = read_json_bounded(full, JSON_MAX)
        except (OSError, ValueError) as e:  # unreadable, too large, not UTF-8 JSON
            raise _refuse(path, f"{name}: {getattr(e, 'strerror', None) or e}") from None
        if not isinstance(obj, dict):
            if name in ("config.json", "tokenizer_config.json"):
                raise _refuse(path, f"{name} is a JSON {type(obj).__name__}, expected an object")
            continue
        if "auto_map" in obj:
            raise _refuse(path, f"{name} has an auto_map ({short_repr(obj['auto_map'], 80)}): "
                          "it asks transformers to run Python code shipped in the directory")
        if name == "config.json":
            config = obj
    if config is None:
        raise _refuse(path, "no config.json")
    kind = config.get("model_type")
    if not isinstance(kind, str) or kind not in known_types:
        raise _refuse(path, f"config.json model_type {short_repr(kind, 60)} is not a model "
                      "type the installed transformers knows")
    hashes = {n: _sha256(p, n) for n, p in files.items()
              if hash_limit is None or os.stat(p).st_size <= hash_limit}
    return ModelDir(path, config, hashes)
