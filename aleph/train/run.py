"""One launch of one run: input checks, lock, header, stores, model, resume, loop, outputs.

Order is the contract: the inputs are checked before the run directory exists or its config
is compared (a refusal leaves no trace and names the input), the lock is taken before
anything is written there, and rank 0 alone writes it (other ranks: their own launch log).
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback
from pathlib import Path

import torch

from aleph._io import atomic_write_json, read_json
from aleph._signals import console
from aleph.errors import EXIT_STOPPED, AlephError, ConfigError, PeerLost
from aleph.record import heartbeat, provenance
from aleph.record.fingerprint import Tracer
from aleph.record.launch import COMPLETE, FAILED, STOPPED, choose_action
from aleph.record.layout import FORMAT_VERSION, RunLayout, config_fields
from aleph.train import outputs, preflight
from aleph.train.config import TrainConfig, check_same_run, to_dict
from aleph.train.distributed import World, check_divisible, init_world
from aleph.train.identity import (
    LaunchLog,
    RunLock,
    make_launch_id,
    run_dir_for,
    run_ref,
)
from aleph.train.loop import train_loop
from aleph.train.signals import StopFlag, StopRequested, preflight_pause
from aleph.train.trainer import build_trainer


def train(cfg: TrainConfig, tracer: Tracer | None = None, name: str | None = None,
          again: str | None = None) -> int:
    """Run (or resume) `runs/<name>` (default: identity.run_name of the config); returns 0
    when complete, errors.EXIT_STOPPED (76) when stopped by SIGTERM/SIGINT (resumable).
    `tracer`: the executed-code tracer the CLI started (else one starts here); `again`: the
    command line that relaunches this run, for a stopped launch's resume hint."""
    tracer = tracer if tracer is not None else Tracer().start()
    run_dir = run_dir_for(cfg, name)  # a bad --name fails here, before anything else
    # From here on a stop is one stop, whenever it comes: before the lock it ends the launch
    # at once (nothing is written yet), then it is recorded (see _launch).
    stop = StopFlag()
    try:
        stop.set_mode("interrupt")  # a stop held since the imports (hold_early) raises here
        return _locked_launch(cfg, tracer, run_dir, name, again, stop)
    except StopRequested as e:
        console(f"aleph train: stopped by {e.signame} before the launch was recorded (while "
                f"checking the inputs or taking the run lock); nothing was written; run the "
                f"same command again to start it")
        return EXIT_STOPPED
    finally:
        stop.restore()  # last: a signal during the shutdown above is still one stop


def _locked_launch(cfg: TrainConfig, tracer: Tracer, run_dir: Path, name: str | None,
                   again: str | None, stop: StopFlag) -> int:
    """The world, the input checks, the run lock, then the launch; releases all three."""
    wants_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.hf_token:  # huggingface_hub reads it for gated captions/tokenizer downloads
        os.environ["HF_TOKEN"] = cfg.hf_token
    if cfg.deterministic and wants_cuda:  # must precede the first cuBLAS handle
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    world = init_world("cuda" if wants_cuda else "cpu", cfg.collective_timeout_s,
                       tracer.in_this_thread)
    lock = None
    try:
        check_divisible(cfg.batch_size, world)  # before the lock: a refusal writes nothing
        if world.is_main:
            console(f"aleph train: run {run_ref(run_dir)} in {run_dir}; checking the inputs "
                    "first (nothing is written until they pass)")
        inputs = _checked_inputs(cfg, world, stop)  # before the run directory exists
        preflight.check_e1_device(cfg, wants_cuda)  # so is this refusal: no trace
        lock = RunLock(run_dir)
        # Flag mode while the lock is taken and the launch recorded: a stop meanwhile is
        # raised by _launch once the launch is on record, so it ends recorded as 'stopped'.
        stop.set_mode("flag")
        launch_id = _lock_and_name(lock, world)
        return _launch(cfg, world, run_dir, launch_id, stop, inputs, tracer, again)
    finally:
        tracer.close_window()
        if lock is not None:
            lock.release()
        world.shutdown()


def _checked_inputs(cfg: TrainConfig, world: World, stop: StopFlag) -> preflight.Inputs:
    """Rank 0 checks the inputs (preflight.check_inputs); every rank gets its sources or
    raises rank 0's refusal, so all ranks stop alike and nothing has been written."""
    def waiting(line: str) -> None:
        console(f"aleph train: rank {world.rank}: {line}")

    def check() -> preflight.Inputs:
        preflight_pause("inputs", _console, stop)
        return preflight.check_inputs(cfg, say=_console)

    got = world.on_main("checking the inputs", check, waiting, share=lambda inputs: inputs.sources)
    return got if world.is_main else preflight.Inputs(got)


def _console(line: str) -> None:
    """A preflight line before the launch log exists (rank 0's console only)."""
    console(f"aleph train: {line}")


def _lock_and_name(lock: RunLock, world: World) -> str:
    """Rank 0 takes the lock; every rank learns the launch id or the refusal (RunLocked)."""
    def take() -> str:
        lock.acquire()
        return make_launch_id()

    return world.on_main("taking the run lock", take, _console)


def _launch(cfg: TrainConfig, world: World, run_dir: Path, launch_id: str, stop: StopFlag,
            inputs: preflight.Inputs, tracer: Tracer, again: str | None = None) -> int:
    """Record the launch, build the trainer, train; one ending records, syncs and closes."""
    layout = RunLayout(run_dir)
    tag = launch_id if world.is_main else f"{launch_id}/rank{world.rank}"
    # Only rank 0 echoes to the console: torchrun interleaves every rank's stdout.
    log = LaunchLog(layout.launch_log(launch_id, world.rank), tag,
                    echo=sys.stdout if world.is_main else None)
    manifest = syncer = None
    code = provenance.code_record(tracer.files)  # the snapshot the tracer hashes
    # Rank 0's heartbeat (launches/<launch id>.heartbeat.json); other ranks only keep state.
    beat = layout.heartbeat(launch_id) if world.is_main else None
    monitor = heartbeat.LaunchMonitor(beat, launch_id, cfg.heartbeat_seconds, tracer.in_this_thread)
    exit_status, status, note, refused, error = 0, FAILED, "", False, None
    where = "before the first step"
    try:
        if world.is_main:
            _check_config(run_dir, cfg, log)
            manifest = outputs.Manifest(run_dir, run_dir.name, cfg.arm, cfg.seed)
            manifest.start_launch(launch_id, str(layout.launch_log(launch_id).relative_to(run_dir)),
                                  world.size, code)
            monitor.start()
            syncer = _start_sync(cfg, run_dir, log, manifest)
        # The launch is on record: from here until the first step a signal interrupts at
        # once (raises StopRequested, also for a signal that came in meanwhile).
        stop.set_mode("interrupt")
        trainer = build_trainer(cfg, world, run_dir, launch_id, log, manifest, stop, inputs,
                                code, monitor, tracer, syncer)
        status, note = train_loop(trainer)
        where = f"step {trainer.pos.step} of {trainer.total_steps}"
    except StopRequested as e:
        stop.set_mode("flag")  # a signal during the bookkeeping below must not interrupt it
        status, note = STOPPED, f"{e.signame} before the first step"
        log(f"stopped by {e.signame} in preflight (before the first step); nothing was trained "
            "in this launch; a build it interrupted is left unmarked as complete and a restart "
            "redoes it")
    except BaseException as e:
        stop.set_mode("flag")
        error, refused = e, isinstance(e, AlephError)
        exit_status = e.exit_code if refused else (130 if isinstance(e, KeyboardInterrupt) else 1)
        lost = world.failure_note(e)  # a collective timed out: name the silent rank
        note = lost or f"{type(e).__name__}: {e}"
        if lost:  # the original error stays in the log, the line goes to the console
            log("the failed collective:\n" + "".join(traceback.format_exception(e)).rstrip())
        log(f"launch failed: {note}")
        if lost:
            raise PeerLost(lost) from e
        raise
    finally:
        exit_status = EXIT_STOPPED if status == STOPPED else exit_status
        if status == COMPLETE and stop.is_set():  # it came after the loop's last check
            note = f"{note}; {stop.signame} after the last step"
        _end(manifest, monitor, tracer, launch_id, exit_status, status, note, refused)
        if error is None:
            log(f"launch ended: {status}{': ' + note if note else ''}")
            if world.is_main:
                log(summary(run_dir, status, log.path, again, where))
        if syncer is not None:  # the final sync, after the end is recorded (so the copy says how it ended)
            # a stop (whenever it came) bounds the wait well inside a Slurm lead
            syncer.finish(cut=stop.bound(cfg.sync_stop_wait_seconds))
        log.close()
    return EXIT_STOPPED if status == STOPPED else 0


def summary(run_dir: Path, status: str, log_path: Path, again: str | None,
            where: str = "before the first step") -> str:
    """The end-of-launch lines: where the outputs are and the next command; for a stopped
    launch, how to resume it."""
    ref, run = run_ref(run_dir), RunLayout(run_dir)
    lines = [f"summary: run {ref} {status} ({where}); run directory {run_dir}",
             f"  log of this launch: {log_path}",
             f"  metrics: {run.metrics}; TensorBoard events: {run.tb} (`aleph tensorboard`)"]
    if status == COMPLETE:
        lines += [f"  weights: {run.final_weights}",
                  f"  next: `aleph eval {shlex.quote(ref)}`, then `aleph report "
                  f"{shlex.quote(ref)}` (and other runs)"]  # quoted: a pulled run's name
    else:
        lines.append(f"  resume: run the same command again (`{again or 'aleph train ...'}`); "
                     f"it continues from the last resume state in {run.checkpoints}/")
        saved = sorted(run.weights.glob("step-*"))
        if saved:
            lines.append(f"  or evaluate the newest saved weights now: `aleph eval "
                         f"{shlex.quote(ref)} --weights {shlex.quote(str(saved[-1]))}`")
    return "\n".join(lines)


def _start_sync(cfg: TrainConfig, run_dir: Path, log, manifest: outputs.Manifest):
    """Rank 0's background sync to cfg.sync_to (None when off); each success is recorded
    in this launch's manifest entry (`sync`: destination, time, step, revision)."""
    if not cfg.sync_to:
        return None
    from aleph.sync import Syncer, parse_destination

    return Syncer(run_dir, parse_destination(cfg.sync_to), cfg.sync_every_minutes, log,
                  on_synced=lambda result: manifest.record(sync=result.record()))


def _end(manifest: outputs.Manifest | None, monitor: heartbeat.LaunchMonitor, tracer: Tracer,
         launch_id: str, exit_status: int, status: str, note: str, refused: bool) -> None:
    """Record how the launch ended: status, what it did (action) and the steps it reached;
    the last heartbeat; the executed-code record."""
    with tracer.during():
        monitor.stop()
    if manifest is None:
        return
    with tracer.during():
        action = choose_action(monitor.step_from, monitor.step, status, note, refused)
        manifest.end_launch(exit_status, status, note, action, monitor.step)
    tracer.close_window()
    outputs.write_executed(manifest, tracer, launch_id)


def _check_config(run_dir: Path, cfg: TrainConfig, log) -> None:
    """Refuse a config that computes something else than the run's trained state; until a
    resume state exists nothing was trained, so a new config replaces the old one."""
    run = RunLayout(run_dir)
    if run.config.is_file():
        try:
            saved = read_json(run.config)
        except ValueError as e:
            raise ConfigError(f"{run.config}: unreadable ({e}); it was written atomically, so it "
                              "was edited by hand: restore it or remove the run directory") from e
        saved = config_fields(run.config, saved)
        try:
            check_same_run(saved, cfg)
            return
        except ConfigError as e:
            if run.complete_states():
                raise
            log(f"config replaced (no resume state yet, nothing trained): {e}")
    atomic_write_json(run.config, {"format_version": FORMAT_VERSION, **to_dict(cfg)})
