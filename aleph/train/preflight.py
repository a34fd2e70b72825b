"""Checks and preparation before the model is built: device, allocator cap, VRAM probe, stores.

Each returns the line the launch header prints: a witness of what this launch applied.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aleph._io import atomic_write_json, file_kind, read_json, sha256_json, work_root
from aleph.errors import ConfigError, DataError, QuotaError, StoreError
from aleph.train.config import TrainConfig
from aleph.train.distributed import World

GIB = 1 << 30
E1_TARGET_DIM = 768  # the width of E1's teacher consensus (the e1 preset requires it)
TICK_SECONDS = 10.0  # progress cadence of a long input check or store build


def check_e1_device(cfg: TrainConfig, wants_cuda: bool) -> None:
    """An e1 launch with device=auto and no usable CUDA device is refused (one line, torch's
    reason): E1 on the CPU would train for months, with only "allocator cap: none" to say so.
    `--set device=cpu` stays possible on purpose."""
    if cfg.preset == "e1" and cfg.device == "auto" and not wants_cuda:
        raise ConfigError(
            f"config field 'device': 'auto' found no usable CUDA device ({cuda_reason()}); an e1 "
            "arm on the CPU would train for months: fix the GPU setup (driver >= 550.54.15 for "
            "CUDA 12.4, CUDA_VISIBLE_DEVICES), or --set device=cpu to train on the CPU on purpose")


def cuda_reason() -> str:
    """Why torch cannot use CUDA here, in its own words (first sentence)."""
    if torch.cuda.is_available():
        return "CUDA is available"
    try:
        torch.cuda.init()
    except Exception as e:  # RuntimeError/AssertionError with the driver's or torch's reason
        said = " ".join(str(e).split()) or type(e).__name__
        return said.split(". ")[0].rstrip(".")[:200]
    return "torch.cuda.is_available() is False"


def apply_allocator_cap(cfg: TrainConfig, device: torch.device) -> str:
    """Cap this process's share of the GPU (so two arms can share one card safely)."""
    if cfg.alloc_cap_fraction is None:
        return "allocator cap: none"
    if device.type != "cuda":
        return f"allocator cap: {cfg.alloc_cap_fraction} requested, not applied (no CUDA)"
    torch.cuda.set_per_process_memory_fraction(cfg.alloc_cap_fraction, device)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(total * cfg.alloc_cap_fraction)
    return f"allocator cap: {cfg.alloc_cap_fraction} of {total / GIB:.1f} GiB = {cap / GIB:.2f} GiB"


def estimate_vram_bytes(cfg: TrainConfig, n_params: int, world_size: int) -> int:
    """A floor for the VRAM probe: fp32 weights + grads + 2 AdamW moments, plus activations
    of the local batch (~34 B per token and width per layer for a bf16 BERT block, Korthikanti
    et al. 2022, and the B x L x L attention scores)."""
    local_b = cfg.batch_size // max(world_size, 1)
    states = 16 * n_params
    act = cfg.n_layers * local_b * cfg.max_len * (34 * cfg.d_model + 5 * cfg.n_heads * cfg.max_len)
    if cfg.checkpointing:
        act = act // cfg.n_layers + cfg.n_layers * local_b * cfg.max_len * cfg.d_model * 2
    return states + act + (512 << 20)  # + CUDA context and allocator slack


def vram_probe(cfg: TrainConfig, device: torch.device, required: int) -> str:
    """Compare free vs required bytes on the chosen GPU; raise QuotaError if it cannot fit."""
    if device.type != "cuda":
        return "VRAM probe: skipped: no CUDA"
    free, total = torch.cuda.mem_get_info(device)
    if cfg.alloc_cap_fraction is not None:
        free = min(free, int(total * cfg.alloc_cap_fraction))
    verdict = "pass" if free >= required else "FAIL"
    line = (f"VRAM probe: {torch.cuda.get_device_name(device)}: required {required / GIB:.2f} GiB, "
            f"free {free / GIB:.2f} GiB (of {total / GIB:.1f}): {verdict}")
    if free < required and cfg.vram_probe:
        raise QuotaError(line + "; free the GPU, lower batch_size or set vram_probe=false")
    return line


# --- data ----------------------------------------------------------------------------------

@dataclass
class Sources:
    """Resolved data sources of a run."""
    captions: str
    targets: list[str]
    tokenizer: str
    captions_column: str = "caption"


def resolve_sources(cfg: TrainConfig) -> Sources:
    """Smoke data (generated on first use) or the configured paths; directories expand."""
    if cfg.smoke_data:
        from aleph.data.smoke import default_root, ensure_smoke_data

        smoke = ensure_smoke_data(default_root(cfg.smoke_rows), rows=cfg.smoke_rows)
        return Sources(str(smoke.captions), [str(p) for p in smoke.target_chunks],
                       cfg.tokenizer or str(smoke.tokenizer_dir))
    _check_captions_path(cfg.captions)  # the first input named: the first one checked
    return Sources(cfg.captions, expand_targets(cfg.targets), cfg.tokenizer, cfg.captions_column)


def _check_captions_path(captions: str) -> None:
    """A captions source written as a path (absolute, ./ ../ ~, or a caption file suffix)
    that does not exist: said at once, before the tokenizer, the targets or a run
    directory's config are looked at (anything else is taken as a HF dataset id)."""
    from aleph.data.captions import FILE_SUFFIXES

    path = Path(captions).expanduser()
    written_as_path = (captions.startswith(("/", "./", "../", "~"))
                       or path.suffix in FILE_SUFFIXES)
    if written_as_path and not path.exists():
        raise DataError(f"captions path {captions} does not exist (config field 'captions'; "
                        f"expected a {'/'.join(FILE_SUFFIXES)} file or a HF dataset id)")


@dataclass
class Inputs:
    """What `check_inputs` found, handed to the launch so nothing is read twice."""

    sources: Sources
    tokenizer: Any = None  # rank 0's; other ranks load their own
    captions_sha256: str | None = None
    captions: Any = None  # the CaptionSource if it had to be hashed, for the token store build
    misalignment_allowed: dict | None = None  # the alignment figures allow_misaligned let through


def check_inputs(cfg: TrainConfig, say: Callable[[str], None] = lambda line: None) -> Inputs:
    """The input checks of README.md "What a launch checks", before the run directory exists
    (rank 0); a refusal names the input. Cheap on a resumed launch: row counts come from the
    cached stores' manifests, else the sources' own counts (captions never held in memory).
    `say` gets one line per check and progress lines while the captions are hashed."""
    from aleph.data.captions import check_row_counts, open_captions
    from aleph.data.tokenizer import load_tokenizer, tokenizer_fingerprint
    from aleph.data.tokens import open_token_store, token_store_dir

    t0 = time.monotonic()
    src = resolve_sources(cfg)
    with _timed(say, f"inputs: tokenizer {src.tokenizer or '(smoke data)'}"):
        tokenizer = load_tokenizer(src.tokenizer)
    with _timed(say, f"inputs: targets: {len(src.targets)} chunk file(s) from {src.targets[0]}"):
        target_rows, dim = _target_shape(src.targets)
    check_target_dim(cfg, dim, src.targets)
    say(f"inputs: targets: {target_rows:,} rows x {dim}")
    load = functools.partial(open_captions, column=src.captions_column)  # streamed, never a list
    digest, captions = captions_digest(src.captions, load, src.captions_column, say)
    rows = None
    if captions is None:  # the cached token store's count, when there is one
        cached = token_store_dir(digest, tokenizer_fingerprint(tokenizer), cfg.max_len)
        with contextlib.suppress(StoreError):  # prepare_tokens reports a broken store
            rows = open_token_store(cached).rows if cached.exists() else None
    if rows is None:
        captions = captions if captions is not None else load(src.captions)
        rows = captions.count_rows()  # parquet footer / newline count: captions not held
    if not rows:
        raise DataError(f"captions source {src.captions}: no rows; expected one caption per "
                        f"target row ({target_rows:,})")
    check_row_counts(rows, target_rows, f"captions {src.captions}",
                     f"targets ({len(src.targets)} chunk file(s) from {src.targets[0]})")
    check_shape(cfg, rows, len(tokenizer), tokenizer.pad_token_id, dim)
    allowed = None
    if cfg.preset == "e1" and not cfg.smoke_data:  # the pairing itself, on a sample
        from aleph.data.align import preflight_alignment

        allowed = preflight_alignment(src.captions, src.captions_column, src.targets, tokenizer,
                                      digest, cfg.allow_misaligned, say)
    say(f"inputs: OK: {rows:,} captions = {target_rows:,} target rows "
        f"({time.monotonic() - t0:.1f} s)")
    return Inputs(src, tokenizer, digest, captions, allowed)


def check_shape(cfg: TrainConfig, rows: int, vocab_size: int, pad_id: int, dim: int) -> None:
    """A batch larger than the data, or a model too big for memory, refused before the run
    directory exists."""
    from aleph.env.hostinfo import meminfo_bytes
    from aleph.model.encoder import check_fits
    from aleph.train.config import model_config
    from aleph.train.order import DataOrder
    DataOrder(cfg.seed, rows, cfg.batch_size)  # ConfigError naming batch_size
    check_fits(model_config(cfg, vocab_size, pad_id, dim), meminfo_bytes("MemAvailable"))


def check_target_dim(cfg: TrainConfig, dim: int, paths: list[str]) -> None:
    """Targets as wide as the run asks: target_dim when set, E1's 768 for the e1 preset
    (a 512-wide teacher would otherwise train an 'e1' arm without a word), else any."""
    want = cfg.target_dim or (E1_TARGET_DIM if cfg.preset == "e1" else 0)
    if not want or dim == want:
        return
    why = (f"config field 'target_dim' is {cfg.target_dim}" if cfg.target_dim else
           f"the e1 preset expects E1's {E1_TARGET_DIM}-d teacher targets")
    raise DataError(f"targets {paths[0]} ({len(paths)} chunk file(s)): {dim} wide, expected "
                    f"{want} ({why}); give targets of that width, or set --set target_dim={dim} "
                    f"to train on {dim}-d targets on purpose")


@contextmanager
def _timed(say: Callable[[str], None], what: str, tick: bool = True) -> Iterator[None]:
    """'<what> ...', then '<what>: still working (N s)' every TICK_SECONDS from a thread
    (unless `tick` is off), and '<what>: done in N s' if it took 2 s or more."""
    t0, done = time.monotonic(), threading.Event()

    def still() -> None:
        while tick and not done.wait(TICK_SECONDS):
            say(f"{what}: still working ({time.monotonic() - t0:.0f} s)")

    say(f"{what} ...")
    ticker = threading.Thread(target=still, name="preflight-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    if time.monotonic() - t0 >= 2.0:
        say(f"{what}: done in {time.monotonic() - t0:.1f} s")


class RowProgress:
    """Progress of a pass over `total` rows: counts, share and ETA at most every
    TICK_SECONDS (a quick pass prints none)."""

    def __init__(self, say: Callable[[str], None], what: str, total: int | None) -> None:
        self.say, self.what, self.total = say, what, total
        self.t0 = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last < TICK_SECONDS:
            return
        self.last = now
        elapsed, total = now - self.t0, self.total
        eta = f", ETA {(total - done) * elapsed / max(done, 1):.0f} s" if total else ""
        share = f" of {total:,} rows ({100 * done / total:.0f}%)" if total else " rows"
        self.say(f"{self.what}: {done:,}{share}, {elapsed:.0f} s{eta}")


def _target_shape(paths: list[str]) -> tuple[int, int]:
    """(rows, width) of the target chunks: the cached store's manifest when it matches, else
    the chunk headers (checking every chunk is readable and well-formed)."""
    from aleph.targets import describe_sources, source_fingerprint, store_dir_for
    from aleph.targets.sources import source_stats
    from aleph.targets.store import load_manifest

    with contextlib.suppress(StoreError):
        manifest = load_manifest(store_dir_for(paths))
        if manifest["source_fingerprint"] == source_fingerprint(source_stats(paths)):
            return manifest["rows"], manifest["dim"]
    infos = describe_sources(paths)
    return sum(info.rows for info in infos), infos[0].dim


def expand_targets(paths: tuple[str, ...]) -> list[str]:
    """Files as given; a directory becomes its chunk files in row order, as `aleph targets
    build DIR` reads it (`chunk_files_in`), so both build the same store."""
    from aleph.targets.sources import chunk_files_in

    out: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            try:
                out += chunk_files_in(p)
            except StoreError as e:
                raise ConfigError(f"config field 'targets': {e}") from None
        elif p.is_file():
            out.append(str(p))
        elif p.exists():  # a FIFO, a socket, a device: never opened
            raise ConfigError(f"config field 'targets': {p} is {file_kind(p.stat().st_mode)}; "
                              "expected a chunk file (a regular file) or a directory of chunk files")
        else:
            raise ConfigError(f"config field 'targets': {p} does not exist")
    return out


def prepare_targets(cfg: TrainConfig, sources: list[str], world: World, log) -> Any:
    """Plan (quota planner), then open the cached store or build it; logs choice and reason."""
    from aleph.env.cgroup import read_envelope
    from aleph.targets import cached_store, ensure_store, plan, source_fingerprint, store_dir_for
    from aleph.targets.sources import source_stats

    headroom = int(cfg.store_headroom_gib * GIB)
    p = plan(sources, read_envelope().memory_limit_bytes, headroom)
    impl = p.choice if cfg.store_implementation == "auto" else cfg.store_implementation
    if impl is None:
        raise QuotaError(f"no target store implementation fits: {p.reason}")
    if world.distributed and impl == "in_ram":
        raise ConfigError("config field 'store_implementation': in_ram keeps one full copy per "
                          "rank; with several ranks use streaming (shared memmap) or auto")
    forced = cfg.store_override and cfg.store_implementation != "auto" and not p.allowed.get(impl)
    if forced:  # the seed's a1 replay: in_ram inside the envelope that refuses it, on purpose
        log(f"target store: {impl} FORCED AGAINST THE QUOTA PLANNER (store_override=true); the "
            f"plan refused it: {p.reason}")
    else:
        p.require(impl)
    origin = "chosen by the quota planner" if cfg.store_implementation == "auto" else "forced by config"
    log(f"target store: {impl} ({origin}): {p.reason}")
    store_dir = store_dir_for(sources)
    hit = cached_store(store_dir, source_fingerprint(source_stats(sources)), impl) is not None
    # a build reads every chunk once: minutes on E1's 66 chunks, so it reports while it works
    building = _timed(log, f"target store: building {impl} from {len(sources)} chunk file(s) "
                           f"into {store_dir}")
    with contextlib.nullcontext() if hit else building:
        store = ensure_store(sources, implementation=impl, headroom_bytes=headroom, force=forced)
    log(f"target store: {'cache hit' if hit else 'built'} {store!r}")
    return store


def captions_identity(source: str, column: str = "caption") -> dict[str, Any]:
    """Cheap identity of a caption source (a file's path, size and mtime; a shard directory's
    shards; else the dataset id): the key of the captions' sha256 memo (`captions_digest`)."""
    path = Path(source)
    field = {} if column == "caption" else {"column": column}  # default keeps older memo keys
    if path.is_file():
        st = path.stat()
        return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                **field}
    if path.is_dir():  # a shard directory: each shard's name, size and mtime
        from aleph.data.captions import shards_identity

        return {**shards_identity(path), **field}
    return {"dataset": source, **field}


CAPTIONS_MEMO_DIR = ("cache", "captions-sha256")


def captions_digest(source: str, load, column: str = "caption",
                    say: Callable[[str], None] = lambda line: None) -> tuple[str, Any]:
    """(the captions' sha256 as `aleph.data.tokens.captions_sha256` defines it, the captions
    if they had to be read, else None). Hashing reads every caption, so the digest is
    memoised in <work>/cache/captions-sha256/ under the source's `captions_identity`."""
    from aleph.data.captions import CaptionSource
    from aleph.data.tokens import captions_sha256

    identity = captions_identity(source, column)
    memo = work_root().joinpath(*CAPTIONS_MEMO_DIR) / f"{sha256_json(identity)[:16]}.json"
    if memo.is_file():
        try:
            saved = read_json(memo)
        except (OSError, ValueError):
            saved = {}  # written atomically, so a hand edit: recompute and rewrite it
        saved = saved if isinstance(saved, dict) else {}
        digest = saved.get("captions_sha256")
        if saved.get("identity") == identity and isinstance(digest, str) and len(digest) == 64:
            say(f"inputs: captions {source}: content hash memoised ({memo.name})")
            return digest, None
    captions = load(source)
    what = f"inputs: captions {source}: hashing (once per file; memoised for later launches)"
    if isinstance(captions, CaptionSource):
        with _timed(say, what, tick=False):  # RowProgress says rows done, share and ETA
            total = captions.count_rows()  # cached on the source: the row check reuses it
            digest = captions.sha256(progress=RowProgress(say, "inputs: captions hashed", total))
    else:
        digest = captions_sha256(captions)
    atomic_write_json(memo, {"identity": identity, "captions_sha256": digest})
    return digest, captions


def prepare_tokens(cfg: TrainConfig, src: Sources, tokenizer, log,
                   known: tuple[str, Any] | None = None) -> Any:
    """Open the cached token store of (captions, tokenizer, max_len) or build it (rank 0),
    under `token_store_dir` as `aleph data tokens` does. `known`: the (captions sha256,
    caption source or None) that `check_inputs` already found."""
    from aleph.data.captions import open_captions
    from aleph.data.tokenizer import tokenizer_fingerprint
    from aleph.data.tokens import build_token_store, open_token_store, token_store_dir

    load = functools.partial(open_captions, column=src.captions_column)  # streamed, never a list
    digest, captions = known or captions_digest(src.captions, load, src.captions_column)
    fp = tokenizer_fingerprint(tokenizer)
    out = token_store_dir(digest, fp, cfg.max_len)
    if out.exists():
        store = open_token_store(out).require(
            {"captions_sha256": digest, "tokenizer_fingerprint": fp, "max_len": cfg.max_len})
        log(f"token store: cache hit {out} ({store.rows:,} rows x {store.max_len})")
        return store
    if captions is None:
        captions = load(src.captions)
    with _timed(log, f"token store: tokenising {src.captions} into {out} (once per captions, "
                     "tokenizer and max_len)"):
        store = build_token_store(captions, tokenizer, out, cfg.max_len, expect_sha256=digest)
    log(f"token store: built {out} ({store.rows:,} rows x {store.max_len})")
    return store
