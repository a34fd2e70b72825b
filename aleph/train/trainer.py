"""The Trainer: everything one launch holds on one rank, built in one place, in order
(`build_trainer`: header -> stores -> model, init or resume)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aleph.env.hostinfo import pick_device
from aleph.errors import DataError
from aleph.model import ModelConfig, build_model
from aleph.record.fingerprint import Tracer
from aleph.record.heartbeat import LaunchMonitor
from aleph.record.layout import RunLayout
from aleph.train import checkpoint as ckpt
from aleph.train import outputs, preflight
from aleph.train.config import TrainConfig, echo, model_config
from aleph.train.distributed import World
from aleph.train.identity import hostname
from aleph.train.optim import make_optimizer, make_scheduler
from aleph.train.order import DataOrder
from aleph.train.signals import StopFlag, preflight_pause


def _quiet(line: str) -> None:
    """The log of a trainer outside a launch (benches, tests): lines go nowhere."""


@dataclass
class Trainer:
    """One launch on one rank. Rank 0 alone writes the run directory (`manifest`, `syncer`
    are None on other ranks and outside a launch)."""

    cfg: TrainConfig
    world: World
    device: torch.device
    model: torch.nn.Module  # the plain module: weights, health gauges, saves
    net: torch.nn.Module  # what a step calls: `model`, compiled in place and/or wrapped in DDP
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    order: DataOrder
    total_steps: int
    pos: ckpt.Position  # advanced after each step, saved in every resume state
    run_dir: Path | None = None
    launch_id: str = ""
    log: Callable[[str], None] = _quiet
    manifest: outputs.Manifest | None = None
    stop: StopFlag | None = None
    monitor: LaunchMonitor = field(default_factory=lambda: LaunchMonitor(None, ""))
    tracer: Tracer = field(default_factory=Tracer)
    syncer: Any = None  # rank 0's aleph.sync.Syncer; None when sync_to is off
    sources: preflight.Sources | None = None
    tokens: Any = None  # aleph.data.tokens.TokenStore
    targets: Any = None  # aleph.targets.TargetStore


def build_trainer(cfg: TrainConfig, world: World, run_dir: Path, launch_id: str, log,
                  manifest: outputs.Manifest | None, stop: StopFlag, inputs: preflight.Inputs,
                  code: dict, monitor: LaunchMonitor, tracer: Tracer, syncer=None) -> Trainer:
    """Header -> stores -> model: the launch's setup after the lock, in this order. A signal
    meanwhile raises StopRequested wherever setup is (run.py records 'stopped', exit 76)."""
    # header: launch id; allocator cap; VRAM probe; config echo; resume line (in this order)
    monitor.phase = "header"
    log(f"launch {launch_id}: rank {world.rank} of {world.size}, host {hostname()}, "
        f"pid {os.getpid()}, torch {torch.__version__}, code {code['revision']} "
        f"(source sha256 {code['source_sha256']}), run directory {run_dir}")
    device = pick_device(cfg.device, "config field 'device'", world.local_rank)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.use_deterministic_algorithms(cfg.deterministic)
    if manifest is not None:
        manifest.record(execution=execution(cfg, world, device))
    log(preflight.apply_allocator_cap(cfg, device))
    tokenizer = inputs.tokenizer
    if tokenizer is None:  # ranks other than 0 load their own
        from aleph.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(inputs.sources.tokenizer)
    log(preflight.vram_probe(cfg, device, _estimate_vram(cfg, world, device, tokenizer)))
    log("config: " + echo(cfg))
    if syncer is not None:
        log(syncer.header_line())
    resume_from = find_resume(cfg, world, run_dir, log)
    for line in manifest.lost if manifest is not None else []:
        log(line)

    tokens, targets = prepare_data(cfg, world, inputs, tokenizer, log, monitor, stop)

    def record_inputs() -> None:
        now = input_record(targets, tokens)
        allowed = check_inputs_unchanged(cfg, manifest, resume_from, now, log, launch_id)
        if inputs.misalignment_allowed:  # written with the inputs record below
            manifest.launch["misalignment_allowed"] = inputs.misalignment_allowed
        manifest.record_inputs(now, allowed)
        manifest.set_store({**now["target_store"], "byte_length": targets.byte_length,
                            "dim": targets.dim, "dtype": targets.manifest["dtype"],
                            "token_store": str(tokens.path), "captions": inputs.sources.captions})
        save_tokenizer(tokenizer, RunLayout(run_dir).tokenizer)

    # rank 0 records (and may refuse changed inputs); the others poll, then stop alike
    world.on_main("recording the inputs", record_inputs, log)

    monitor.phase = "model"
    preflight_pause("model", log, stop)
    torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's)
    model = build_model(_model_config(cfg, tokenizer, targets.dim)).to(device)
    order = DataOrder(cfg.seed, tokens.rows, cfg.batch_size)
    total = cfg.epochs * order.steps_per_epoch
    total_steps = min(total, cfg.max_steps) if cfg.max_steps else total
    if cfg.warmup_steps > total_steps:  # make_scheduler cuts it: say so
        log(f"warmup_steps {cfg.warmup_steps} > total steps {total_steps}: warmup "
            f"cut to {total_steps} (the whole run is linear warmup, no cosine decay)")
    opt = make_optimizer(model, cfg)
    sched = make_scheduler(opt, cfg, total_steps)
    pos = ckpt.Position(0, 0, 0, 0, 0.0)
    if resume_from:
        pos = resume(Path(resume_from), cfg, world, device, model, opt, sched, log)
    else:
        seed_streams(cfg.seed, world.rank, 0)
    return Trainer(cfg=cfg, world=world, device=device, model=model,
                   net=wrap(model, cfg, world, device), opt=opt, sched=sched, order=order,
                   total_steps=total_steps, pos=pos, run_dir=run_dir, launch_id=launch_id,
                   log=log, manifest=manifest, stop=stop, monitor=monitor, tracer=tracer,
                   syncer=syncer, sources=inputs.sources, tokens=tokens, targets=targets)


def step_trainer(cfg: TrainConfig, model: torch.nn.Module, total_steps: int,
                 world: World | None = None, device: torch.device | None = None,
                 rows: int | None = None) -> Trainer:
    """A Trainer around `model` with no launch (no run directory, stores or log): what the
    benches and the step tests drive `train_step` with."""
    opt = make_optimizer(model, cfg)
    return Trainer(cfg=cfg, world=world or World(), device=device or torch.device("cpu"),
                   model=model, net=model, opt=opt, sched=make_scheduler(opt, cfg, total_steps),
                   order=DataOrder(cfg.seed, rows or cfg.batch_size, cfg.batch_size),
                   total_steps=total_steps, pos=ckpt.Position(0, 0, 0, 0, 0.0))


def execution(cfg: TrainConfig, world: World, device: torch.device) -> dict:
    """The facts of this launch that change the floating-point result (recorded per
    launch; aleph.record.launch.NUMERIC_FACTS says why each one matters)."""
    cuda = device.type == "cuda"
    return {"device": str(device),
            "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "autocast": "bf16" if cuda and cfg.bf16 else "off",
            "num_threads": torch.get_num_threads(),
            "deterministic": bool(cfg.deterministic), "compile": bool(cfg.compile),
            "checkpointing": bool(cfg.checkpointing), "world_size": world.size}


def _model_config(cfg: TrainConfig, tokenizer, out_dim: int = 768) -> ModelConfig:
    return model_config(cfg, len(tokenizer), tokenizer.pad_token_id, out_dim)


def _estimate_vram(cfg: TrainConfig, world: World, device: torch.device, tokenizer) -> int:
    if device.type != "cuda":
        return 0
    if cfg.vram_required_gib:
        return int(cfg.vram_required_gib * preflight.GIB)
    with torch.device("meta"):  # count parameters without allocating them
        n = sum(p.numel() for p in build_model(_model_config(cfg, tokenizer)).parameters())
    return preflight.estimate_vram_bytes(cfg, n, world.size)


def find_resume(cfg: TrainConfig, world: World, run_dir: Path, log) -> str | None:
    """The newest intact complete state, verified by rank 0 (older ones on failure), after
    removing the trainer's own leftovers of killed saves and pruning beyond keep_checkpoints."""
    def verify() -> tuple[str, dict] | None:
        removed = ckpt.remove_incomplete(run_dir, log)
        if removed:
            log(f"removed incomplete resume state(s) of a killed save: {', '.join(removed)}")
        latest = ckpt.find_resume(run_dir, log)
        pruned = ckpt.prune(run_dir, cfg.keep_checkpoints)
        if pruned:
            log(f"pruned resume state(s) beyond keep_checkpoints={cfg.keep_checkpoints}"
                f" (left by an earlier launch): {', '.join(pruned)}")
        return (str(latest[0]), latest[1]) if latest else None

    found = world.on_main("verifying the resume states", verify, log)  # one step for all
    if found is None:
        log("resume: fresh start")
        return None
    path, meta = found
    log(f"resume: step {meta['step']}, samples seen {meta['samples_seen']}, from "
        f"{Path(path).relative_to(run_dir)}")
    return path


def prepare_data(cfg: TrainConfig, world: World, inputs: preflight.Inputs, tokenizer, log,
                 monitor: LaunchMonitor, stop: StopFlag):
    """(token store, target store): rank 0 builds or opens them, the others open what rank 0
    names; their row counts must agree."""
    from aleph.data.captions import check_row_counts
    from aleph.data.tokens import open_token_store
    from aleph.targets import open_store

    def build() -> tuple:
        monitor.phase = "targets"
        preflight_pause("targets", log, stop)
        targets = preflight.prepare_targets(cfg, inputs.sources.targets, world, log)
        monitor.phase = "tokens"
        preflight_pause("tokens", log, stop)
        known = None if inputs.captions_sha256 is None else (inputs.captions_sha256,
                                                              inputs.captions)
        tokens = preflight.prepare_tokens(cfg, inputs.sources, tokenizer, log, known)
        inputs.captions = None  # the token store holds them now
        return tokens, targets

    # Others poll while rank 0 builds (hours at E1's size): never a collective's timeout.
    got = world.on_main("building the target and token stores", build, log,
                        share=lambda b: (str(b[0].path), str(b[1].store_dir), b[1].implementation))
    tokens, targets = got if world.is_main else (open_token_store(got[0]),
                                                 open_store(got[1], got[2]))
    check_row_counts(tokens.rows, targets.rows, f"token store {tokens.path}",
                     f"target store {targets.store_dir}")
    return tokens, targets


def input_record(targets, tokens) -> dict:
    """This launch's stores, as recorded per launch in manifest.json (`inputs`)."""
    t, k = targets, tokens
    return {
        "target_store": {"content_sha256": t.content_sha256,
                         "manifest_sha256": t.manifest_sha256, "rows": t.rows,
                         "implementation": t.implementation, "dir": str(t.store_dir)},
        "token_store": {"content_sha256": k.content_sha256, "key": k.path.name,
                        "captions_sha256": k.manifest["captions_sha256"],
                        "tokenizer_fingerprint": k.manifest["tokenizer_fingerprint"],
                        "max_len": k.max_len, "rows": k.rows, "dir": str(k.path)}}


def check_inputs_unchanged(cfg: TrainConfig, manifest: outputs.Manifest, resume_from: str | None,
                           now: dict, log, launch_id: str) -> dict | None:
    """A resumed launch must train on the stores the run trained on so far
    (`Manifest.trained_inputs`): a changed content hash is a DataError naming both, unless
    allow_input_change=true, then logged and returned for this launch's manifest entry."""
    before = manifest.trained_inputs() if resume_from else None
    if before is None:
        return None
    changes = []
    for name in ("target_store", "token_store"):
        old = before.get(name) or {}
        key = "content_sha256" if "content_sha256" in old else "key"
        if key in old and old[key] != now[name][key]:
            changes.append({"store": name, "compared": key, "trained_on": old[key],
                            "now": now[name][key], "dir": now[name]["dir"]})
    if not changes:
        return None
    what = "; ".join(f"{c['store'].replace('_', ' ')} {c['compared'].replace('_', ' ')} "
                     f"{c['trained_on']} (trained on) -> {c['now']} (this launch, {c['dir']})"
                     for c in changes)
    head = f"inputs changed since this run last trained ({before['from']}): {what}"
    if not cfg.allow_input_change:
        raise DataError(f"{head}; refused: resuming would continue the run on other data. "
                        "Restore the original captions/targets, or relaunch with --set "
                        "allow_input_change=true to continue on the new ones (recorded in "
                        "manifest.json and the launch log)")
    log(f"{head}; ALLOWED by allow_input_change=true: recorded in manifest.json "
        f"(launch {launch_id}, input_change_allowed)")
    return {"by": "allow_input_change=true", "previous": before["from"], "changes": changes}


def save_tokenizer(tokenizer, out: Path) -> None:
    """The run's own copy of its tokenizer, once."""
    if not out.is_dir():  # save into a temporary sibling, then rename: complete or absent
        tmp = out.with_name(f".tokenizer.tmp-{os.getpid()}")
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, out)


def resume(path: Path, cfg: TrainConfig, world: World, device: torch.device,
           model: torch.nn.Module, opt, sched, log) -> ckpt.Position:
    """Load a complete state into model/opt/sched and restore this rank's RNG streams."""
    pos, rngs, _ = ckpt.load(path, model, opt, sched)
    if len(rngs) == world.size:
        ckpt.set_rng_state(rngs[world.rank], device, ckpt.stream_seed(cfg.seed, world.rank, pos.step))
    else:
        # Data order and optimiser state carry over exactly (the global batch is fixed);
        # only the per-rank dropout streams cannot, so they are reseeded from the step.
        log(f"resume across a world size change {len(rngs)} -> {world.size}: data "
            "order, optimiser and schedule carry over; per-rank RNG streams reseeded")
        seed_streams(cfg.seed, world.rank, pos.step)
    return pos


def wrap(model: torch.nn.Module, cfg: TrainConfig, world: World,
         device: torch.device) -> torch.nn.Module:
    """What a step calls. Fixed order (torchtitan): checkpointing is built into the blocks
    by ModelConfig; compile in place next (state-dict keys unchanged); DDP last."""
    if cfg.compile:
        model.compile()
    if world.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        # broadcast_buffers=False: the only buffers are the banks' per-rank usage
        # statistics (and fixed ones), which rank 0 must not overwrite each step; the
        # gradients become views into DDP's buckets, saving a copy and its memory.
        return DDP(model, device_ids=ids, broadcast_buffers=False, gradient_as_bucket_view=True)
    return model


def seed_streams(seed: int, rank: int, step: int) -> None:
    """Seed python/numpy/torch RNGs (dropout, anything random) per rank and step."""
    s = ckpt.stream_seed(seed, rank, step)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
