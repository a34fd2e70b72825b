"""Hostile or malformed launch inputs: each is one line on stderr (exit 2), quickly, with
bounded memory, and leaves no trace in runs/: a YAML alias bomb as a config, a FIFO as a
config or as a tokenizer file, a model shape too large to allocate (in a config or in a
pulled model_config.json), a batch larger than the data, a tokenizer asking for its code."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from aleph.data.tokenizer import load_tokenizer
from aleph.errors import ConfigError, DataError
from tests.train.conftest import REPO, child_env, train_cmd

# 349 bytes that expand to 9**9 list items: the alias bomb of the issue
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "batch_size: *i\n"


def _limited():
    """Address space 6 GiB: the bomb grew past 1.5 GB in 60 s before the fix."""
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _launch(work, *extra, timeout=120):
    cmd = train_cmd("a2_dense", 1) + list(extra)
    return subprocess.run(cmd, cwd=REPO, env=child_env(work), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=_limited)


def _one_line(proc, want):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and want in lines[0], proc.stderr
    assert len(lines[0]) < 1000, lines[0]
    return lines[0]


def _no_trace(work):
    assert not (work / "runs").exists(), sorted(p.name for p in (work / "runs").rglob("*"))


def test_a_yaml_alias_bomb_is_refused_at_its_first_alias(train_work, tmp_path):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB)
    assert len(BOMB.encode()) < 400
    line = _one_line(_launch(train_work, "--config", str(cfg), timeout=60),
                     "aliases (*name) are not accepted here")
    assert f"config file {cfg}: not valid yaml at line 2" in line
    _no_trace(train_work)


def test_an_alias_in_a_set_value_is_not_expanded():
    from aleph.train.config_text import parse_override

    key, value = parse_override("run_note=&a [*a]")
    assert key == "run_note" and value == "&a [*a]"  # left as text for the type check


def test_a_huge_value_is_echoed_bounded(train_work, tmp_path):
    cfg = tmp_path / "big.json"
    cfg.write_text(json.dumps({"lr": [1] * 200_000}))  # 600 kB, under the 1 MiB cap
    line = _one_line(_launch(train_work, "--config", str(cfg)), "config field 'lr': got (1, 1,")
    assert "..." in line
    _no_trace(train_work)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_that_is_not_a_regular_file_is_one_line_not_a_hang(train_work, tmp_path, kind):
    cfg = tmp_path / "c.yaml"
    os.mkfifo(cfg) if kind == "fifo" else cfg.mkdir()
    line = _one_line(_launch(train_work, "--config", str(cfg), timeout=60),
                     f"config file {cfg}: cannot read (not a regular file")
    assert ("a FIFO" if kind == "fifo" else "a directory") in line
    _no_trace(train_work)


def test_a_model_too_large_to_allocate_is_refused_before_the_run_directory(train_work):
    proc = _launch(train_work, "--set", "d_model=1048576", "--set", "n_heads=8")
    line = _one_line(proc, "model shape d_model=1048576")
    assert "B of memory is available; expected a shape that fits" in line
    assert "Traceback" not in proc.stderr
    _no_trace(train_work)


def test_a_batch_larger_than_the_data_leaves_no_trace(train_work):
    proc = _launch(train_work, "--set", "batch_size=100000")
    _one_line(proc, "config field 'batch_size': 100000 exceeds the 1024 rows of the data")
    _no_trace(train_work)


def test_a_pulled_model_config_asking_for_a_huge_model_is_one_line(tmp_path):
    from aleph.model import ModelConfig, build_model
    from aleph.model.io import load_model, save_weights

    weights = save_weights(build_model(ModelConfig(arm="a2_dense", vocab_size=50, max_len=8,
                                                   d_model=16, n_layers=1, n_heads=2,
                                                   ffn_dense=32)), tmp_path / "w")
    cfg = json.loads((weights / "model_config.json").read_text())
    (weights / "model_config.json").write_text(json.dumps({**cfg, "d_model": 1 << 20,
                                                           "n_heads": 8}))
    with pytest.raises(ConfigError) as err:
        load_model(weights)
    assert str(err.value).startswith(f"{weights}/model_config.json: model shape d_model=1048576")
    (weights / "model_config.json").unlink()
    os.mkfifo(weights / "model_config.json")
    with pytest.raises(Exception) as err:  # missing/unreadable: one line, never a hang
        load_model(weights)
    assert "model_config.json" in str(err.value) and "\n" not in str(err.value)


def _smoke_tokenizer(smoke_data_dir, tmp_path):
    tok = tmp_path / "tok"
    shutil.copytree(smoke_data_dir / "tokenizer", tok)
    return tok


def test_a_tokenizer_asking_for_its_own_code_is_refused_without_a_prompt(smoke_data_dir, tmp_path):
    tok = _smoke_tokenizer(smoke_data_dir, tmp_path)
    marker = tmp_path / "PWNED"
    (tok / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                 "from transformers import BertTokenizerFast as EvilTokenizer\n")
    conf = json.loads((tok / "tokenizer_config.json").read_text())
    conf["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    conf.pop("tokenizer_class")  # no local class to fall back on: transformers would prompt
    (tok / "tokenizer_config.json").write_text(json.dumps(conf))
    code = ("import sys; from aleph.data.tokenizer import load_tokenizer\n"
            f"load_tokenizer({str(tok)!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          input="y\n")  # a "y" waiting at a prompt
    assert not marker.exists(), "the tokenizer's own code ran"
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("aleph.errors.DataError")]
    assert "asks to run its own code (auto_map in its tokenizer_config.json): refused" in line
    assert "[y/N]" not in proc.stdout + proc.stderr
    with pytest.raises(DataError, match="asks to run its own code"):
        load_tokenizer(tok)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_tokenizer_file_that_is_not_regular_is_refused(smoke_data_dir, tmp_path, kind):
    tok = _smoke_tokenizer(smoke_data_dir, tmp_path)
    (tok / "tokenizer.json").unlink()
    if kind == "fifo":
        os.mkfifo(tok / "tokenizer.json")
    else:
        (tok / "tokenizer.json").symlink_to("/dev/zero")
    with pytest.raises(DataError, match="tokenizer.json is a (FIFO|character device); expected regular"):
        load_tokenizer(tok)


def test_targets_naming_a_fifo_is_named_as_one(tmp_path):
    """Issue 32: a FIFO given as targets= was 'does not exist'; it is named for what it is,
    and never opened (an open would block)."""
    import os

    from aleph.errors import ConfigError
    from aleph.train.preflight import expand_targets

    fifo = tmp_path / "targets.npy"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"targets.npy is a FIFO; expected a chunk file"):
        expand_targets([str(fifo)])
