"""Target store part of `aleph runs diff`: same content? same holding?

"Holding" is how a run consumed its targets (the in-RAM concatenate or the streaming
memmap); "content" is the bytes. The seed's a1 used a different holding from a2/a3 with
the same bytes: a caveat, not a difference in what was trained on.
"""

from __future__ import annotations

from pathlib import Path

from aleph._io import read_json_bounded, sha256_file
from aleph.targets.format import MANIFEST_FILE
from aleph.targets.store import content_sha256

SIZE_KEYS = ("rows", "dim", "dtype", "byte_length")
MANIFEST_MAX_BYTES = 64 << 20  # a store manifest lists its chunks: a few MB for E1's
HASH_LIMIT_BYTES = 8 << 30  # re-hash store data files up to this size (the E1 store is 49 GB)


def _size(t: dict) -> str:
    return ", ".join(f"{k} {t[k]:,}" if isinstance(t[k], int) else f"{k} {t[k]}"
                     for k in SIZE_KEYS if t.get(k) is not None) or "size not recorded"


def _store_manifest(t: dict) -> dict | None:
    """The store's own manifest.json, when the run's record names a readable directory."""
    if not t.get("dir"):
        return None
    path = Path(str(t["dir"])) / MANIFEST_FILE  # the target store's own manifest
    try:  # a path another machine recorded: a regular file, bounded size and depth
        data = read_json_bounded(path, MANIFEST_MAX_BYTES, follow=False)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def content_key(t: dict) -> str | None:
    """Path-independent identity of a store's contents (`aleph.targets.store.content_sha256`):
    as recorded, else recomputed from the store's own manifest when it is readable here."""
    if isinstance(t.get("content_sha256"), str):
        return t["content_sha256"]
    store = _store_manifest(t)
    try:
        return content_sha256(store) if store else None
    except (KeyError, TypeError):
        return None


def data_sha256(t: dict, limit: int = HASH_LIMIT_BYTES) -> str | None:
    store = _store_manifest(t)
    if store is None:
        return None
    data = Path(str(t["dir"])) / store.get("data_file", "targets.bin")
    if not data.is_file() or data.stat().st_size > limit:
        return None
    return sha256_file(data)


def compare_targets(ta: dict, tb: dict) -> list[tuple[str, str]]:
    """(level, text) findings comparing two runs' target store records."""
    if differing := [k for k in SIZE_KEYS if ta.get(k) != tb.get(k)]:
        return [("blocker", f"target stores differ in {', '.join(differing)}: {_size(ta)} vs {_size(tb)}")]
    ma, mb = ta.get("manifest_sha256"), tb.get("manifest_sha256")
    ka, kb = content_key(ta), content_key(tb)
    if ma is not None and ma == mb:
        why = f"identical store manifest {ma[:12]}"
    elif ka is not None and ka == kb:
        why = "same source chunks: every chunk's sha256 equal, in order"
    elif ka is None or kb is None:
        return [("caveat", f"store manifests differ ({str(ma)[:12]} vs {str(mb)[:12]}) and a store "
                 "directory is not readable here: contents not compared")]
    else:
        return [("blocker", "different target contents: the stores' source chunks differ "
                 f"(manifests {str(ma)[:12]} vs {str(mb)[:12]})")]
    ha, hb = data_sha256(ta), data_sha256(tb)
    if ha is not None and hb is not None:
        if ha != hb:
            return [("blocker", f"store data files differ: sha256 {ha[:12]} vs {hb[:12]}")]
        why += f"; data files re-hashed, both sha256 {ha[:12]}"
    ia, ib = ta.get("implementation"), tb.get("implementation")
    if ia == ib:
        return [("same", f"same targets ({why}; {_size(ta)}), both held by the {ia} store")]
    return [("caveat", f"same content, different holding: A consumed targets through the {ia} "
             f"store, B through the {ib} store; contents byte-identical ({why}; {_size(ta)})")]


def compare_tokens(ta: dict, tb: dict, sources_differ: bool) -> list[tuple[str, str]]:
    """(level, text) findings on what the runs tokenised: a token store is named by the key
    of (captions content, tokenizer, max_len), so equal names mean the same token ids. Keys
    that cannot be compared are a caveat only when `sources_differ` (the configs' data
    locations differ)."""
    ka, kb = (Path(str(t["token_store"])).name if t.get("token_store") else None for t in (ta, tb))
    if ka is not None and kb is not None:
        if ka == kb:
            return [("same", f"same token store key {ka}: captions content, tokenizer and max_len identical")]
        return [("blocker", f"different captions, tokenizer or max_len: token store keys {ka} vs {kb}")]
    if sources_differ:
        return [("caveat", "the configs name different data locations and a run records no token "
                 "store key: caption contents not compared")]
    return []
