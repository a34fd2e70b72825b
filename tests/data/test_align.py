"""`aleph data check-align` on the smoke data: the true pairing passes; shuffled, shifted by
one row, and a row dropped halfway fail; row counts that differ are bad input (exit 2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from aleph.data import load_captions, open_captions
from aleph.data.align import check_pairing, sample_blocks
from aleph.errors import DataError

SAMPLE = 2048  # 16 blocks of 128: 1,024 rows fitted, 1,024 held out


def _parquet(path, caps):
    pq.write_table(pa.table({"caption": caps}), path)
    return path


@pytest.fixture(scope="module")
def pairings(smoke, tmp_path_factory):
    d = tmp_path_factory.mktemp("align")
    caps = load_captions(smoke.captions)
    order = np.random.default_rng(0).permutation(len(caps))
    half = len(caps) // 2
    return {"aligned": _parquet(d / "aligned.parquet", caps),
            "shuffled": _parquet(d / "shuffled.parquet", [caps[i] for i in order]),
            "shift": _parquet(d / "shift.parquet", caps[1:] + caps[:1]),
            "dropped": _parquet(d / "dropped.parquet", caps[:half] + caps[half + 1:] + caps[:1])}


def _check(smoke, smoke_tokenizer, path):
    return check_pairing(open_captions(path), [str(p) for p in smoke.target_chunks],
                           smoke_tokenizer, sample=SAMPLE)


def test_aligned_pairing_passes_far_above_chance(smoke, smoke_tokenizer, pairings):
    r = _check(smoke, smoke_tokenizer, pairings["aligned"])
    assert r.aligned, r.line()
    assert r.held_out == r.fitted == 1024
    assert r.r_at_1 > 100 * r.chance and r.r_at_1 > 5 * max(r.shuffled, *r.shifted.values())


@pytest.mark.parametrize("kind", ["shuffled", "shift", "dropped"])
def test_misaligned_pairings_fail(smoke, smoke_tokenizer, pairings, kind):
    r = _check(smoke, smoke_tokenizer, pairings[kind])
    assert not r.aligned, r.line()
    if kind == "shift":  # caption i is target i+1's text: that pairing wins, and is named
        assert r.shifted[1] > 100 * r.chance and "caption i looks like target i+1's" in r.line()
    if kind == "shuffled":
        assert r.r_at_1 < 10 * r.chance


def test_cli_exit_codes(smoke, pairings, tmp_path):
    def start(captions):
        return subprocess.Popen(
            [sys.executable, "-m", "aleph", "data", "check-align", "--captions", str(captions),
             "--targets", str(smoke.target_chunks[0].parent), "--tokenizer",
             str(smoke.tokenizer_dir), "--sample", str(SAMPLE)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(p):
        out, err = p.communicate(timeout=300)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    short = _parquet(tmp_path / "short.parquet", load_captions(smoke.captions)[:-1])
    # three independent read-only processes, started together (each is mostly starting
    # Python and torch): each one's exit status and output are checked as before
    procs = [start(c) for c in (pairings["aligned"], pairings["shift"], short)]
    try:
        ok, bad, r = [finish(p) for p in procs]
    finally:
        for p in procs:  # none left behind by a timeout (a no-op for the ended ones)
            p.kill()
            p.wait()
    assert ok.returncode == 0 and "ALIGNED: held-out R@1" in ok.stdout, ok.stderr
    assert bad.returncode == 1 and bad.stdout.count("\n") == 1 and "MISALIGNED" in bad.stdout
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"{smoke.rows - 1} rows" in r.stderr and f"has {smoke.rows}" in r.stderr


def test_sample_blocks_spread_and_refuse_tiny_sources():
    blocks = sample_blocks(31_905_616, 4096)
    assert len(blocks) == 16 and all(n == 256 for _, n in blocks)
    assert blocks[0][0] == 2 and blocks[-1][0] + 256 == 31_905_616 - 2  # shifts fit both ends
    assert all(b[0] - a[0] > 256 for a, b in zip(blocks, blocks[1:], strict=False))
    with pytest.raises(DataError, match="too few"):
        sample_blocks(20, 4096)


def test_e1_preflight_refuses_a_misaligned_pairing_unless_allowed(smoke, pairings, tmp_path,
                                                                  monkeypatch):
    from aleph.train.config import resolve
    from aleph.train.preflight import check_inputs

    monkeypatch.setenv("ALEPH_WORK", str(tmp_path / "work"))

    def cfg(captions, *sets):
        return resolve("e1", arm="a2_dense", overrides=[
            f"captions={captions}", f"targets={smoke.target_chunks[0].parent}",
            f"tokenizer={smoke.tokenizer_dir}", *sets])

    lines: list[str] = []
    assert check_inputs(cfg(pairings["aligned"]), say=lines.append).misalignment_allowed is None
    assert any(x.startswith("inputs: alignment: ALIGNED: held-out R@1") for x in lines)
    lines.clear()
    check_inputs(cfg(pairings["aligned"]), say=lines.append)  # a resumed launch: memoised
    assert any("ALIGNED" in x and "(memoised" in x for x in lines)
    with pytest.raises(DataError, match=r"do not pair with the targets row by row: MISALIGNED.*"
                                        r"set allow_misaligned=true"):
        check_inputs(cfg(pairings["shift"]))
    lines.clear()
    got = check_inputs(cfg(pairings["shift"], "allow_misaligned=true"), say=lines.append)
    assert got.misalignment_allowed["by"] == "allow_misaligned=true"
    assert got.misalignment_allowed["aligned"] is False and got.misalignment_allowed["shifted"]["1"] > 0.5
    assert any("ALLOWED by allow_misaligned=true" in x for x in lines)
    assert not (tmp_path / "work" / "runs").exists()


@pytest.mark.parametrize("bad,what", [("nan", "holds NaN or Inf"), ("inf", "holds NaN or Inf"),
                                      ("huge", "has norm 1e+30, over 1,000,000 times the sampled rows' median 1; expected vectors of one scale")])
def test_a_non_finite_target_row_is_one_line_naming_the_row(smoke, pairings, tmp_path, bad,
                                                            what):
    """Exit 2 (bad input) naming the chunk file and row, not exit 1 (misaligned) with a
    traceback; the e1 preflight calls the same check. One finite row 1e30 times the others
    (review 3 F6) made every score tie: a confident MISALIGNED for aligned targets."""
    chunks = sorted(smoke.target_chunks)
    targets = tmp_path / "targets"
    targets.mkdir()
    for c in chunks:  # float32 (a 1e30 row is finite there), the same values
        torch.save(torch.load(c, weights_only=True).float(), targets / c.name)
    first = targets / chunks[0].name
    x = torch.load(first, weights_only=True)
    # row 5: inside the first sampled block (rows 2 .. 2 + 128, shifts around it)
    x[5] = {"nan": float("nan"), "inf": float("inf")}.get(bad, 0) if bad != "huge" else x[5] * 1e30
    torch.save(x, first)
    r = subprocess.run(
        [sys.executable, "-m", "aleph", "data", "check-align", "--captions",
         str(pairings["aligned"]), "--targets", str(targets), "--tokenizer",
         str(smoke.tokenizer_dir), "--sample", str(SAMPLE)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr)
    assert f"{first}: target row 5 (row 5 of the targets) {what}" in r.stderr, r.stderr
    print(r.stderr.strip())


def test_targets_naming_a_fifo_is_one_line_saying_what_it_is(smoke, pairings, tmp_path):
    fifo = tmp_path / "targets.npy"
    os.mkfifo(fifo)
    r = subprocess.run(
        [sys.executable, "-m", "aleph", "data", "check-align", "--captions",
         str(pairings["aligned"]), "--targets", str(fifo), "--tokenizer",
         str(smoke.tokenizer_dir)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--targets {fifo} is a FIFO; expected a chunk file" in r.stderr
    print(r.stderr.strip())


@pytest.mark.parametrize("values,what", [
    (lambda i: i, r"int \(int64\)"),
    (lambda i: [f"word{i}", "dog"], r"list \(list<\w+: string>\)"),
    (lambda i: None, r"NoneType \((string|null)\)"),
])
def test_a_parquet_caption_column_that_is_not_strings_is_bad_input(smoke, smoke_tokenizer,
                                                                   tmp_path, values, what):
    """Not a tokenizer traceback (exit 1), nor a list read as words and called MISALIGNED."""
    rows = len(load_captions(smoke.captions))
    path = _parquet(tmp_path / "odd.parquet", [values(i) for i in range(rows)])
    with pytest.raises(DataError, match=rf"odd\.parquet column 'caption': row \d+ is {what}, "
                                        "expected a string"):
        _check(smoke, smoke_tokenizer, path)


def test_finite_but_huge_targets_give_the_figures_of_the_same_targets_unscaled(
        smoke, smoke_tokenizer, pairings, tmp_path, monkeypatch):
    """bfloat16 targets scaled by 2**127 (|x| up to 1.7e38, all finite) once made the float32
    sums Inf, R@1 NaN and a traceback (exit 1); the verdict is cosine, so an exact power-of-two
    scale changes no figure. A non-finite R@1 all the same is a DataError naming the targets."""
    import aleph.data.align as align

    dirs = {k: tmp_path / k for k in ("unit", "huge")}
    for k, d in dirs.items():
        d.mkdir()
        for c in sorted(smoke.target_chunks):
            t = torch.load(c, weights_only=True).float()
            t = (t / t.abs().max()).to(torch.bfloat16) * (2.0 ** 127 if k == "huge" else 1)
            assert torch.isfinite(t).all()
            torch.save(t, d / c.name)
    base, scaled = (check_pairing(open_captions(pairings["aligned"]), sorted(map(str, d.iterdir())),
                                  smoke_tokenizer, sample=SAMPLE) for d in dirs.values())
    assert scaled.aligned and scaled.r_at_1 == base.r_at_1 and scaled.shifted == base.shifted
    print(base.line(), scaled.line(), sep="\n")
    monkeypatch.setattr(align, "retrieval_credit", lambda s, same: torch.full(s.shape[:-1], float("nan")))
    with pytest.raises(DataError, match=rf"^targets {re.escape(str(smoke.target_chunks[0]))}.*: "
                                        r"held-out R@1 is not finite \(nan\); expected finite "):
        _check(smoke, smoke_tokenizer, pairings["aligned"])


def test_a_parquet_footer_that_overstates_its_rows_is_refused_not_aligned(smoke, smoke_tokenizer,
                                                                          tmp_path):
    """4,095 captions under a footer (file and row group) claiming 4,096 were ALIGNED against
    4,096 targets; the row group read must hold the rows its footer counts."""
    from tests.data.test_captions import _lying_parquet

    path = tmp_path / "lie.parquet"
    _lying_parquet(path, load_captions(smoke.captions)[:-1], smoke.rows)
    with pytest.raises(DataError, match=r"lie\.parquet column 'caption': 4,095 rows read but "
                                        r"4,096 counted before reading \(a footer that overstates"):
        _check(smoke, smoke_tokenizer, path)
