"""Where the probe rows (caption + own target) come from, and whether the run trained on them.

- e1 runs (config has `captions` and `targets`, present here): among the first
  E1_PROBE_WINDOW caption rows, the `rows` whose caption sha256 is smallest, in row order,
  with the matching rows of the run's target store (the one manifest.json recorded, content
  hash checked, else the one built from config `targets`). Seen in training: E1 holds
  nothing out (its published R@1 of about 0.998 reads as recall of trained rows). The hash
  makes the sample independent of arm, seed and file order; the window bounds what is read.
- Smoke runs: fresh rows of the smoke grammar and teacher with a seed the smoke data never
  uses: held out.
- Any run: `--probe-captions FILE` with `--probe-targets PATH` (a target store, its chunk
  directory, or one `.pt` file of (N, 768) rows), row for row, the first `rows` used; seen
  in training when FILE is the run's own captions, else not known.
eval.json's `probes.set` names which it was, `probes.seen_in_training` whether the rows
were trained on (null: not known).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from aleph.errors import DataError
from aleph.eval import rundir
from aleph.eval.evaluate import ProbeData

HELD_OUT_SEED = 7_919_001  # not a seed any smoke data set is generated with (those use 0..)
DEFAULT_ROWS = 2048
E1_PROBE_WINDOW = 131_072  # caption rows the e1 sample is drawn from: 64 x DEFAULT_ROWS


def smoke_probe(rows: int = DEFAULT_ROWS, seed: int = HELD_OUT_SEED) -> ProbeData:
    from aleph.data.smoke import generate

    captions, targets = generate(rows, seed)
    return ProbeData(tuple(captions), torch.from_numpy(targets),  # (rows, 768) fp16
                     f"smoke grammar, held-out seed {seed}, {rows} rows", "smoke-held-out", False)


def _load_targets(path: Path, rows: int) -> torch.Tensor:
    if path.is_dir():
        from aleph.targets import open_store
        from aleph.targets.locate import resolve_store

        store = open_store(resolve_store(path))  # a chunk directory: its built store
        n = min(rows, store.rows)
        return store.gather(torch.arange(n)).clone()  # (n, D)
    if path.suffix == ".pt" and path.is_file():
        try:
            t = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # unpickling errors have many types; all mean "not a tensor file"
            raise DataError(f"{path}: cannot load as a tensor file ({e})") from e
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            raise DataError(f"{path}: expected one 2-d tensor (N, D) of targets")
        return t[:rows]
    raise DataError(f"--probe-targets {path}: expected a target store directory, the chunk "
                    "directory it was built from, or a .pt file")


def file_probe(captions: str | Path, targets: str | Path, rows: int = DEFAULT_ROWS,
               config: dict | None = None) -> ProbeData:
    from aleph.data.captions import open_captions

    texts = open_captions(captions).head(rows)  # reads no further than `rows` captions
    if not texts:
        raise DataError(f"probe data: captions source {captions}: no rows")
    t = _load_targets(Path(targets), rows)  # (n, D)
    if len(texts) != t.shape[0]:
        raise DataError(f"probe data: {len(texts)} caption rows from {captions} but "
                        f"{t.shape[0]} target rows from {targets}; they must pair row for row")
    own = _same_file(captions, (config or {}).get("captions"))
    source = f"{Path(captions).name} + {Path(targets).name}, first {len(texts)} rows"
    return ProbeData(tuple(texts), t, source + (" (the run's own captions: trained on)" if own
                                                 else ""), "files", True if own else None)


def _same_file(a, b) -> bool:
    try:
        return bool(a) and bool(b) and Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False


def hash_sample(texts: list[str], rows: int) -> list[int]:
    """Row indices of the `rows` texts with the smallest sha256 of their UTF-8 bytes (ties:
    the lower row), in row order: the e1 probe rows within a window."""
    keys = sorted((hashlib.sha256(t.encode("utf-8")).digest(), i) for i, t in enumerate(texts))
    return sorted(i for _, i in keys[:rows])


def _run_store(config: dict, run_dir: Path | None):
    """(the target store the run trained on, None) or (None, why it is not here)."""
    from aleph.errors import StoreError
    from aleph.targets import open_store
    from aleph.targets.locate import resolve_sources

    manifest = {} if run_dir is None else (
        rundir.read_run_json(run_dir, rundir.MANIFEST, required=False) or {})
    for launch in reversed([e for e in manifest.get("launches") or [] if isinstance(e, dict)]):
        rec = (launch.get("inputs") or {}).get("target_store") if isinstance(launch.get("inputs"), dict) else None
        if isinstance(rec, dict) and rec.get("dir") and Path(str(rec["dir"])).is_dir():
            try:
                store = open_store(rec["dir"])
            except StoreError:
                break
            if store.content_sha256 == rec.get("content_sha256"):
                return store, None
            break
    try:
        return open_store(resolve_sources(list(config.get("targets") or []))), None
    except (StoreError, DataError) as e:
        return None, str(e)


def e1_probe(config: dict, rows: int = DEFAULT_ROWS, run_dir: Path | None = None,
             window: int = E1_PROBE_WINDOW) -> tuple[ProbeData | None, str | None]:
    """The e1 probe set of a run (module docstring), or None and why its inputs are not here."""
    from aleph.data.captions import open_captions

    captions = str(config.get("captions") or "")
    if not captions or not config.get("targets"):
        return None, "the run's config names no captions/targets"
    if not os.path.lexists(captions):
        return None, f"the run's captions {captions} are not a file here"
    store, why = _run_store(config, run_dir)
    if store is None:
        return None, f"the run's target store is not here ({why})"
    texts = open_captions(captions, column=config.get("captions_column") or "caption").head(window)
    if len(texts) > store.rows:
        raise DataError(f"e1 probes: {captions} has more rows than the run's target store "
                        f"{store.store_dir} ({store.rows:,}); row i must pair with target row i "
                        "(pass --probe-captions/--probe-targets, or --no-probes)")
    idx = hash_sample(texts, rows)
    targets = store.gather(torch.tensor(idx, dtype=torch.long)).clone()  # (n, D)
    source = (f"e1 hash sample of the run's rows: the {len(idx):,} rows with the smallest "
              f"sha256(caption) among the first {len(texts):,} of {Path(captions).name}, targets "
              f"from {store.store_dir}; seen in training")
    return ProbeData(tuple(texts[i] for i in idx), targets, source, "e1-hash-sample", True), None


def probe_for_run(config: dict, captions: str | None, targets: str | None, rows: int,
                  run_dir: Path | None = None) -> tuple[ProbeData | None, str | None]:
    """Probe data for a run and, when there is none, why: explicit files, else held-out
    smoke rows for smoke runs, else the e1 probe set when the run's inputs are here."""
    if (captions is None) != (targets is None):
        raise DataError("--probe-captions and --probe-targets go together (row i pairs with row i)")
    if captions is not None:
        return file_probe(captions, targets, rows, config), None
    if config.get("smoke_data"):
        return smoke_probe(rows), None
    return e1_probe(config, rows, run_dir)
