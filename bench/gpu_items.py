"""Helpers and judgements of bench/gpu_check.py: data, launches, subprocesses, verdicts.

Each item returns a Result (status, detail, figures). Subprocess items get a timeout of
their own cap or what is left of the global budget, whichever is less; in-process items
run under an alarm with the same rule (in_process_deadline).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("a1_anchored", "a2_dense", "a3_random")
E1_ROWS, E1_LEN, E1_VOCAB, E1_BATCH = 1024, 128, 30522, 256
"""The E1-shaped synthetic data of the launches: 1,024 captions of ~1,160 characters (over
128 tokens, so every row fills max_len), a 30,522-entry WordPiece tokenizer, random
unit fp16 targets: 4 batches of 256 x 128 tokens per epoch."""


@dataclass
class Result:
    status: str  # PASS | FAIL | SKIP
    detail: str
    figures: dict = field(default_factory=dict)


@dataclass
class Ctx:
    work: Path
    gpus: int
    gpu_name: str
    args: object
    deadline: float = float("inf")  # time.monotonic() of the global budget's end
    results: dict = field(default_factory=dict)  # item -> Result of the items run so far

    def timeout(self, cap: float) -> float:
        """An item's timeout: its own cap, or the seconds left of the budget if fewer."""
        return max(1.0, min(cap, self.deadline - time.monotonic()))


def e1_args(data: Path) -> list[str]:
    """The e1 preset on the E1-shaped synthetic data in `data` (see E1_ROWS)."""
    return ["--preset", "e1", "--set", f"captions={data / 'captions.txt'}",
            "--set", f"targets={data / 'targets'}", "--set", f"tokenizer={data / 'tokenizer'}",
            "--set", "ckpt_every_minutes=0", "--set", "log_every_steps=1"]


GPU_SMOKE = ["--preset", "smoke", "--set", "device=cuda", "--set", "deterministic=false"]
# item -> (arm, seed, "e1" or "smoke", --set values) of its `aleph train` launch; one run
# directory each (distinct seeds), so the items do not resume each other's runs.
LAUNCHES = {
    "train-header": ("a1_anchored", 10, "e1", ("max_steps=5", "alloc_cap_fraction=0.9")),
    "compile-ckpt-refused": ("a2_dense", 11, "e1",
                             ("compile=true", "checkpointing=true", "max_steps=3")),
    "compile-alone": ("a1_anchored", 12, "e1", ("max_steps=3", "compile=true", "n_layers=2")),
    "ckpt-alone": ("a1_anchored", 13, "e1", ("max_steps=3", "checkpointing=true")),
    "gather-pin": ("a2_dense", 14, "e1", ("max_steps=1",)),
    "nccl-2proc": ("a1_anchored", 20, "smoke",
                   ("max_steps=8", "dropout=0.0", "bf16=false", "log_every_steps=1")),
}
CAMPAIGN_ARGV = ["campaign", "--name", "gpu-check", "--arms", "a1_anchored", "a2_dense",
                 "--seeds", "0", "--devices", "all", *GPU_SMOKE, "--set", "max_steps=20",
                 "--probe-rows", "256", "--poll-seconds", "0.5"]


def train_argv(item: str, data: Path) -> list[str]:
    """`aleph train ...` arguments of an item's launch (`data`: the E1-shaped data)."""
    arm, seed, preset, sets = LAUNCHES[item]
    argv = ["train", "--arm", arm, "--seed", str(seed),
            *(e1_args(data) if preset == "e1" else GPU_SMOKE)]
    for value in sets:
        argv += ["--set", value]
    return argv


def run_id(item: str) -> str:
    """The run name of an item's launch under <work>/runs (aleph.train.identity.run_name)."""
    from aleph.train.identity import run_name

    arm, seed, preset, _ = LAUNCHES[item]
    return run_name(preset, arm, seed)


def e1_data(work: Path) -> Path:
    """Build (once) the E1-shaped synthetic data under `work`/e1-data; returns its path."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    import synth

    root = work / "e1-data"
    done = root / "done"
    if done.is_file():
        return root
    (root / "targets").mkdir(parents=True, exist_ok=True)
    synth.write_tokenizer(root / "tokenizer")
    text = synth.captions(2 * E1_ROWS)  # two ~580-character captions a row: > 128 tokens
    rows = [f"{a} {b}" for a, b in zip(text[::2], text[1::2], strict=True)]
    (root / "captions.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    g = torch.Generator().manual_seed(0)
    for i in range(2):  # two chunk files, as the extraction ships a series of them
        rows = torch.nn.functional.normalize(torch.randn(E1_ROWS // 2, 768, generator=g), dim=-1)
        torch.save(rows.half(), root / "targets" / f"chunk-{i:03d}.pt")
    done.write_text("ok\n")
    return root


@contextmanager
def in_process_deadline(seconds: float):
    """TimeoutError in this (main) thread after `seconds` (an in-process item's timeout;
    a CUDA call already running finishes first)."""
    def fire(signum, frame):
        raise TimeoutError(f"in-process item timed out after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(cmd: list[str], work: Path, timeout: float, **env: str) -> subprocess.CompletedProcess:
    """Run `cmd` from the repository root with ALEPH_WORK=work; past `timeout` it gets
    SIGTERM (a trainer saves, a campaign stops its trainers), then SIGKILL 20 s later."""
    full = {**os.environ, "ALEPH_WORK": str(work), "PYTHONPATH": os.pathsep.join(
        [str(REPO), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]),
        **env}
    proc = subprocess.Popen(cmd, cwd=REPO, env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, None)):
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


def train(ctx: Ctx, item: str, cap: float = 300, work: Path | None = None,
          prefix: list[str] | None = None, **env: str) -> subprocess.CompletedProcess:
    data = e1_data(ctx.work) if LAUNCHES[item][2] == "e1" else ctx.work
    cmd = [*(prefix or [sys.executable, "-m", "aleph"]), *train_argv(item, data)]
    return run(cmd, work or ctx.work, ctx.timeout(cap), **env)


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


# --- pure judgements (tested on CPU) ------------------------------------------------------

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


def judge_bench(rows: list[dict], compiled: bool, arms: list[str],
                eager: list[dict] | None = None) -> Result:
    """bench_model.py --json rows of one mode: every arm measured with an MFU in (0, 1).

    Compiled, also: each arm faster than its eager row (when `eager` rows are given), and
    a2's MFU on slots >= gpu_peaks.MFU_PASS on an A40/A100/H100/H200-class GPU, printed
    next to the goal and the on-paper estimate."""
    from gpu_peaks import MFU_GOAL, MFU_ON_PAPER, MFU_PASS, mfu_class

    mine = {r["arm"]: r for r in rows if r.get("device") == "cuda" and r.get("compile") is compiled}
    missing = [a for a in arms if a not in mine]
    if missing:
        return Result("FAIL", f"no CUDA result for {', '.join(missing)}")
    parts, figures, fails = [], {}, []
    slow = {r["arm"]: r for r in (eager or []) if r.get("compile") is False}
    for arm in arms:
        r = mine[arm]
        mfu = r.get("mfu")
        if mfu is None:
            return Result("FAIL", f"{arm}: no MFU: GPU {r.get('gpu')!r} is not in gpu_peaks.py's "
                          "table; rerun with --peak-tflops <dense bf16 TFLOP/s>")
        if not 0 < mfu < 1:
            return Result("FAIL", f"{arm}: MFU {mfu:.3f} outside (0, 1): wrong --peak-tflops?")
        real = r.get("mfu_real")
        parts.append(f"{arm} {r['samples_per_s']:,.0f} samples/s MFU {100 * mfu:.1f}% on slots"
                     + (f", {100 * real:.1f}% on real tokens" if real is not None else ""))
        figures[arm] = {k: r.get(k) for k in ("samples_per_s", "mfu", "mfu_real", "tflops_slots")}
        if compiled and arm in slow:
            ratio = r["samples_per_s"] / slow[arm]["samples_per_s"]
            figures[arm]["vs_eager"] = ratio
            parts[-1] += f", {ratio:.2f}x eager"
            if ratio <= 1.0:
                fails.append(f"{arm} compiled is not faster than eager ({ratio:.2f}x)")
    if compiled and "a2_dense" in mine:
        cls = mfu_class(mine["a2_dense"].get("gpu", ""))
        mfu = mine["a2_dense"]["mfu"]
        if cls is None:
            parts.append("a2 MFU pass mark: none for this GPU (A40/A100/H100/H200 class only)")
        else:
            parts.append(f"a2 MFU {100 * mfu:.1f}% (pass mark {MFU_PASS:.0%}, goal "
                         f"{MFU_GOAL:.0%}, on paper {MFU_ON_PAPER[cls]} on an {cls})")
            if mfu < MFU_PASS:
                fails.append(f"a2 compiled MFU {100 * mfu:.1f}% < {MFU_PASS:.0%}")
    detail = "; ".join(parts)
    if fails:
        return Result("FAIL", "; ".join(fails) + " | " + detail, figures)
    return Result("PASS", detail, figures)


def compare_losses(one: list[tuple[int, float]], two: list[tuple[int, float]],
                   tol: float = 1e-4) -> Result:
    """Two loss trajectories (step, value): same steps, values within `tol`."""
    if not one or [s for s, _ in one] != [s for s, _ in two]:
        return Result("FAIL", f"steps differ: 1 process {[s for s, _ in one]}, "
                      f"2 ranks {[s for s, _ in two]}")
    worst = max(abs(a - b) for (_, a), (_, b) in zip(one, two, strict=True))
    verdict = "PASS" if worst <= tol else "FAIL"
    return Result(verdict, f"{len(one)} steps, max |loss difference| {worst:.2e} (tolerance {tol:g})",
                  {"max_loss_difference": worst})


def check_cap(fraction: float, total: int, below_ok: bool, above_error: str | None) -> Result:
    """The allocator cap item's verdict: an allocation under the cap worked and one above
    it failed with the allocator's out-of-memory error."""
    cap = fraction * total / 2**30
    if not below_ok:
        return Result("FAIL", f"an allocation under the {cap:.2f} GiB cap failed")
    if above_error is None:
        return Result("FAIL", f"an allocation above the {cap:.2f} GiB cap succeeded: not enforced")
    return Result("PASS", f"cap {fraction} of {total / 2**30:.1f} GiB = {cap:.2f} GiB enforced: "
                  f"above it, {above_error[:120]}", {"cap_gib": cap})


