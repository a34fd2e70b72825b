"""The body of one launch, after the lock: header, stores, model, resume, loop, outputs."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from aleph.errors import DataError
from aleph.model import ModelConfig, build_model
from aleph.record.fingerprint import Tracer
from aleph.record.heartbeat import LaunchMonitor
from aleph.train import checkpoint as ckpt
from aleph.train import loop, outputs, preflight
from aleph.train.config import TrainConfig, echo, model_config
from aleph.train.distributed import World
from aleph.train.identity import hostname


class Session:
    """State of one launch on one rank; `run()` goes header -> data -> model -> loop."""

    def __init__(self, cfg: TrainConfig, world: World, run_dir: Path, launch_id: str, log,
                 manifest: outputs.Manifest | None, stop: loop.StopFlag,
                 inputs: preflight.Inputs, code: dict | None = None,
                 monitor: LaunchMonitor | None = None, tracer: Tracer | None = None,
                 syncer=None) -> None:
        self.cfg, self.world, self.run_dir, self.log = cfg, world, run_dir, log
        self.launch_id, self.manifest, self.stop = launch_id, manifest, stop
        self.inputs = inputs  # checked by run.train before the run directory was created
        self.code = code or {"revision": "unknown", "source_sha256": "unknown"}
        # the launch's live state (phase, steps) and heartbeat; the executed-code tracer
        self.monitor = monitor or LaunchMonitor(None, launch_id)
        self.tracer = tracer or Tracer()
        self.syncer = syncer  # rank 0's aleph.sync.Syncer, None when sync_to is off

    def run(self) -> tuple[str, str]:
        """(status, note) of the launch: 'complete' or 'stopped'.

        Until fit() starts the step loop the stop handlers are in 'interrupt' mode: a signal
        raises loop.StopRequested wherever preflight is (run.py records 'stopped', exit 0).
        """
        from aleph.train.fit import fit

        self.monitor.phase = "header"
        self.header()
        self.prepare_data()
        self.monitor.phase = "model"
        loop.preflight_pause("model", self.log, self.stop)
        self.build()
        return fit(self)

    # --- header ------------------------------------------------------------------------
    def header(self) -> None:
        """launch id; allocator cap; VRAM probe; config echo; resume line (in this order)."""
        cfg, w = self.cfg, self.world
        self.log(f"launch {self.launch_id}: rank {w.rank} of {w.size}, host {hostname()}, "
                 f"pid {os.getpid()}, torch {torch.__version__}, code {self.code['revision']} "
                 f"(source sha256 {self.code['source_sha256']}), run directory {self.run_dir}")
        self.device = preflight.pick_device(cfg, w)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        torch.use_deterministic_algorithms(cfg.deterministic)
        if self.manifest is not None:
            self.manifest.record(execution=self._execution())
        self.log(preflight.apply_allocator_cap(cfg, self.device))
        self.sources = self.inputs.sources
        if self.inputs.tokenizer is not None:
            self.tokenizer = self.inputs.tokenizer
        else:
            from aleph.data.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(self.sources.tokenizer)
        self.log(preflight.vram_probe(cfg, self.device, self._estimate_vram()))
        self.log("config: " + echo(cfg))
        if self.syncer is not None:
            self.log(self.syncer.header_line())
        self.resume_from = self._find_resume()
        for line in self.manifest.lost if self.manifest is not None else []:
            self.log(line)

    def _execution(self) -> dict:
        """The facts of this launch that change the floating-point result (recorded per
        launch; aleph.record.launch.NUMERIC_FACTS says why each one matters)."""
        cuda = self.device.type == "cuda"
        return {"device": str(self.device),
                "gpu": torch.cuda.get_device_name(self.device) if cuda else None,
                "autocast": "bf16" if cuda and self.cfg.bf16 else "off",
                "num_threads": torch.get_num_threads(),
                "deterministic": bool(self.cfg.deterministic), "compile": bool(self.cfg.compile),
                "checkpointing": bool(self.cfg.checkpointing), "world_size": self.world.size}

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
        """Rank 0 verifies the newest complete state (older ones on failure; checkpoint.py)."""
        found = None
        if self.world.is_main:
            removed = ckpt.remove_incomplete(self.run_dir)
            if removed:
                self.log(f"removed incomplete resume state(s) of a killed save: {', '.join(removed)}")
            latest = ckpt.find_resume(self.run_dir, self.log)
            found = (str(latest[0]), latest[1]) if latest else None
            pruned = ckpt.prune(self.run_dir, self.cfg.keep_checkpoints)
            if pruned:
                self.log(f"pruned resume state(s) beyond keep_checkpoints={self.cfg.keep_checkpoints}"
                         f" (left by an earlier launch): {', '.join(pruned)}")
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
            self.monitor.phase = "targets"
            loop.preflight_pause("targets", self.log, self.stop)
            targets = preflight.prepare_targets(self.cfg, self.sources.targets, self.world, self.log)
            self.monitor.phase = "tokens"
            loop.preflight_pause("tokens", self.log, self.stop)
            known = None
            if self.inputs.captions_sha256 is not None:
                known = (self.inputs.captions_sha256, self.inputs.captions)
            tokens = preflight.prepare_tokens(self.cfg, self.sources, self.tokenizer, self.log, known)
            self.inputs.captions = None  # the token store holds them now
            info = (str(tokens.path), str(targets.store_dir), targets.implementation)
            self.targets, self.tokens = targets, tokens
        info = self.world.broadcast_object(info)
        if not self.world.is_main:
            self.tokens, self.targets = open_token_store(info[0]), open_store(info[1], info[2])
        check_aligned(self.tokens.rows, self.targets.rows, f"token store {info[0]}",
                      f"target store {info[1]}")
        if self.world.is_main:
            now = self._input_record()
            allowed = self._check_inputs_unchanged(now)
            if self.inputs.misalignment_allowed:  # written with the inputs record below
                self.manifest.launch["misalignment_allowed"] = self.inputs.misalignment_allowed
            self.manifest.record_inputs(now, allowed)
            self._record_data()

    def _input_record(self) -> dict:
        """This launch's stores, as recorded per launch in manifest.json (`inputs`)."""
        t, k = self.targets, self.tokens
        return {
            "target_store": {"content_sha256": t.content_sha256,
                             "manifest_sha256": t.manifest_sha256, "rows": t.rows,
                             "implementation": t.implementation, "dir": str(t.store_dir)},
            "token_store": {"content_sha256": k.content_sha256, "key": k.path.name,
                            "captions_sha256": k.manifest["captions_sha256"],
                            "tokenizer_fingerprint": k.manifest["tokenizer_fingerprint"],
                            "max_len": k.max_len, "rows": k.rows, "dir": str(k.path)}}

    def _check_inputs_unchanged(self, now: dict) -> dict | None:
        """A resumed launch must train on the stores the run trained on so far.

        Compares the content hashes of this launch's target and token stores with the
        newest record (`Manifest.trained_inputs`). A difference is a DataError naming both
        hashes, unless allow_input_change=true: then it is logged and returned, to be
        recorded in this launch's manifest entry. Nothing to compare on a fresh start.
        """
        before = self.manifest.trained_inputs() if self.resume_from else None
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
        if not self.cfg.allow_input_change:
            raise DataError(f"{head}; refused: resuming would continue the run on other data. "
                            "Restore the original captions/targets, or relaunch with --set "
                            "allow_input_change=true to continue on the new ones (recorded in "
                            "manifest.json and the launch log)")
        self.log(f"{head}; ALLOWED by allow_input_change=true: recorded in manifest.json "
                 f"(launch {self.launch_id}, input_change_allowed)")
        return {"by": "allow_input_change=true", "previous": before["from"], "changes": changes}

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
        if cfg.warmup_steps > self.total_steps:  # loop.make_scheduler cuts it: say so
            self.log(f"warmup_steps {cfg.warmup_steps} > total steps {self.total_steps}: warmup "
                     f"cut to {self.total_steps} (the whole run is linear warmup, no cosine decay)")
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
            ckpt.set_rng_state(rngs[self.world.rank], self.device,
                               ckpt.stream_seed(self.cfg.seed, self.world.rank, self.pos.step))
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
            # broadcast_buffers=False: the only buffers are the banks' per-rank usage
            # statistics (and fixed ones), which rank 0 must not overwrite each step; the
            # gradients become views into DDP's buckets, saving a copy and its memory.
            return DDP(model, device_ids=ids, broadcast_buffers=False,
                       gradient_as_bucket_view=True)
        return model


def seed_streams(seed: int, rank: int, step: int) -> None:
    """Seed python/numpy/torch RNGs (dropout, anything random) per rank and step."""
    s = ckpt.stream_seed(seed, rank, step)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)

