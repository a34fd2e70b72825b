"""Config: presets, files, overrides, errors that name the field, redaction, resume checks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aleph.errors import ConfigError
from aleph.train.config import PRESETS, check_same_run, echo, resolve, to_dict

E1_SOURCES = ["captions=/data/cc12m.parquet", "targets=/data/t/a.pt,/data/t/b.pt"]


def test_e1_preset_is_the_published_shape():
    cfg = resolve("e1", overrides=E1_SOURCES, arm="a1_anchored", seed=1)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.ffn_dense, cfg.epochs) == (12, 512, 8, 2048, 4)
    assert (cfg.ffn_expert, cfg.n_anchors, cfg.address_tau) == (512, 3, 0.1)
    assert cfg.targets == ("/data/t/a.pt", "/data/t/b.pt")
    assert cfg.store_implementation == "auto"


def test_e1_without_sources_names_the_field():
    with pytest.raises(ConfigError, match="'captions'"):
        resolve("e1", arm="a2_dense")
    with pytest.raises(ConfigError, match="'tokenizer'"):
        resolve("e1", overrides=[*E1_SOURCES, "tokenizer="], arm="a2_dense")


@pytest.mark.parametrize("override,field", [
    ("bogus=1", "bogus"), ("batch_size=0", "batch_size"), ("batch_size=abc", "batch_size"),
    ("n_heads=7", "n_heads"), ("keep_checkpoints=1", "keep_checkpoints"),
    ("store_implementation=mmap", "store_implementation"), ("dropout=1.5", "dropout"),
    ("alloc_cap_fraction=1.5", "alloc_cap_fraction"), ("captions=x.txt", "captions"),
    ("compile=yes please", "compile"), ("lr=-1", "lr"), ("deterministic=1", "deterministic"),
    ("init=xavier", "init"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=f"'?{field}'?"):
        resolve("smoke", overrides=[override], arm="a2_dense")


def test_compile_with_checkpointing_is_refused_citing_torch_24():
    with pytest.raises(ConfigError, match=r"exclusive.*torch 2\.4.*compile=false or checkpointing=false"):
        resolve("smoke", overrides=["compile=true", "checkpointing=true"], arm="a2_dense")
    assert resolve("smoke", overrides=["compile=true"], arm="a2_dense").compile


def test_unknown_arm():
    with pytest.raises(ConfigError, match="'arm'.*a1_anchored, a2_dense, a3_random"):
        resolve("smoke", arm="splat")


def test_yaml_and_json_files(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("lr: 1.0e-3\nbetas: [0.8, 0.9]\nepochs: 3\n")
    cfg = resolve("smoke", file=str(y), overrides=["epochs=5"], arm="a3_random", seed=2)
    assert (cfg.lr, cfg.betas, cfg.epochs, cfg.seed) == (1e-3, (0.8, 0.9), 5, 2)
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"d_model": 96, "typo_field": 1}))
    with pytest.raises(ConfigError, match=f"config file {j}: unknown config field.*typo_field"):
        resolve("smoke", file=str(j), arm="a2_dense")
    j.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid json"):
        resolve("smoke", file=str(j), arm="a2_dense")


def test_secrets_are_redacted():
    cfg = resolve("smoke", overrides=["hf_token=hf_abc"], arm="a2_dense")
    assert cfg.hf_token == "hf_abc"
    assert "hf_abc" not in echo(cfg)
    assert to_dict(cfg)["hf_token"] == "<redacted>"
    assert to_dict(cfg, redact=False)["hf_token"] == "hf_abc"


def test_resume_compatibility():
    saved = to_dict(resolve("smoke", arm="a2_dense"))
    check_same_run(saved, resolve("smoke", overrides=["log_every_steps=1", "hf_token=x"], arm="a2_dense"))
    with pytest.raises(ConfigError, match="batch_size: run has 64, launch asks 32"):
        check_same_run(saved, resolve("smoke", overrides=["batch_size=32"], arm="a2_dense"))
    with pytest.raises(ConfigError, match="init: run has 'e1_orthogonal', launch asks 'normal_0.02'"):
        check_same_run(saved, resolve("smoke", overrides=["init=normal_0.02"], arm="a2_dense"))


def test_init_field_is_checked_and_reaches_the_model_config():
    from aleph.model.config import INIT_SCHEMES
    from aleph.train.config import model_config

    with pytest.raises(ConfigError) as e:
        resolve("smoke", overrides=["init=orthogonal"], arm="a1_anchored")
    assert "'init'" in str(e.value) and all(s in str(e.value) for s in INIT_SCHEMES)
    for init in INIT_SCHEMES:
        cfg = resolve("smoke", overrides=[f"init={init}"], arm="a1_anchored")
        assert to_dict(cfg)["init"] == init  # what config.json records
        assert model_config(cfg, vocab_size=50, pad_id=0).init == init


@pytest.mark.parametrize("version", [None, 2])
def test_a_run_config_of_another_format_version_is_refused_in_one_line(tmp_path, version):
    """config.json of another format_version (or none: a run recorded before versions, e.g.
    without the init field) is refused in one line, and left as it was."""
    import json

    from aleph.errors import StoreError
    from aleph.train.run import _check_config

    cfg = resolve("smoke", arm="a1_anchored")
    saved = to_dict(cfg)
    del saved["init"]
    if version is not None:
        saved["format_version"] = version
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(StoreError) as e:
        _check_config(tmp_path, cfg, print)
    assert str(e.value) == (f"{tmp_path / 'config.json'}: format_version {version}, expected 1 "
                            "(written by another version of aleph-e1; this one reads only its own)")
    assert json.loads((tmp_path / "config.json").read_text()) == saved
    (tmp_path / "new").mkdir()
    _check_config(tmp_path / "new", cfg, print)  # a new run's config.json: version 1 written
    assert json.loads((tmp_path / "new" / "config.json").read_text())["format_version"] == 1


def test_every_field_is_documented():
    import ast
    import inspect

    from aleph.train import config

    tree = ast.parse(inspect.getsource(config.TrainConfig))
    body = tree.body[0].body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), node.target.id
    assert set(PRESETS) == {"e1", "smoke"}


def test_cli_refuses_before_any_work(work):
    proc = subprocess.run([sys.executable, "-m", "aleph", "train", "--arm", "a2_dense",
                           "--preset", "smoke", "--set", "epochs=0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "config field 'epochs': got 0, expected a positive integer" in proc.stderr
    assert list(work.iterdir()) == []  # nothing written: no run dir, no smoke data


def test_set_parses_values_by_the_field_type():
    # PyYAML reads "1e-3" as a string: float fields must still get the number
    cfg = resolve("smoke", arm="a2_dense", overrides=[
        "lr=1e-3", "tau=7E-2", "eps=1e-6", "betas=0.8,0.95", "alloc_cap_fraction=null",
        "captions_column=2024", "hf_token=12345", "epochs=3", "deterministic=false"])
    assert (cfg.lr, cfg.tau, cfg.eps, cfg.betas) == (1e-3, 0.07, 1e-6, (0.8, 0.95))
    assert cfg.alloc_cap_fraction is None and cfg.epochs == 3 and cfg.deterministic is False
    assert cfg.captions_column == "2024" and cfg.hf_token == "12345"
    assert resolve("smoke", arm="a2_dense", overrides=["hf_token=null"]).hf_token is None
    assert resolve("smoke", arm="a2_dense", overrides=["betas=[0.5, 0.6]"]).betas == (0.5, 0.6)
    with pytest.raises(ConfigError, match="'batch_size'"):  # an int field takes no float spelling
        resolve("smoke", arm="a2_dense", overrides=["batch_size=1e3"])


def test_yaml_file_float_in_exponent_form(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("lr: 5e-4\nmin_lr_ratio: 1e-2\n")
    cfg = resolve("smoke", file=str(y), arm="a2_dense")
    assert (cfg.lr, cfg.min_lr_ratio) == (5e-4, 0.01)


def test_every_model_field_comes_from_the_config_or_the_data():
    import dataclasses

    from aleph.model.config import ModelConfig
    from aleph.train.config import MODEL_FIELDS_FROM_DATA, TrainConfig, model_config

    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unmapped = {f.name for f in dataclasses.fields(ModelConfig)} - train_fields - set(
        MODEL_FIELDS_FROM_DATA)
    assert unmapped == set()
    cfg = resolve("smoke", overrides=["d_model=32", "n_heads=2", "dropout=0.25"], arm="a3_random")
    m = model_config(cfg, vocab_size=123, pad_id=0)
    assert (m.arm, m.d_model, m.n_heads, m.dropout, m.vocab_size, m.out_dim) == (
        "a3_random", 32, 2, 0.25, 123, 768)


@pytest.mark.parametrize("override,field", [
    ("lr=.inf", "lr"), ("lr=.nan", "lr"), ("weight_decay=.nan", "weight_decay"),
    ("grad_clip=.inf", "grad_clip"), ("betas=[0.9, .nan]", "betas"),
    ("ckpt_every_minutes=.inf", "ckpt_every_minutes"),
])
def test_non_finite_numbers_are_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=rf"^config field '{field}': got .*(inf|nan).*, "
                       r"expected a finite number$"):
        resolve("smoke", overrides=[override], arm="a2_dense")


def test_invalid_config_file_is_one_line_naming_file_line_and_column(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("lr: 1.0e-3\nbetas: [0.9, 0.99\nepochs: 3\n")
    with pytest.raises(ConfigError) as e:
        resolve("smoke", file=str(y), arm="a2_dense")
    assert str(e.value) == (f"config file {y}: not valid yaml at line 3, column 7: expected ',' "
                            "or ']', but got ':' (while parsing a flow sequence)")
    y.write_text("lr: 1\n\tepochs: 3\n")
    with pytest.raises(ConfigError, match=rf"^config file {y}: not valid yaml at line 2, column 1: "
                       r"found character '\\t' that cannot start any token"):
        resolve("smoke", file=str(y), arm="a2_dense")
    j = tmp_path / "c.json"
    j.write_text('{"lr": 0.001,\n "epochs" 3}')
    with pytest.raises(ConfigError) as e:
        resolve("smoke", file=str(j), arm="a2_dense")
    assert str(e.value) == f"config file {j}: not valid json at line 2, column 11: Expecting ':' delimiter"


def test_every_float_field_given_as_an_int_becomes_a_float(tmp_path):
    # torch 2.4.1's set_per_process_memory_fraction raises TypeError on an int: the config
    # hands every float field on as a Python float, however it was written.
    from dataclasses import fields

    from aleph.train.config import TrainConfig

    floats = [f.name for f in fields(TrainConfig) if f.type in ("float", "float | None")]
    assert "alloc_cap_fraction" in floats and len(floats) > 10
    for name in floats:
        for number in (1, 0, 2):  # the first int the field's range accepts
            y = tmp_path / "c.yaml"
            y.write_text(f"{name}: {number}\n")
            try:
                via_set = resolve("smoke", overrides=[f"{name}={number}"], arm="a2_dense")
            except ConfigError:
                continue
            via_file = resolve("smoke", file=str(y), arm="a2_dense")
            for cfg in (via_set, via_file):
                value = getattr(cfg, name)
                assert type(value) is float and value == number, (name, value)
            break
        else:
            raise AssertionError(f"no int in 0, 1, 2 is valid for {name}")
    cfg = resolve("smoke", overrides=["betas=[0, 0]"], arm="a2_dense")
    assert [type(b) for b in cfg.betas] == [float, float]
    assert type(resolve("smoke", overrides=["epochs=3"], arm="a2_dense").epochs) is int


def test_help_lists_every_field_with_type_and_default(capsys):
    """`aleph train --help` documents each config field: name, type, default, first line."""
    import typing
    from dataclasses import fields

    from aleph._fields import type_text
    from aleph.cli import main
    from aleph.train.config import TrainConfig
    from aleph.train.config_text import field_docs

    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    docs, hints = field_docs(TrainConfig), typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        assert f"  {f.name} ({type_text(hints[f.name])}) = {f.default!r}" in out, f.name
        assert docs[f.name].split(". ")[0][:40] in out, f.name  # its docstring's first line
    assert "  warmup_steps (int) = 2000 [smoke: 20]" in out  # the smoke preset's value beside it
    assert "  arm (one of a1_anchored, a2_dense, a3_random) = 'a2_dense'" in out
    assert "  alloc_cap_fraction (float | None) = None" in out
    assert "--name NAME" in out


@pytest.mark.parametrize("typo,field", [("warmup_step", "warmup_steps"), ("batchsize", "batch_size"),
                                        ("captons", "captions")])
def test_a_set_typo_suggests_the_field(typo, field):
    with pytest.raises(ConfigError, match=rf"--set: unknown config field\(s\) {typo} "
                                          rf"\(did you mean '{field}'\?\); `aleph train --help`"):
        resolve("smoke", overrides=[f"{typo}=1"], arm="a2_dense")
    with pytest.raises(ConfigError) as e:  # nothing close: no suggestion
        resolve("smoke", overrides=["zzzz=1"], arm="a2_dense")
    assert "did you mean" not in str(e.value)


def test_run_names_by_preset_and_name():
    from aleph.train.identity import check_run_name, run_dir_for, run_name

    assert run_name("e1", "a1_anchored", 1) == "a1_anchored-s1"  # the seed's names
    assert run_name("smoke", "a2_dense", 0) == "smoke/a2_dense-s0"
    smoke = resolve("smoke", arm="a2_dense")
    assert run_dir_for(smoke).parts[-3:] == ("runs", "smoke", "a2_dense-s0")
    assert run_dir_for(smoke, "my-a2").parts[-2:] == ("runs", "my-a2")
    assert check_run_name("grid/lr-1e-3_a2") == "grid/lr-1e-3_a2"
    for bad in ("../x", "/abs/run", "a/b/c", "", ".hidden", "a b", "x/..", "smoke/"):
        with pytest.raises(ConfigError, match=f"--name {bad!r}: expected a run name relative"):
            check_run_name(bad)


def test_a_run_name_never_nests_one_run_inside_another(tmp_path, monkeypatch):
    from aleph.train.identity import run_dir_for

    monkeypatch.setenv("ALEPH_WORK", str(tmp_path))
    smoke = resolve("smoke", arm="a2_dense")
    e1 = resolve("e1", arm="a2_dense", overrides=["captions=c.txt", "targets=t/"])
    for cfg in (smoke, e1):  # stand-ins for trained runs: each run directory has config.json
        run = run_dir_for(cfg)
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"runs/smoke is a folder of runs \(a2_dense-s0\)"):
        run_dir_for(e1, "smoke")
    with pytest.raises(ConfigError, match="runs/a2_dense-s0 is a run, and a run cannot live"):
        run_dir_for(e1, "a2_dense-s0/x")
    assert run_dir_for(e1, "smoke/x") == tmp_path / "runs" / "smoke" / "x"  # a new run beside
    assert run_dir_for(smoke) == tmp_path / "runs" / "smoke" / "a2_dense-s0"  # resumes as before


def test_every_field_declares_its_facts_where_it_is_declared():
    """resumable and basis on every field (knob); the derived lists agree with them."""
    from dataclasses import fields

    from aleph.model.config import ModelConfig
    from aleph.train.config import (
        MODEL_FIELDS_FROM_DATA,
        OPERATIONAL,
        RESUMABLE_CHANGES,
        SECRET_FIELDS,
        TrainConfig,
    )

    for f in fields(TrainConfig):
        assert {"resumable", "basis", "secret"} <= set(f.metadata), f"{f.name}: use knob(...)"
    assert {f.name for f in fields(TrainConfig) if f.metadata["resumable"]} == RESUMABLE_CHANGES
    assert "hf_token" in SECRET_FIELDS and "hf_token" in RESUMABLE_CHANGES & OPERATIONAL
    assert {"ckpt_every_steps", "device", "sync_to"} <= RESUMABLE_CHANGES
    assert {"lr", "d_model", "init", "batch_size"}.isdisjoint(RESUMABLE_CHANGES | OPERATIONAL)
    # the shape fields are ModelConfig's, not a copy: one more model field is one more here
    shape = {f.name for f in fields(ModelConfig)} - set(MODEL_FIELDS_FROM_DATA)
    assert shape <= {f.name for f in fields(TrainConfig)}
    model = {f.name: f for f in fields(ModelConfig)}
    for f in fields(TrainConfig):
        if f.name in model and f.name != "arm":
            assert f.type == model[f.name].type
            assert f.default == (0.1 if f.name == "dropout" else model[f.name].default), f.name
