"""The body of one launch, after the lock: header, stores, model, resume, loop, outputs."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from aleph.model import ModelConfig, build_model
from aleph.train import checkpoint as ckpt
from aleph.train import loop, outputs, preflight
from aleph.train.config import TrainConfig, echo, model_config
from aleph.train.distributed import World
from aleph.train.identity import hostname


class Session:
    """State of one launch on one rank; `run()` goes header -> data -> model -> loop."""

    def __init__(self, cfg: TrainConfig, world: World, run_dir: Path, launch_id: str, log,
                 manifest: outputs.Manifest | None, stop: loop.StopFlag) -> None:
        self.cfg, self.world, self.run_dir, self.log = cfg, world, run_dir, log
        self.launch_id, self.manifest, self.stop = launch_id, manifest, stop

    def run(self) -> tuple[str, str]:
        """(status, note) of the launch: 'complete' or 'stopped'.

        Until fit() starts the step loop the stop handlers are in 'interrupt' mode: a signal
        raises loop.StopRequested wherever preflight is (run.py records 'stopped', exit 0).
        """
        from aleph.train.fit import fit

        self.header()
        self.prepare_data()
        loop.preflight_pause("model", self.log, self.stop)
        self.build()
        return fit(self)

    # --- header ------------------------------------------------------------------------
    def header(self) -> None:
        """launch id; allocator cap; VRAM probe; config echo; resume line (in this order)."""
        cfg, w = self.cfg, self.world
        self.log(f"launch {self.launch_id}: rank {w.rank} of {w.size}, host {hostname()}, "
                 f"pid {os.getpid()}, torch {torch.__version__}")
        self.device = preflight.pick_device(cfg, w)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        torch.use_deterministic_algorithms(cfg.deterministic)
        self.log(preflight.apply_allocator_cap(cfg, self.device))
        self.sources = w.broadcast_object(preflight.resolve_sources(cfg) if w.is_main else None)
        from aleph.data.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(self.sources.tokenizer)
        self.log(preflight.vram_probe(cfg, self.device, self._estimate_vram()))
        self.log("config: " + echo(cfg))
        self.resume_from = self._find_resume()

    def _model_config(self, out_dim: int = 768) -> ModelConfig:
        return model_config(self.cfg, len(self.tokenizer), self.tokenizer.pad_token_id, out_dim)

    def _estimate_vram(self) -> int:
        if self.device.type != "cuda":
            return 0
        if self.cfg.vram_required_gib:
            return int(self.cfg.vram_required_gib * preflight.GIB)
        with torch.device("meta"):  # count parameters without allocating them
            n = sum(p.numel() for p in build_model(self._model_config()).parameters())
        return preflight.estimate_vram_bytes(self.cfg, n, self.world.size)

    def _find_resume(self) -> str | None:
        found = None
        if self.world.is_main:
            removed = ckpt.remove_incomplete(self.run_dir)
            if removed:
                self.log(f"removed incomplete resume state(s) of a killed save: {', '.join(removed)}")
            latest = ckpt.latest(self.run_dir)
            found = (str(latest[0]), latest[1]) if latest else None
        found = self.world.broadcast_object(found)  # every rank resumes from the same step
        if found is None:
            self.log("resume: fresh start")
            return None
        path, meta = found
        self.log(f"resume: step {meta['step']}, samples seen {meta['samples_seen']}, from "
                 f"{Path(path).relative_to(self.run_dir)}")
        return path

    # --- data ----------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Rank 0 builds or opens the stores; the others open what rank 0 names."""
        from aleph.data.captions import check_aligned
        from aleph.data.tokens import open_token_store
        from aleph.targets import open_store

        info = None
        if self.world.is_main:
            loop.preflight_pause("targets", self.log, self.stop)
            targets = preflight.prepare_targets(self.cfg, self.sources.targets, self.world, self.log)
            loop.preflight_pause("tokens", self.log, self.stop)
            tokens = preflight.prepare_tokens(self.cfg, self.sources, self.tokenizer, self.log)
            info = (str(tokens.path), str(targets.store_dir), targets.implementation)
            self.targets, self.tokens = targets, tokens
        info = self.world.broadcast_object(info)
        if not self.world.is_main:
            self.tokens, self.targets = open_token_store(info[0]), open_store(info[1], info[2])
        check_aligned(self.tokens.rows, self.targets.rows, f"token store {info[0]}",
                      f"target store {info[1]}")
        if self.world.is_main:
            self._record_data()

    def _record_data(self) -> None:
        t = self.targets
        self.manifest.set_store({
            "manifest_sha256": t.manifest_sha256, "content_sha256": t.content_sha256,
            "implementation": t.implementation,
            "byte_length": t.byte_length, "rows": t.rows, "dim": t.dim,
            "dtype": t.manifest["dtype"], "dir": str(t.store_dir),
            "token_store": str(self.tokens.path), "captions": self.sources.captions})
        out = self.run_dir / "tokenizer"
        if not out.is_dir():  # save into a temporary sibling, then rename: complete or absent
            tmp = out.with_name(f".tokenizer.tmp-{os.getpid()}")
            self.tokenizer.save_pretrained(str(tmp))
            os.replace(tmp, out)

    # --- model ----------------------------------------------------------------------------
    def build(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's)
        self.model = build_model(self._model_config(self.targets.dim)).to(self.device)
        self.order = loop.DataOrder(cfg.seed, self.tokens.rows, cfg.batch_size)
        total = cfg.epochs * self.order.steps_per_epoch
        self.total_steps = min(total, cfg.max_steps) if cfg.max_steps else total
        self.opt = loop.make_optimizer(self.model, cfg)
        self.sched = loop.make_scheduler(self.opt, cfg, self.total_steps)
        self.pos = ckpt.Position(0, 0, 0, 0, 0.0)
        if self.resume_from:
            self._load(Path(self.resume_from))
        else:
            seed_streams(cfg.seed, self.world.rank, 0)
        self.net = self._wrap(self.model)

    def _load(self, path: Path) -> None:
        self.pos, rngs, meta = ckpt.load(path, self.model, self.opt, self.sched)
        if len(rngs) == self.world.size:
            ckpt.set_rng_state(rngs[self.world.rank])
        else:
            # Data order and optimiser state carry over exactly (the global batch is fixed);
            # only the per-rank dropout streams cannot, so they are reseeded from the step.
            self.log(f"resume across a world size change {len(rngs)} -> {self.world.size}: data "
                     "order, optimiser and schedule carry over; per-rank RNG streams reseeded")
            seed_streams(self.cfg.seed, self.world.rank, self.pos.step)

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        # Fixed order (torchtitan): checkpointing is built into the blocks by ModelConfig;
        # compile in place next (state-dict keys unchanged); DDP last.
        if self.cfg.compile:
            model.compile()
        if self.world.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DDP(model, device_ids=ids)
        return model


def seed_streams(seed: int, rank: int, step: int) -> None:
    """Seed python/numpy/torch RNGs (dropout, anything random) per rank and step."""
    s = (seed * 1_000_003 + rank * 7919 + step) % (2**32)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)

