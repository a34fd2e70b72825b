"""bench/gpu_check.py on CPU: a clean one-line failure without CUDA, its arguments and item
list, its checks on given inputs, and every launch it makes resolving to a valid config."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # its dataclasses resolve their module while it loads
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("gpu_check", None)


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


def test_without_cuda_it_fails_in_one_line_and_the_record_says_so(gc, tmp_path):
    out = tmp_path / "check.json"
    p = _run("--out", str(out), CUDA_VISIBLE_DEVICES="")
    assert p.returncode == 2, p.stderr
    assert p.stdout.startswith("gpu_check: FAIL: no CUDA device visible (torch 2.4.1")
    assert p.stdout.count("\n") == 1 and "CUDA_VISIBLE_DEVICES=''" in p.stdout
    assert "Traceback" not in p.stderr
    rec = json.loads(out.read_text())
    assert rec["state"] == "cannot run" and rec["exit"] == 2
    assert rec["reason"] == p.stdout.split("gpu_check: FAIL: ", 1)[1].strip()
    assert rec["environment"]["torch"].startswith("2.4.1") and rec["environment"]["cuda_available"] is False
    assert sorted(rec["items"]) == sorted(gc.ITEMS)  # the record's keys are sorted
    assert {v["status"] for v in rec["items"].values()} == {"SKIP"}


def test_list_and_bad_arguments(gc):
    p = _run("--list")
    assert p.returncode == 0
    assert [line.split()[0] for line in p.stdout.splitlines()] == list(gc.ITEMS)
    assert list(gc.ITEMS) == list(gc.RUNNERS)  # every item has its runner, in order
    bad = _run("--skip", "bench-eager,nope")
    assert bad.returncode == 2 and "--skip 'nope': not an item" in bad.stderr.splitlines()[-1]
    bad = _run("--peak-tflops", "0", "--list")
    assert bad.returncode == 2 and "--peak-tflops 0.0: expected a number > 0" in bad.stderr
    bad = _run("--budget-s", "0", "--list")
    assert bad.returncode == 2 and "--budget-s 0.0: expected a number of seconds > 0" in bad.stderr


def test_selection_and_budget(gc):
    sel = gc.select("campaign,gather-pin", "gather-pin")
    assert sel["campaign"] is None and sel["gather-pin"] == "--skip"
    assert sel["cuda-tests"] == "not in --only" and list(sel) == list(gc.ITEMS)
    assert all(v is None for v in gc.select(None, None).values())
    assert set(gc.NEEDS_S) == set(gc.ITEMS)
    assert gc.budget_reason("bench-compiled", 1000) is None
    why = gc.budget_reason("bench-compiled", 42.4)
    assert why == f"budget: 42 s left of --budget-s, the item needs about {gc.NEEDS_S['bench-compiled']} s"
    ctx = gc.Ctx(Path("."), 1, "x", Namespace(), deadline=__import__("time").monotonic() + 30)
    assert 29 <= ctx.timeout(300) <= 30 and ctx.timeout(5) == 5  # the earlier of cap and deadline


def test_header_check(gc):
    tag = "[20261130T010203Z-h-1] 2026-11-30T01:02:03Z "
    good = (f"{tag}launch x\n{tag}allocator cap: 0.9 of 139.8 GiB = 125.82 GiB\n"
            f"{tag}VRAM probe: NVIDIA H200: required 3.10 GiB, free 125.82 GiB (of 139.8): pass\n")
    r = gc.check_header(good)
    assert r.status == "PASS" and "0.9 of 139.8 GiB" in r.detail and r.detail.endswith(": pass")
    swapped = "\n".join(reversed(good.splitlines()))
    assert gc.check_header(swapped).detail == "VRAM probe line before the allocator cap line"
    cpu = f"{tag}allocator cap: none\n{tag}VRAM probe: skipped: no CUDA\n"  # a CPU launch's
    assert gc.check_header(cpu).status == "FAIL"
    assert gc.check_header(good.replace(": pass", ": FAIL")).status == "FAIL"
    assert "lacks the VRAM probe" in gc.check_header(good.splitlines()[1]).detail


def test_bench_judgement(gc):
    row = {"arm": "a1_anchored", "device": "cuda", "compile": True, "samples_per_s": 1234.5,
           "mfu": 0.31, "mfu_real": 0.16, "gpu": "NVIDIA H200"}
    rows = [row, {**row, "arm": "a2_dense", "mfu": 0.4}, {**row, "compile": False, "mfu": 0.2}]
    ok = gc.judge_bench(rows, True, ["a1_anchored", "a2_dense"])
    assert ok.status == "PASS", ok.detail
    assert "a1_anchored 1,234 samples/s MFU 31.0% on slots, 16.0% on real tokens" in ok.detail
    assert "a2 MFU 40.0% (pass mark 25%, goal 40%, on paper about 36-42% on an H200)" in ok.detail
    assert gc.judge_bench(rows, False, ["a1_anchored", "a2_dense"]).detail == \
        "no CUDA result for a2_dense"
    none = gc.judge_bench([{**row, "mfu": None, "gpu": "Odd GPU"}], True, ["a1_anchored"])
    assert none.status == "FAIL" and "--peak-tflops" in none.detail and "Odd GPU" in none.detail
    assert gc.judge_bench([{**row, "mfu": 1.7}], True, ["a1_anchored"]).status == "FAIL"


def test_bench_pass_marks_can_fail(gc):
    eager = [{"arm": a, "device": "cuda", "compile": False, "samples_per_s": 1000.0, "mfu": 0.2,
              "gpu": "NVIDIA A40"} for a in ("a1_anchored", "a2_dense")]
    fast = [{**r, "compile": True, "samples_per_s": 1500.0, "mfu": 0.3} for r in eager]
    ok = gc.judge_bench(fast, True, ["a1_anchored", "a2_dense"], eager)
    assert ok.status == "PASS" and "1.50x eager" in ok.detail and "about 42-47% on an A40" in ok.detail
    assert ok.figures["a2_dense"]["vs_eager"] == 1.5
    slow = [{**r, "samples_per_s": 900.0} for r in fast]
    bad = gc.judge_bench(slow, True, ["a1_anchored", "a2_dense"], eager)
    assert bad.status == "FAIL" and "a1_anchored compiled is not faster than eager (0.90x)" in bad.detail
    low = [{**r, "mfu": 0.2} for r in fast]
    bad = gc.judge_bench(low, True, ["a1_anchored", "a2_dense"], eager)
    assert bad.status == "FAIL" and bad.detail.startswith("a2 compiled MFU 20.0% < 25%")
    other = [{**r, "gpu": "NVIDIA L4"} for r in low]  # no pass mark for this class
    assert gc.judge_bench(other, True, ["a1_anchored", "a2_dense"], eager).status == "PASS"


def test_allocator_cap_judgement(gc):
    total = 48 * 2**30
    ok = gc.check_cap(0.1, total, True, "CUDA out of memory. Tried to allocate 5.80 GiB")
    assert ok.status == "PASS" and "4.80 GiB enforced" in ok.detail
    assert gc.check_cap(0.1, total, True, None).detail.endswith("succeeded: not enforced")
    assert gc.check_cap(0.1, total, False, None).status == "FAIL"


def test_loss_trajectory_comparison(gc):
    one = [(1, 4.0), (2, 3.5), (3, 3.0)]
    assert gc.compare_losses(one, [(s, v + 5e-5) for s, v in one]).status == "PASS"
    assert gc.compare_losses(one, [(s, v + 1e-3) for s, v in one]).status == "FAIL"
    assert gc.compare_losses(one, one[:2]).detail.startswith("steps differ")


def test_every_launch_of_the_check_is_a_valid_config(gc, tmp_path):
    from aleph.campaign.spec import Device, check_devices, make_spec, resolve_configs
    from aleph.cli import build_parser
    from aleph.data.tokenizer import load_tokenizer
    from aleph.train.config import resolve

    data = gc.e1_data(tmp_path)  # the E1-shaped synthetic data, built for real
    assert gc.e1_data(tmp_path) == data  # once
    captions = (data / "captions.txt").read_text().splitlines()
    tok = load_tokenizer(data / "tokenizer")
    assert len(captions) == 1024 and len(tok) == 30522
    assert min(len(tok(c)["input_ids"]) for c in captions[:16]) > 128  # every row fills L=128
    parser = build_parser(only="train")
    for item in gc.LAUNCHES:
        a = parser.parse_args(gc.train_argv(item, data))
        if item == "compile-ckpt-refused":
            continue  # refused on purpose: checked for real below
        cfg = resolve(a.preset, a.config, a.overrides, arm=a.arm, seed=a.seed)
        assert (f"{cfg.arm}-s{cfg.seed}" if a.preset == "e1"
                else f"{cfg.preset}/{cfg.arm}-s{cfg.seed}") == gc.run_id(item)
        if a.preset == "e1":  # the E1 shape on the E1-shaped data
            assert (cfg.smoke_data, cfg.batch_size, cfg.max_len, cfg.d_model, cfg.dropout) == (
                False, 256, 128, 512, 0.1)
            assert cfg.tokenizer == str(data / "tokenizer") and cfg.captions.endswith("captions.txt")
        else:
            assert cfg.device == "cuda"
    ids = [gc.run_id(i) for i in gc.LAUNCHES]
    assert len(set(ids)) == len(ids)  # one run directory per item: none resumes another's
    a = build_parser(only="campaign").parse_args(gc.CAMPAIGN_ARGV)
    spec = make_spec(a.name, a.preset, a.config, a.overrides, a.arms, a.seeds)
    check_devices(resolve_configs(spec), [Device("gpu0", "cuda", "0")])
    assert a.devices == "all"


def test_the_refusal_item_passes_for_real_on_cpu(gc, tmp_path):
    # The law's refusal is a config check: it runs anywhere, and proves the item's launch.
    ctx = gc.Ctx(tmp_path, 0, "none", Namespace())
    r = gc.item_compile_ckpt_refused(ctx)
    assert r.status == "PASS", r.detail
    assert "compile and checkpointing are exclusive" in r.detail
