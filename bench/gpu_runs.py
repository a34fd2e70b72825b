"""The item runners of bench/gpu_check.py (the helpers and judgements: gpu_items.py).

Subprocess items time out at their own cap or at the global budget's end, whichever
comes first; in-process items run under gpu_items.in_process_deadline with the same rule.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

from gpu_items import (
    ARMS,
    CAMPAIGN_ARGV,
    E1_BATCH,
    E1_LEN,
    E1_VOCAB,
    REPO,
    Ctx,
    Result,
    check_cap,
    check_header,
    compare_losses,
    in_process_deadline,
    judge_bench,
    launch_log,
    run,
    run_id,
    tail,
    tb_losses,
    train,
    visible_gpus,
)

# --- the items ----------------------------------------------------------------------------

def item_cuda_tests(ctx: Ctx) -> Result:
    p = run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
             "-rs", str(REPO / "tests")], ctx.work / "pytest", ctx.timeout(300))
    lines = [x.strip() for x in p.stdout.splitlines() if x.strip()]
    summary = lines[-1] if lines else tail(p)
    if p.returncode != 0:
        return Result("FAIL", f"pytest exit {p.returncode}: {summary}")
    skipped = [x for x in lines if x.startswith("SKIPPED")]
    one_gpu = all("two CUDA devices" in x for x in skipped)  # the 2-device test on 1 GPU
    if (skipped and not (one_gpu and ctx.gpus < 2)) or "passed" not in summary:
        return Result("FAIL", f"GPU tests skipped or none ran: {summary}")
    return Result("PASS", summary + (" (the two-device test needs 2 GPUs)" if skipped else ""))


def _bench(ctx: Ctx, compiled: bool) -> Result:
    arms = list(ctx.args.compile_arms if compiled else ARMS)
    out = ctx.work / f"bench-{'compiled' if compiled else 'eager'}.json"
    cmd = [sys.executable, str(REPO / "bench" / "bench_model.py"), "--steps", "1", "--cpu-batch",
           "8", "--e1-cpu-steps", "0", "--gpu-steps", str(ctx.args.gpu_steps), "--arms", *arms,
           "--json", str(out), "--no-eager" if compiled else "--no-compile"]
    if ctx.args.peak_tflops:
        cmd += ["--peak-tflops", str(ctx.args.peak_tflops)]
    p = run(cmd, ctx.work, ctx.timeout(420 if compiled else 180))
    if p.returncode != 0 or not out.is_file():
        return Result("FAIL", f"bench_model.py exit {p.returncode}: {tail(p)}")
    eager = ctx.work / "bench-eager.json"
    eager_rows = json.loads(eager.read_text()) if compiled and eager.is_file() else None
    res = judge_bench(json.loads(out.read_text()), compiled, arms, eager_rows)
    if compiled and eager_rows is None:
        res.detail += " (bench-eager did not run: compiled vs eager not compared)"
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
    p = train(ctx, "train-header", cap=240)
    if p.returncode != 0:
        return Result("FAIL", f"launch exit {p.returncode}: {tail(p)}")
    return check_header(launch_log(ctx.work, run_id("train-header")))


def item_compile_ckpt_refused(ctx: Ctx) -> Result:
    p = train(ctx, "compile-ckpt-refused", cap=120)
    if p.returncode == 2 and "compile and checkpointing are exclusive" in p.stderr:
        rid = run_id("compile-ckpt-refused")
        if (ctx.work / "runs" / rid).exists():
            return Result("FAIL", f"refused, but runs/{rid} was created")
        return Result("PASS", "refused before anything was written: " + tail(p)[:160])
    return Result("FAIL", f"expected exit 2 with the law's message, got exit {p.returncode}: {tail(p)}")


def _alone(ctx: Ctx, item: str) -> Result:
    p = train(ctx, item, cap=420)
    rid = run_id(item)
    text = launch_log(ctx.work, rid)
    if p.returncode != 0 or "launch ended: complete" not in text:
        return Result("FAIL", f"launch exit {p.returncode}: {tail(p)}")
    m = json.loads((ctx.work / "runs" / rid / "manifest.json").read_text())
    ex = m["launches"][-1].get("execution") or {}
    return Result("PASS", f"3 steps of {E1_BATCH} x {E1_LEN} tokens on {ex.get('gpu')} (compile "
                  f"{ex.get('compile')}, checkpointing {ex.get('checkpointing')}, autocast "
                  f"{ex.get('autocast')})")


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
    p2 = train(ctx, "nccl-2proc", cap=420, work=two_w, prefix=torchrun,
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
    if not stores:  # train-header did not run: build one from the E1-shaped data
        p = train(ctx, "gather-pin")
        stores = sorted((ctx.work / "cache" / "targets").glob("*/manifest.json"))
        if not stores:
            return Result("FAIL", f"no target store to gather from (launch exit {p.returncode}: "
                          f"{tail(p)})")
    d, parts, figures = stores[0].parent, [], {}
    with in_process_deadline(ctx.timeout(120)):
        for impl in ("streaming", "in_ram"):
            store = open_store(d, impl)
            idx = torch.randperm(store.rows)[:E1_BATCH]
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
            figures[impl] = rates
            parts.append(f"{impl}: pinned {rates['pinned']:,.0f} vs plain {rates['plain']:,.0f} "
                         "rows/s gather + host-to-device")
    return Result("PASS", f"{store.rows:,} x {store.dim} store; " + "; ".join(parts), figures)


def item_alloc_cap(ctx: Ctx) -> Result:
    """The trainer's allocator cap (preflight.apply_allocator_cap) really refuses an
    allocation above it: 1 GiB under the cap succeeds, cap + 1 GiB in one tensor fails."""
    import torch

    from aleph.train.config import resolve
    from aleph.train.preflight import apply_allocator_cap

    dev = torch.device("cuda", 0)
    cfg = resolve("e1", arm="a2_dense", overrides=["smoke_data=true", "tokenizer=",
                                                   "alloc_cap_fraction=0.1"])
    total = torch.cuda.get_device_properties(dev).total_memory
    below_ok, above = False, None
    with in_process_deadline(ctx.timeout(60)):
        torch.cuda.empty_cache()
        try:
            apply_allocator_cap(cfg, dev)
            small = torch.empty(1 << 30, dtype=torch.uint8, device=dev)  # 1 GiB < 0.1 x total
            below_ok = True
            del small
            try:
                torch.empty(int(0.1 * total) + (1 << 30), dtype=torch.uint8, device=dev)
            except torch.cuda.OutOfMemoryError as e:
                above = str(e).splitlines()[0]
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
            torch.cuda.empty_cache()
    return check_cap(0.1, total, below_ok, above)


def item_step_path(ctx: Ctx) -> Result:
    """The CUDA-only parts of the step path, in this process on GPU 0, at the E1 shape
    (12 x 512, a batch of 256 x 128 tokens over 30,522 ids, dropout 0.1, bf16)."""
    import torch

    from aleph.model import ModelConfig, build_model
    from aleph.train import checkpoint as ckpt
    from aleph.train.config import resolve
    from aleph.train.distributed import World
    from aleph.train.step import train_step
    from aleph.train.trainer import step_trainer

    dev = torch.device("cuda", 0)
    cfg = resolve("e1", arm="a1_anchored", overrides=["smoke_data=true", "tokenizer="])
    with in_process_deadline(ctx.timeout(180)):
        torch.manual_seed(0)
        model = build_model(ModelConfig(arm="a1_anchored", vocab_size=E1_VOCAB,
                                        dropout=cfg.dropout)).to(dev)
        t = step_trainer(cfg, model, 10, World(), dev)
        opt = t.opt
        flags = [g.get("fused") for g in opt.param_groups]  # the groups, not opt.defaults
        if not all(flags):
            return Result("FAIL", f"AdamW param groups not fused on CUDA: fused={flags}")
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
        if not _prefetch_pins(dev):
            return Result("FAIL", "the prefetched host batch is not page-locked")
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, E1_VOCAB, (E1_BATCH, E1_LEN), generator=g).pin_memory().to(dev)
        mask = torch.ones(E1_BATCH, E1_LEN, dtype=torch.bool).pin_memory().to(dev)
        mask[::3, 100:] = False  # padding, as the trainer's batches have
        target = torch.nn.functional.normalize(torch.randn(E1_BATCH, 768, generator=g), dim=-1)
        target = target.half().pin_memory().to(dev)
        syncs = []
        for _ in range(3):  # the first steps create the optimiser state; count the last
            syncs = _count_syncs(lambda: train_step(t, (ids, mask, target)))
    if len(syncs) != 1:
        return Result("FAIL", f"{len(syncs)} host syncs in one train_step (expected 1): "
                      + "; ".join(syncs[:3]))
    return Result("PASS", f"fused AdamW groups; device RNG restored, per-rank streams derived; "
                  f"pinned prefetch; 1 host sync per train_step at {E1_BATCH} x {E1_LEN}",
                  {"host_syncs_per_step": len(syncs)})


def _prefetch_pins(dev) -> bool:
    """Whether the trainer's prefetcher hands out page-locked host batches (real stores
    built from the smoke data)."""
    import shutil
    import tempfile

    from aleph.data.smoke import ensure_smoke_data
    from aleph.data.tokenizer import load_tokenizer
    from aleph.data.tokens import build_token_store
    from aleph.targets import build_store
    from aleph.train.distributed import World
    from aleph.train.order import DataOrder
    from aleph.train.prefetch import BatchSource

    root = Path(tempfile.mkdtemp(prefix="step-path-"))
    try:
        data = ensure_smoke_data(root / "smoke", rows=512)
        captions = data.captions.read_text(encoding="utf-8").splitlines()
        tokens = build_token_store(captions, load_tokenizer(data.tokenizer_dir),
                                   root / "tokens", 128)
        targets = build_store([str(p) for p in data.target_chunks], root / "targets")
        src = BatchSource(tokens, targets, DataOrder(0, tokens.rows, 256), World(), dev, False)
        return all(t.is_pinned() for t in src.host(0, 0) if t is not None)  # no mask: unpadded
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
    p = run([sys.executable, "-m", "aleph", *CAMPAIGN_ARGV], w, ctx.timeout(420))
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
