"""GPU check: what the CPU suite cannot check, run once on a machine with an NVIDIA GPU.

One PASS / FAIL / SKIP line per item, then a summary naming what was skipped; exit 0 when
nothing failed, 1 when an item failed, 2 when it cannot run (no CUDA device: one line).
Under 8 minutes on one GPU (most of it torch.compile). Items, in order:

  cuda-tests       the suite's CUDA tests (pytest -m gpu): none may skip
  bench-eager      bench/bench_model.py, E1 shape, bf16, eager: samples/s and MFU, every arm
  bench-compiled   the same compiled (torch.compile), --compile-arms (default a1, a2)
  train-header     a short E1-shaped launch (e1 preset on the smoke data, alloc_cap_fraction
                   0.9): its header has the allocator cap line, then the VRAM probe line
                   with 'pass', and it completes
  compile-ckpt-refused  compile=true + checkpointing=true is refused (exit 2, the torch-2.4
                   law's message), before anything is written
  compile-alone    compile=true alone trains (E1 width, heads, FFN, L and batch, 2 blocks
                   to bound the compile time; the E1 depth is compiled by bench-compiled)
  ckpt-alone       checkpointing=true alone trains at the full E1 shape
  nccl-2proc       torchrun, 2 NCCL ranks, follows the 1-process loss trajectory (fp32,
                   dropout 0); needs 2 GPUs (NCCL refuses two ranks on one GPU): else SKIP
  gather-pin       the target store's gather(pin=True), streaming and in-RAM: page-locked,
                   equal to the plain gather; pinned vs plain host-to-device rows/s
  step-path        the trainer's CUDA step path in-process: fused AdamW; this device's RNG
                   state saved and restored, a per-rank stream derived from a CPU-saved
                   state; pinned prefetched batches; one host sync per train_step (counted
                   with torch.cuda.set_sync_debug_mode)
  campaign         `aleph campaign` of two smoke arms on every visible GPU (device=cuda):
                   complete, each run pinned to one GPU, evaluated, report and diff matrix

Bare machine (the venv of ./aleph-dev):  .venv/bin/python bench/gpu_check.py
In the image (every GPU of the host):    docker compose run --rm campaign python3 /opt/aleph/bench/gpu_check.py
Options: --list, --only/--skip ITEM[,ITEM], --work DIR (kept; default a temporary directory,
removed), --peak-tflops (GPUs missing from bench_model.py's table), --compile-arms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # aleph from this checkout (or /opt/aleph in the image)
ARMS = ("a1_anchored", "a2_dense", "a3_random")
ITEMS = {
    "cuda-tests": "the suite's CUDA tests (pytest -m gpu)",
    "bench-eager": "bench_model.py at the E1 shape, bf16 eager, samples/s and MFU",
    "bench-compiled": "bench_model.py at the E1 shape, bf16 compiled, samples/s and MFU",
    "train-header": "allocator cap and VRAM probe header lines of a short E1-shaped launch",
    "compile-ckpt-refused": "compile + checkpointing refused (torch 2.4 law)",
    "compile-alone": "compile alone trains",
    "ckpt-alone": "checkpointing alone trains (E1 shape)",
    "nccl-2proc": "2 NCCL ranks (torchrun) follow the 1-process trajectory",
    "gather-pin": "target store gather(pin=True)",
    "step-path": "fused AdamW, per-device RNG, pinned prefetch, one sync per step",
    "campaign": "aleph campaign on the visible GPUs",
}
BUDGET_S = 8 * 60
# The E1 preset on the trainer's own smoke data: the E1 shape (12 x 512, 8 heads, FFN 2048
# or 512 + 3 x 512, L 128, batch 256, bf16), the smoke captions and targets. Not
# deterministic: the E1 preset is not, and CUDA determinism is not what is checked here.
E1_ON_SMOKE = ["--preset", "e1", "--set", "smoke_data=true", "--set", "tokenizer=",
               "--set", "ckpt_every_minutes=0", "--set", "log_every_steps=1"]
GPU_SMOKE = ["--preset", "smoke", "--set", "device=cuda", "--set", "deterministic=false"]
# item -> (arm, seed, base arguments, --set values) of its `aleph train` launch; one run
# directory each (distinct seeds), so the items do not resume each other's runs.
LAUNCHES = {
    "train-header": ("a1_anchored", 10, E1_ON_SMOKE, ("max_steps=5", "alloc_cap_fraction=0.9")),
    "compile-ckpt-refused": ("a2_dense", 11, E1_ON_SMOKE,
                             ("compile=true", "checkpointing=true", "max_steps=3")),
    "compile-alone": ("a1_anchored", 12, E1_ON_SMOKE, ("max_steps=3", "compile=true", "n_layers=2")),
    "ckpt-alone": ("a1_anchored", 13, E1_ON_SMOKE, ("max_steps=3", "checkpointing=true")),
    "gather-pin": ("a2_dense", 14, E1_ON_SMOKE, ("max_steps=1",)),
    "nccl-2proc": ("a1_anchored", 20, GPU_SMOKE,
                   ("max_steps=8", "dropout=0.0", "bf16=false", "log_every_steps=1")),
}
CAMPAIGN_ARGV = ["campaign", "--name", "gpu-check", "--arms", "a1_anchored", "a2_dense",
                 "--seeds", "0", "--devices", "all", *GPU_SMOKE, "--set", "max_steps=20",
                 "--probe-rows", "256", "--poll-seconds", "0.5"]


def train_argv(item: str) -> list[str]:
    """`aleph train ...` arguments of an item's launch."""
    arm, seed, base, sets = LAUNCHES[item]
    argv = ["train", "--arm", arm, "--seed", str(seed), *base]
    for value in sets:
        argv += ["--set", value]
    return argv


def run_id(item: str) -> str:
    """The run name of an item's launch under <work>/runs (aleph.train.identity.run_name:
    runs/<arm>-s<seed> for e1, runs/smoke/<arm>-s<seed> for the smoke preset)."""
    from aleph.train.identity import run_name

    arm, seed, base, _ = LAUNCHES[item]
    return run_name(base[base.index("--preset") + 1], arm, seed)


@dataclass
class Result:
    status: str  # PASS | FAIL | SKIP
    detail: str


@dataclass
class Ctx:
    work: Path
    gpus: int
    gpu_name: str
    args: argparse.Namespace


# --- pure checks (tested on CPU) ------------------------------------------------------------

def select(only: str | None, skip: str | None) -> dict[str, str | None]:
    """item -> None (run it) or the reason it is skipped; ValueError names an unknown item."""
    def names(text: str | None, flag: str) -> list[str]:
        got = [x.strip() for x in (text or "").split(",") if x.strip()]
        bad = [x for x in got if x not in ITEMS]
        if bad:
            raise ValueError(f"{flag} {bad[0]!r}: not an item; items: {', '.join(ITEMS)}")
        return got
    keep, drop = names(only, "--only"), names(skip, "--skip")
    out: dict[str, str | None] = {}
    for name in ITEMS:
        if keep and name not in keep:
            out[name] = "not in --only"
        elif name in drop:
            out[name] = "--skip"
        else:
            out[name] = None
    return out


def check_header(log_text: str) -> Result:
    """The allocator cap line, then the VRAM probe line with a pass, in the launch header."""
    lines = log_text.splitlines()
    cap = next((i for i, x in enumerate(lines) if "allocator cap: " in x), None)
    probe = next((i for i, x in enumerate(lines) if "VRAM probe: " in x), None)
    if cap is None or probe is None:
        return Result("FAIL", "header lacks the "
                      + ("allocator cap" if cap is None else "VRAM probe") + " line")
    cap_text = lines[cap].split("allocator cap: ", 1)[1]
    probe_text = lines[probe].split("VRAM probe: ", 1)[1]
    if cap > probe:
        return Result("FAIL", "VRAM probe line before the allocator cap line")
    if not re.fullmatch(r"\S+ of [\d.]+ GiB = [\d.]+ GiB", cap_text):
        return Result("FAIL", f"allocator cap not applied: {cap_text!r}")
    if not probe_text.endswith(": pass"):
        return Result("FAIL", f"VRAM probe: {probe_text!r}")
    return Result("PASS", f"allocator cap: {cap_text} | VRAM probe: {probe_text}")


def judge_bench(rows: list[dict], compiled: bool, arms: list[str]) -> Result:
    """bench_model.py --json rows of one mode: every arm measured with an MFU in (0, 1)."""
    mine = {r["arm"]: r for r in rows if r.get("device") == "cuda" and r.get("compile") is compiled}
    missing = [a for a in arms if a not in mine]
    if missing:
        return Result("FAIL", f"no CUDA result for {', '.join(missing)}")
    parts = []
    for arm in arms:
        r = mine[arm]
        mfu = r.get("mfu")
        if mfu is None:
            return Result("FAIL", f"{arm}: no MFU: GPU {r.get('gpu')!r} is not in bench_model.py's "
                          "peak table; rerun with --peak-tflops <dense bf16 TFLOP/s>")
        if not 0 < mfu < 1:
            return Result("FAIL", f"{arm}: MFU {mfu:.3f} outside (0, 1): wrong --peak-tflops?")
        parts.append(f"{arm} {r['samples_per_s']:,.0f} samples/s MFU {100 * mfu:.1f}%")
    return Result("PASS", "; ".join(parts))


def compare_losses(one: list[tuple[int, float]], two: list[tuple[int, float]],
                   tol: float = 1e-4) -> Result:
    """Two loss trajectories (step, value): same steps, values within `tol`."""
    if not one or [s for s, _ in one] != [s for s, _ in two]:
        return Result("FAIL", f"steps differ: 1 process {[s for s, _ in one]}, "
                      f"2 ranks {[s for s, _ in two]}")
    worst = max(abs(a - b) for (_, a), (_, b) in zip(one, two, strict=True))
    verdict = "PASS" if worst <= tol else "FAIL"
    return Result(verdict, f"{len(one)} steps, max |loss difference| {worst:.2e} (tolerance {tol:g})")


# --- running things -------------------------------------------------------------------------

def run(cmd: list[str], work: Path, timeout: float, **env: str) -> subprocess.CompletedProcess:
    """Run `cmd` from the repository root with ALEPH_WORK=work; past `timeout` it gets
    SIGTERM (a trainer saves, a campaign stops its trainers), then SIGKILL a minute later."""
    full = {**os.environ, "ALEPH_WORK": str(work), "PYTHONPATH": os.pathsep.join(
        [str(REPO), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]),
        **env}
    proc = subprocess.Popen(cmd, cwd=REPO, env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout:.0f} s")


def tail(p: subprocess.CompletedProcess) -> str:
    """The line that says why: the last error line on stderr, else its last line, else
    stdout's last line."""
    err = [x.strip() for x in p.stderr.splitlines() if x.strip()]
    errors = [x for x in err if "error" in x.lower()]
    if errors or err:
        return (errors or err)[-1]
    out = [x.strip() for x in p.stdout.splitlines() if x.strip()]
    return out[-1] if out else "(no output)"


def train(ctx: Ctx, item: str, timeout: float = 300, work: Path | None = None,
          prefix: list[str] | None = None, **env: str) -> subprocess.CompletedProcess:
    cmd = [*(prefix or [sys.executable, "-m", "aleph"]), *train_argv(item)]
    return run(cmd, work or ctx.work, timeout, **env)


def visible_gpus(n: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries of the first `n` GPUs this process sees."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [x.strip() for x in cvd.split(",")] if cvd else [str(i) for i in range(n)]
    return entries[:n]


def launch_log(work: Path, run_id: str) -> str:
    logs = sorted((work / "runs" / run_id / "launches").glob("*.log"))
    logs = [p for p in logs if ".rank" not in p.name]
    return logs[-1].read_text(encoding="utf-8", errors="replace") if logs else ""


def tb_losses(run_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


# --- the items ------------------------------------------------------------------------------

def item_cuda_tests(ctx: Ctx) -> Result:
    p = run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
             "-rs", str(REPO / "tests")], ctx.work / "pytest", 300)
    lines = [x.strip() for x in p.stdout.splitlines() if x.strip()]
    summary = lines[-1] if lines else tail(p)
    if p.returncode != 0:
        return Result("FAIL", f"pytest exit {p.returncode}: {summary}")
    if "skipped" in summary or "passed" not in summary:
        return Result("FAIL", f"GPU tests skipped or none ran: {summary}")
    return Result("PASS", summary)


def _bench(ctx: Ctx, compiled: bool) -> Result:
    arms = list(ctx.args.compile_arms if compiled else ARMS)
    out = ctx.work / f"bench-{'compiled' if compiled else 'eager'}.json"
    cmd = [sys.executable, str(REPO / "bench" / "bench_model.py"), "--steps", "1", "--cpu-batch",
           "8", "--gpu-steps", str(ctx.args.gpu_steps), "--arms", *arms, "--json", str(out)]
    if not compiled:
        cmd.append("--no-compile")
    if ctx.args.peak_tflops:
        cmd += ["--peak-tflops", str(ctx.args.peak_tflops)]
    p = run(cmd, ctx.work, 420 if compiled else 180)
    if p.returncode != 0 or not out.is_file():
        return Result("FAIL", f"bench_model.py exit {p.returncode}: {tail(p)}")
    res = judge_bench(json.loads(out.read_text()), compiled, arms)
    if compiled and res.status == "PASS":
        skipped = [a for a in ARMS if a not in arms]
        if skipped:
            res.detail += f" ({', '.join(skipped)} not compiled: --compile-arms adds it)"
    return res


def item_bench_eager(ctx: Ctx) -> Result:
    return _bench(ctx, False)


def item_bench_compiled(ctx: Ctx) -> Result:
    return _bench(ctx, True)


def item_train_header(ctx: Ctx) -> Result:
    p = train(ctx, "train-header")
    if p.returncode != 0:
        return Result("FAIL", f"launch exit {p.returncode}: {tail(p)}")
    return check_header(launch_log(ctx.work, run_id("train-header")))


def item_compile_ckpt_refused(ctx: Ctx) -> Result:
    p = train(ctx, "compile-ckpt-refused", timeout=120)
    if p.returncode == 2 and "compile and checkpointing are exclusive" in p.stderr:
        rid = run_id("compile-ckpt-refused")
        if (ctx.work / "runs" / rid).exists():
            return Result("FAIL", f"refused, but runs/{rid} was created")
        return Result("PASS", "refused before anything was written: " + tail(p)[:160])
    return Result("FAIL", f"expected exit 2 with the law's message, got exit {p.returncode}: {tail(p)}")


def _alone(ctx: Ctx, item: str) -> Result:
    p = train(ctx, item, timeout=420)
    rid = run_id(item)
    text = launch_log(ctx.work, rid)
    if p.returncode != 0 or "launch ended: complete" not in text:
        return Result("FAIL", f"launch exit {p.returncode}: {tail(p)}")
    m = json.loads((ctx.work / "runs" / rid / "manifest.json").read_text())
    ex = m["launches"][-1].get("execution") or {}
    return Result("PASS", f"3 steps on {ex.get('gpu')} (compile {ex.get('compile')}, "
                  f"checkpointing {ex.get('checkpointing')}, autocast {ex.get('autocast')})")


def item_compile_alone(ctx: Ctx) -> Result:
    return _alone(ctx, "compile-alone")


def item_ckpt_alone(ctx: Ctx) -> Result:
    return _alone(ctx, "ckpt-alone")


def item_nccl(ctx: Ctx) -> Result:
    one_w, two_w, rid = ctx.work / "nccl-1", ctx.work / "nccl-2", run_id("nccl-2proc")
    first_two = visible_gpus(2)
    p1 = train(ctx, "nccl-2proc", work=one_w, CUDA_VISIBLE_DEVICES=first_two[0])
    if p1.returncode != 0:
        return Result("FAIL", f"1-process launch exit {p1.returncode}: {tail(p1)}")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "-m", "aleph"]
    p2 = train(ctx, "nccl-2proc", work=two_w, prefix=torchrun, timeout=420,
               CUDA_VISIBLE_DEVICES=",".join(first_two))
    if p2.returncode != 0:
        return Result("FAIL", f"torchrun exit {p2.returncode}: {tail(p2)}")
    man = json.loads((two_w / "runs" / rid / "manifest.json").read_text())
    if man["launches"][-1].get("world_size") != 2:
        return Result("FAIL", "the torchrun launch did not record world_size 2")
    res = compare_losses(tb_losses(one_w / "runs" / rid), tb_losses(two_w / "runs" / rid))
    res.detail = "NCCL, 2 ranks vs 1 process: " + res.detail
    return res


def item_gather_pin(ctx: Ctx) -> Result:
    import torch

    from aleph.targets import open_store

    stores = sorted((ctx.work / "cache" / "targets").glob("*/manifest.json"))
    if not stores:  # train-header did not run: build one from the smoke data
        p = train(ctx, "gather-pin")
        stores = sorted((ctx.work / "cache" / "targets").glob("*/manifest.json"))
        if not stores:
            return Result("FAIL", f"no target store to gather from (launch exit {p.returncode}: "
                          f"{tail(p)})")
    d, parts = stores[0].parent, []
    for impl in ("streaming", "in_ram"):
        store = open_store(d, impl)
        idx = torch.randperm(store.rows)[:256]
        pinned, plain = store.gather(idx, pin=True), store.gather(idx)
        if not pinned.is_pinned() or plain.is_pinned() or not torch.equal(pinned, plain):
            return Result("FAIL", f"{impl}: gather(pin=True) pinned={pinned.is_pinned()}, "
                          f"equal={torch.equal(pinned, plain)}")
        rates = {}
        for label, pin in (("pinned", True), ("plain", False)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                store.gather(idx, pin=pin).to("cuda", non_blocking=pin)
            torch.cuda.synchronize()
            rates[label] = 50 * len(idx) / (time.perf_counter() - t0)
        parts.append(f"{impl}: pinned {rates['pinned']:,.0f} vs plain {rates['plain']:,.0f} rows/s "
                     "gather + host-to-device")
    return Result("PASS", f"{store.rows:,} x {store.dim} store; " + "; ".join(parts))


def item_step_path(ctx: Ctx) -> Result:
    """The CUDA-only parts of the step path, in this process on GPU 0 (E1 width, 2 blocks)."""
    import torch

    from aleph.model import ModelConfig, build_model
    from aleph.train import checkpoint as ckpt
    from aleph.train.config import resolve
    from aleph.train.distributed import World
    from aleph.train.step import train_step
    from aleph.train.trainer import step_trainer

    dev = torch.device("cuda", 0)
    cfg = resolve("e1", arm="a1_anchored", overrides=["smoke_data=true", "tokenizer="])
    torch.manual_seed(0)
    model = build_model(ModelConfig(arm="a1_anchored", vocab_size=30522, n_layers=2)).to(dev)
    t = step_trainer(cfg, model, 10, World(), dev)
    opt = t.opt
    if not opt.defaults.get("fused"):
        return Result("FAIL", "AdamW is not fused on CUDA")
    state = ckpt.rng_state(dev)
    drawn = torch.rand(4, device=dev)
    restored = ckpt.set_rng_state(state, dev)
    if restored != "restored" or not torch.equal(torch.rand(4, device=dev), drawn):
        return Result("FAIL", f"this device's RNG state did not round-trip ({restored})")
    cpu_saved = ckpt.rng_state(torch.device("cpu"))
    streams = []
    for rank in (0, 1):
        torch.cuda.manual_seed_all(cfg.seed)
        how = ckpt.set_rng_state(cpu_saved, dev, ckpt.stream_seed(cfg.seed, rank, 7))
        streams.append(torch.rand(4, device=dev))
    if how != "derived" or torch.equal(*streams):
        return Result("FAIL", "a CPU-saved state resumed on CUDA: ranks draw the same stream")
    ids, mask, target = _pinned_batch(dev)
    if ids is None:
        return Result("FAIL", "the prefetched host batch is not page-locked")
    syncs = []
    for _ in range(3):  # the first steps create the optimiser state; count the last
        syncs = _count_syncs(lambda: train_step(t, (ids, mask, target)))
    if len(syncs) != 1:
        return Result("FAIL", f"{len(syncs)} host syncs in one train_step (expected 1): "
                      + "; ".join(syncs[:3]))
    return Result("PASS", "fused AdamW; device RNG restored, per-rank streams derived; pinned "
                  "batch; 1 host sync per train_step")


def _pinned_batch(dev):
    """Step 0's batch of real stores built from the smoke data, through the trainer's
    prefetcher; (None, None, None) when the host batch is not page-locked."""
    from aleph.data.smoke import ensure_smoke_data
    from aleph.data.tokenizer import load_tokenizer
    from aleph.data.tokens import build_token_store
    from aleph.targets import build_store
    from aleph.train.distributed import World
    from aleph.train.prefetch import BatchSource, DataOrder, Prefetcher

    root = Path(tempfile.mkdtemp(prefix="step-path-"))
    try:
        data = ensure_smoke_data(root / "smoke", rows=512)
        captions = data.captions.read_text(encoding="utf-8").splitlines()
        tokens = build_token_store(captions, load_tokenizer(data.tokenizer_dir),
                                   root / "tokens", 128)
        targets = build_store([str(p) for p in data.target_chunks], root / "targets")
        src = BatchSource(tokens, targets, DataOrder(0, tokens.rows, 256), World(), dev, False)
        if not all(t.is_pinned() for t in src.host(0, 0)):
            return None, None, None
        pf = Prefetcher(src, 2)
        try:
            return pf.take(0, 0, 0)
        finally:
            pf.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _count_syncs(fn) -> list[str]:
    """The synchronising CUDA calls `fn` makes, as torch's sync debug mode reports them."""
    import warnings

    import torch

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).splitlines()[0] for w in caught
            if "synchroniz" in str(w.message).lower()]


def item_campaign(ctx: Ctx) -> Result:
    w = ctx.work / "campaign"
    p = run([sys.executable, "-m", "aleph", *CAMPAIGN_ARGV], w, 420)
    if p.returncode != 0:
        return Result("FAIL", f"aleph campaign exit {p.returncode}: {tail(p)}")
    state = json.loads((w / "campaigns" / "gpu-check" / "campaign.json").read_text())
    parts, spans = [], []
    for rid, r in state["runs"].items():
        man = json.loads((w / "runs" / "smoke" / rid / "manifest.json").read_text())  # GPU_SMOKE
        dev = (man["launches"][-1].get("execution") or {}).get("device")
        if r["status"] != "complete" or len(r["launches"]) != 1 or dev != "cuda:0":
            return Result("FAIL", f"{rid}: status {r['status']}, {len(r['launches'])} launches, "
                          f"trained on {dev} (expected cuda:0, its one visible GPU)")
        e = r["launches"][0]
        spans.append((e["start"], e["end"], e["cuda_visible_devices"], rid))
        parts.append(f"{rid} on {e['device']} (CUDA_VISIBLE_DEVICES={e['cuda_visible_devices']})")
    for a, b in itertools.combinations(spans, 2):  # at the same time only on different GPUs
        if a[0] < b[1] and b[0] < a[1] and a[2] == b[2]:
            return Result("FAIL", f"{a[3]} and {b[3]} ran at the same time on GPU {a[2]}")
    for f in ("report/report.md", "diff-matrix.md", "summary.md"):
        if not (w / "campaigns" / "gpu-check" / f).is_file():
            return Result("FAIL", f"campaign wrote no {f}")
    return Result("PASS", "; ".join(parts) + "; report, diff matrix, summary written")


RUNNERS = {
    "cuda-tests": item_cuda_tests, "bench-eager": item_bench_eager,
    "bench-compiled": item_bench_compiled, "train-header": item_train_header,
    "compile-ckpt-refused": item_compile_ckpt_refused, "compile-alone": item_compile_alone,
    "ckpt-alone": item_ckpt_alone, "nccl-2proc": item_nccl, "gather-pin": item_gather_pin,
    "step-path": item_step_path, "campaign": item_campaign,
}


# --- main -----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__.split("\n")[0],
        epilog="Items: " + ", ".join(ITEMS))
    ap.add_argument("--list", action="store_true", help="print the items and exit")
    ap.add_argument("--only", help="comma list of items to run (the others are skipped)")
    ap.add_argument("--skip", help="comma list of items to skip")
    ap.add_argument("--work", type=Path, help="work root for the launches (kept); default: a "
                    "temporary directory, removed at the end")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU (TFLOP/s), for "
                    "GPUs missing from bench_model.py's table")
    ap.add_argument("--compile-arms", nargs="+", default=["a1_anchored", "a2_dense"], choices=ARMS,
                    help="arms bench-compiled compiles (default a1_anchored a2_dense)")
    ap.add_argument("--gpu-steps", type=int, default=20, help="timed bench steps (default 20)")
    args = ap.parse_args(argv)
    try:
        args.selection = select(args.only, args.skip)
    except ValueError as e:
        ap.error(str(e))
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        ap.error(f"--peak-tflops {args.peak_tflops}: expected a number > 0")
    if args.gpu_steps < 1:
        ap.error(f"--gpu-steps {args.gpu_steps}: expected an integer >= 1")
    return args


def cuda_or_reason() -> tuple[int, str] | str:
    """(GPU count, first GPU's name), or the one-line reason there is no CUDA device."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (f"no CUDA device visible (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda}; CUDA_VISIBLE_DEVICES={cvd!r}): nothing to check; run it "
                "on a machine with an NVIDIA GPU and driver >= 550.54.15")
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, what in ITEMS.items():
            print(f"{name:22s} {what}")
        return 0
    found = cuda_or_reason()
    if isinstance(found, str):
        print(f"gpu_check: FAIL: {found}", flush=True)
        return 2
    gpus, name = found
    work = args.work or Path(tempfile.mkdtemp(prefix="aleph-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(work.absolute(), gpus, name, args)
    print(f"gpu_check: {gpus} x {name}; work root {ctx.work}", flush=True)
    t0, results = time.monotonic(), {}
    try:
        for item, reason in args.selection.items():
            if reason is None and item == "nccl-2proc" and gpus < 2:
                reason = f"{gpus} GPU: NCCL needs two GPUs for two ranks"
            if reason is not None:
                results[item] = Result("SKIP", reason)
            else:
                t = time.monotonic()
                try:
                    results[item] = RUNNERS[item](ctx)
                except Exception as e:  # an item's own failure must not end the others
                    results[item] = Result("FAIL", f"{type(e).__name__}: {e}")
                results[item].detail += f" ({time.monotonic() - t:.0f} s)"
            r = results[item]
            print(f"{r.status:4s} {item:22s} {r.detail}", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    total = time.monotonic() - t0
    count = {s: [k for k, r in results.items() if r.status == s] for s in ("PASS", "FAIL", "SKIP")}
    line = (f"gpu_check: {len(count['PASS'])} passed, {len(count['FAIL'])} failed, "
            f"{len(count['SKIP'])} skipped in {total:.0f} s on {gpus} x {name}")
    if count["FAIL"]:
        line += f"; failed: {', '.join(count['FAIL'])}"
    if count["SKIP"]:
        line += f"; skipped: {', '.join(f'{k} ({results[k].detail})' for k in count['SKIP'])}"
    if total > BUDGET_S:
        line += f"; over the {BUDGET_S // 60}-minute budget"
    print(line, flush=True)
    return 1 if count["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
