"""aleph.targets: the distillation target store (see docs/ARCHITECTURE.md).

One flat, exactly sized file of rows x dim targets plus a manifest, built from an
ordered list of chunk files either by streaming (bounded memory, resumable) or by
the in-RAM concatenate the a1 arm used; both give byte-identical stores.
"""

from aleph.targets.build import build_store, cached_store, ensure_store, store_dir_for
from aleph.targets.plan import DEFAULT_HEADROOM_BYTES, Plan, plan
from aleph.targets.sources import ChunkInfo, describe_sources, inspect_chunk, source_fingerprint
from aleph.targets.store import TargetStore, open_store
from aleph.targets.verify import verify_store

__all__ = [
    "DEFAULT_HEADROOM_BYTES", "ChunkInfo", "Plan", "TargetStore", "build_store", "cached_store",
    "describe_sources", "ensure_store", "inspect_chunk", "open_store", "plan",
    "source_fingerprint", "store_dir_for", "verify_store",
]
