"""Tokenizers: loading (bert-base-uncased or a local directory) and training the smoke WordPiece;
both load through `AutoTokenizer.from_pretrained` as transformers' fast `BertTokenizer`."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from aleph._io import file_kind, sha256_json, work_root
from aleph.data.bundle import TOKENIZER_PINS, fetch_hint, save_pretrained_atomic, tokenizer_dir
from aleph.errors import DataError

_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
_PROBE_TEXT = "a caption \u2603 \u2042 \U0001d51e \u00e9t\u00e9"  # characters few vocabularies hold
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # [PAD] = 0, as ModelConfig.pad_id


def _looks_like_path(name: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else (./x, /abs, a/b/c, ~) is a path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def load_tokenizer(name_or_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                   use_bundle: bool = True):
    """A transformers fast tokenizer from a local directory or a hub name (e.g. bert-base-uncased).

    A hub name comes from the offline bundle when it holds it (unless `use_bundle=False`),
    else from the hub at its TOKENIZER_PINS commit, cached under `cache_dir` (default
    <work root>/cache/hf). Anything that cannot be loaded, or a hub answer
    `aleph._hub.guard_hub` refuses, is a DataError."""
    from transformers import AutoTokenizer  # heavy import, only when a tokenizer is needed

    name = str(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in _TOKENIZER_FILES):
            raise DataError(f"tokenizer directory {name!r} holds none of {list(_TOKENIZER_FILES)}; "
                            "expected a saved transformers tokenizer (save_pretrained)")
        _check_entries(path)
        source, kwargs = str(path), {}
    elif _looks_like_path(name) or isinstance(name_or_dir, Path):
        raise DataError(f"tokenizer directory {name!r} does not exist")
    else:
        bundled = tokenizer_dir(name) if use_bundle else None  # the offline bundle first
        if bundled is not None:
            source, kwargs = str(bundled), {}
        else:
            from aleph._hub import guard_hub

            guard_hub()  # a mirror's ETag or commit never becomes a path unchecked
            cache = Path(cache_dir) if cache_dir is not None else work_root() / "cache" / "hf"
            source, kwargs = name, {"cache_dir": str(cache)}
            if name in TOKENIZER_PINS:
                kwargs["revision"] = TOKENIZER_PINS[name]
    try:
        # trust_remote_code=False: a directory asking for its own code is refused, never run
        # and never prompted for (transformers' interactive "run the custom code? [y/N]").
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kwargs)
    except Exception as e:  # a corrupt tokenizer.json surfaces as KeyError, TypeError, ...
        from aleph._hub import HubAnswerRefused

        cause: BaseException | None = e  # transformers re-raises a hub error as OSError
        while cause is not None and not isinstance(cause, HubAnswerRefused):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise DataError(f"tokenizer {name!r}: {cause}") from None
        if "contains custom code" in str(e):
            raise DataError(f"tokenizer {name!r} asks to run its own code (auto_map in its "
                            "tokenizer_config.json): refused, aleph-e1 never runs code that comes "
                            "with a tokenizer; expected a plain saved tokenizer") from None
        if path.is_dir():
            hint = ""
        elif source != name:
            hint = f" (the offline bundle's copy {source}; re-run `aleph data fetch` or copy it again)"
        else:
            hint = (" (a hub name: needs network access, a copy already in the cache (HF_HUB_OFFLINE=1 "
                    f"forbids downloads), {fetch_hint()})")
        first = " ".join(str(e).split()) or type(e).__name__
        raise DataError(f"cannot load tokenizer {name!r}{hint}: {type(e).__name__}: {first}") from e
    if not getattr(tok, "is_fast", False):
        raise DataError(f"tokenizer {name!r} is not a fast (tokenizers-backed) tokenizer")
    if len(tok) <= len(set(tok.all_special_tokens)):  # e.g. tokenizer_config.json alone
        raise DataError(f"tokenizer {name!r}: its vocabulary holds only its {len(tok)} special "
                        "tokens; expected a saved tokenizer (tokenizer.json or vocab.txt)")
    try:  # a WordPiece without [UNK] fails on the first unknown character, mid-build
        tok(_PROBE_TEXT)
    except Exception as e:
        first = " ".join(str(e).split())[:200] or type(e).__name__
        raise DataError(f"tokenizer {name!r}: cannot encode text ({first}); expected one that "
                        "encodes any caption (an unknown-token entry in its vocabulary)") from None
    return tok


def _check_entries(path: Path) -> None:
    """Every entry of a tokenizer directory is a regular file or a directory, not a link: a
    FIFO named tokenizer.json would block transformers' open forever."""
    for entry in sorted(path.iterdir()):
        st = entry.stat() if entry.exists() else entry.lstat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise DataError(f"tokenizer directory {str(path)!r}: {entry.name} is {file_kind(st.st_mode)}; "
                            "expected regular files (a saved transformers tokenizer)")
        if entry.is_symlink():  # docs/trust.md: links are never followed
            raise DataError(f"tokenizer directory {str(path)!r}: {entry.name} is a symbolic link; "
                            "links are not followed: copy the file or name its target")


def tokenizer_threads(cgroup_root: str | os.PathLike | None = None) -> int:
    """Threads the tokenizers library should use: the CPUs this process may run on, capped
    by the cgroup CPU quota rounded down (17 for the seed's 17.85), at least 1."""
    from aleph.env.cgroup import DEFAULT_ROOT, read_envelope
    from aleph.env.hostinfo import affinity

    n = len(affinity() or ()) or os.cpu_count() or 1
    cores = read_envelope(cgroup_root if cgroup_root is not None else DEFAULT_ROOT).cpu_cores
    if cores is not None:
        n = min(n, max(1, int(cores)))
    return max(1, n)


def configure_threads() -> str:
    """Set RAYON_NUM_THREADS to `tokenizer_threads()` unless the environment sets it; the
    line saying what applies. Must run before the process's first parallel encode."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in ("0", "false", "off", "no"):
        return "tokenizer threads: 1 (TOKENIZERS_PARALLELISM is off)"
    if os.environ.get("RAYON_NUM_THREADS"):
        return f"tokenizer threads: {os.environ['RAYON_NUM_THREADS']} (RAYON_NUM_THREADS, as set)"
    n = tokenizer_threads()
    os.environ["RAYON_NUM_THREADS"] = str(n)
    return f"tokenizer threads: {n} (CPU affinity and cgroup quota)"


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's serialised definition, less `truncation` and `padding`
    (transformers sets them on every call: they describe the last call, not the tokenizer)."""
    definition = json.loads(tokenizer.backend_tokenizer.to_str())
    definition.pop("truncation", None)
    definition.pop("padding", None)
    return sha256_json(definition)


def wordpiece_vocab(captions: Iterable[str], vocab_size: int = 1024) -> dict[str, int]:
    """A deterministic WordPiece vocabulary: the specials, every character seen (alone and
    as `##c`, so nothing is [UNK]), then words as the BERT normaliser and pre-tokeniser split
    them, by descending count (ties alphabetical), up to `vocab_size`. Not
    `WordPieceTrainer`: it breaks ties nondeterministically, and the smoke data must be
    byte-identical every time."""
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for caption in captions:
        counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(caption)))
    chars = sorted({c for w in counts for c in w})
    vocab = list(SPECIALS) + chars + [f"##{c}" for c in chars]
    if len(vocab) > vocab_size:
        raise DataError(f"vocab_size {vocab_size} is below the {len(vocab)} specials and characters")
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    vocab += words[: vocab_size - len(vocab)]
    return {tok: i for i, tok in enumerate(vocab)}


def train_wordpiece(captions: Iterable[str], out_dir: str | Path, vocab_size: int = 1024) -> Path:
    """Learn an uncased WordPiece vocabulary on `captions`; save it as a transformers
    BertTokenizer directory (the files bert-base-uncased ships), atomically."""
    from transformers import BertTokenizer

    bert = BertTokenizer(vocab=wordpiece_vocab(captions, vocab_size), do_lower_case=True,
                         model_max_length=512)
    return save_pretrained_atomic(bert, out_dir)
