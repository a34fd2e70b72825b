"""Preflight pieces that run without a GPU: target expansion, VRAM estimate, CPU paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aleph.errors import ConfigError, StoreError
from aleph.train.config import resolve
from aleph.train.distributed import World, check_divisible
from aleph.train.preflight import (
    apply_allocator_cap,
    captions_identity,
    estimate_vram_bytes,
    expand_targets,
    vram_probe,
)
from tests.train.conftest import smoke_dir


def test_target_directory_expands_in_name_order(tmp_path):
    for name in ("chunk-010.pt", "chunk-002.pt", "notes.txt", "chunk-001.npy"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.rsplit("/", 1)[1] for p in expand_targets((str(tmp_path),))] == [
        "chunk-001.npy", "chunk-002.pt", "chunk-010.pt"]
    with pytest.raises(ConfigError, match="'targets': .*missing.pt does not exist"):
        expand_targets((str(tmp_path / "missing.pt"),))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no"):
        expand_targets((str(empty),))
    # unpadded numbers: name order != number order; the trainer refuses, as `targets build` does
    unpadded = tmp_path / "unpadded"
    unpadded.mkdir()
    for name in ("chunk_2.pt", "chunk_10.pt"):
        (unpadded / name).write_bytes(b"x")
    with pytest.raises(ConfigError, match="'targets'.*zero-pad"):
        expand_targets((str(unpadded),))


def test_vram_estimate_scales_with_batch_split_and_checkpointing():
    e1 = resolve("e1", overrides=["captions=x", "targets=y"], arm="a2_dense")
    one, two = estimate_vram_bytes(e1, 54_000_000, 1), estimate_vram_bytes(e1, 54_000_000, 2)
    assert 8 << 30 < one < 12 << 30  # ~9.6 GiB for the E1 shape at batch 256
    assert two < one
    ck = resolve("e1", overrides=["captions=x", "targets=y", "checkpointing=true"], arm="a2_dense")
    assert estimate_vram_bytes(ck, 54_000_000, 1) < one / 3


def test_cpu_paths_say_what_was_not_done():
    cfg = resolve("smoke", overrides=["alloc_cap_fraction=0.5"], arm="a2_dense")
    assert apply_allocator_cap(cfg, torch.device("cpu")) == \
        "allocator cap: 0.5 requested, not applied (no CUDA)"
    assert vram_probe(cfg, torch.device("cpu"), 1 << 40) == "VRAM probe: skipped: no CUDA"


def test_global_batch_must_split_over_ranks():
    assert check_divisible(64, World(rank=1, size=4)) == 16
    with pytest.raises(ConfigError, match="'batch_size': 64 is the GLOBAL batch.*world size 3"):
        check_divisible(64, World(rank=0, size=3))


def test_captions_identity_changes_with_the_file(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("a\n")
    first = captions_identity(str(f))
    f.write_text("a\nb\n")
    assert captions_identity(str(f)) != first
    assert captions_identity("org/dataset") == {"dataset": "org/dataset"}


def test_smoke_sets_of_different_sizes_coexist_in_one_work_root(work):
    from aleph._io import read_json
    from aleph.train.preflight import resolve_sources

    small = resolve_sources(resolve("smoke", overrides=["smoke_rows=40"], arm="a2_dense"))
    large = resolve_sources(resolve("smoke", overrides=["smoke_rows=60"], arm="a2_dense"))
    assert small.captions == str(work / "data" / "smoke-40" / "captions.txt")
    assert large.captions == str(work / "data" / "smoke-60" / "captions.txt")
    # the second size did not replace the first: both sets are intact, with their own rows
    assert read_json(work / "data" / "smoke-40" / "smoke.json")["rows"] == 40
    assert read_json(work / "data" / "smoke-60" / "smoke.json")["rows"] == 60
    assert len(Path(small.captions).read_text().splitlines()) == 40
    stamp = (work / "data" / "smoke-40" / "smoke.json").stat().st_mtime_ns
    again = resolve_sources(resolve("smoke", overrides=["smoke_rows=40"], arm="a2_dense"))
    assert again == small  # reused, not rebuilt
    assert (work / "data" / "smoke-40" / "smoke.json").stat().st_mtime_ns == stamp


def test_training_and_aleph_data_tokens_share_one_token_store(work, capsys):
    from aleph.cli import main
    from aleph.train.preflight import prepare_tokens, resolve_sources

    cfg = resolve("smoke", overrides=["smoke_rows=40"], arm="a2_dense")
    src = resolve_sources(cfg)
    assert main(["data", "tokens", "--captions", src.captions, "--tokenizer", src.tokenizer,
                 "--max-len", str(cfg.max_len)]) == 0
    built_by_cli = Path(capsys.readouterr().out.split(":")[0])
    assert built_by_cli.parent == work / "cache" / "tokens"
    lines: list[str] = []
    from aleph.data.tokenizer import load_tokenizer

    store = prepare_tokens(cfg, src, load_tokenizer(src.tokenizer), lines.append)
    assert store.path == built_by_cli
    assert lines == [f"token store: cache hit {built_by_cli} (40 rows x {cfg.max_len})"]
    assert [p.name for p in (work / "cache" / "tokens").iterdir()] == [built_by_cli.name]
    manifest = json.loads((built_by_cli / "manifest.json").read_text())
    manifest["tokenizer_fingerprint"] = "another"
    (built_by_cli / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=rf"^token store {built_by_cli} was built from different "
                       r"\['tokenizer_fingerprint'\]; remove it \(a cache directory is rebuilt"):
        prepare_tokens(cfg, src, load_tokenizer(src.tokenizer), lines.append)  # tokens' own check


def test_captions_digest_is_memoised_by_the_files_identity(work, tmp_path):
    from aleph.data.tokens import captions_sha256
    from aleph.train.preflight import captions_digest

    f = tmp_path / "c.txt"
    f.write_text("a cat\na dog\n")
    loads: list[str] = []

    def load(source):
        loads.append(source)
        return Path(source).read_text().splitlines()

    digest, captions = captions_digest(str(f), load)
    assert (digest, captions) == (captions_sha256(["a cat", "a dog"]), ["a cat", "a dog"])
    assert captions_digest(str(f), load) == (digest, None) and len(loads) == 1  # memo hit
    f.write_text("a cat\na bird\n")  # new size/mtime: a new identity, hashed afresh
    assert captions_digest(str(f), load)[0] == captions_sha256(["a cat", "a bird"])
    assert len(loads) == 2


def test_captions_column_is_read_and_keys_the_memo(work, tmp_path):
    """A JSONL source whose text is under another field: the configured column is read, a
    wrong one is a DataError naming it, and the memo of one column never answers another."""
    import json

    from aleph.data.captions import load_captions
    from aleph.errors import DataError
    from aleph.train.preflight import captions_digest

    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps({"text": t, "caption": t.upper()}) + "\n"
                         for t in ("a cat", "a dog")))
    cfg = resolve("e1", overrides=[f"captions={f}", "captions_column=text",
                                   f"targets={tmp_path}"], arm="a2_dense")
    assert cfg.captions_column == "text"
    assert load_captions(str(f), column=cfg.captions_column) == ["a cat", "a dog"]
    assert captions_identity(str(f), "text") != captions_identity(str(f))
    by_text = captions_digest(str(f), lambda s: load_captions(s, column="text"), "text")[0]
    by_caption = captions_digest(str(f), lambda s: load_captions(s), "caption")[0]
    assert by_text != by_caption
    with pytest.raises(DataError, match="'body'"):
        load_captions(str(f), column="body")


def _inputs(work: Path) -> Path:
    """The tests' smoke data as plain input paths (smoke_data=false) under work/inputs."""
    import shutil

    data = work / "inputs"
    shutil.copytree(smoke_dir(work), data)
    return data


@pytest.mark.parametrize("case", ["captions missing", "captions empty", "row counts differ",
                                  "targets missing", "target chunk unreadable",
                                  "tokenizer missing"])
def test_refused_inputs_leave_no_run_directory(train_work, capsys, case):
    """Data-level refusals exit 2 with one line naming the input, before runs/<name>/ exists."""
    from aleph.cli import main

    data = _inputs(train_work)
    captions, targets, tok = data / "captions.txt", data / "targets", data / "tokenizer"
    if case == "captions missing":
        captions, want = data / "nope.txt", f"captions path {data / 'nope.txt'} does not exist"
    elif case == "captions empty":
        captions.write_text("")
        want = f"captions source {captions}: no rows"
    elif case == "row counts differ":
        captions.write_text("".join(captions.read_text().splitlines(True)[:1000]))
        want = f"row count mismatch: captions {captions} has 1000 rows but targets (1 chunk"
    elif case == "targets missing":
        targets, want = data / "gone", f"'targets': {data / 'gone'} does not exist"
    elif case == "target chunk unreadable":
        next(targets.glob("*.pt")).write_bytes(b"junk")
        want = ": unreadable .pt (truncated or not a torch.save file)"
    else:
        tok, want = data / "no-tok", f"tokenizer directory '{data / 'no-tok'}' does not exist"
    args = ["train", "--arm", "a2_dense", "--seed", "9", "--preset", "smoke", "--set",
            "smoke_data=false", "--set", f"captions={captions}", "--set", f"targets={targets}",
            "--set", f"tokenizer={tok}", "--set", "batch_size=32"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("aleph train: error: ") and "\n" not in err and want in err, err
    assert not (train_work / "runs").exists()


def test_refused_inputs_change_nothing_in_an_existing_run(train_work, capsys):
    from aleph.cli import main

    run_dir = train_work / "runs" / "smoke" / "a2_dense-s9"
    for rel, text in (("config.json", "{}\n"), ("manifest.json", '{"launches": []}\n'),
                      ("launches/x.log", "earlier\n"), ("checkpoints/step-00000003/COMPLETE", "x")):
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*")
              if p.is_file()}
    assert main(["train", "--arm", "a2_dense", "--seed", "9", "--preset", "smoke", "--set",
                 "smoke_data=false", "--set", f"captions={train_work / 'none.txt'}", "--set",
                 f"targets={smoke_dir(train_work) / 'targets'}", "--set",
                 f"tokenizer={smoke_dir(train_work) / 'tokenizer'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def _e1_config(data: Path, targets: Path, *sets: str):
    return resolve("e1", arm="a2_dense", overrides=[
        f"captions={data / 'captions.txt'}", f"targets={targets}",
        f"tokenizer={data / 'tokenizer'}", "batch_size=32", *sets])


def test_e1_refuses_targets_of_another_width_unless_set_on_purpose(train_work):
    """All chunks 512 wide: the e1 preset wants E1's 768 unless target_dim says 512."""
    import numpy as np

    from aleph.errors import DataError
    from aleph.train.preflight import check_inputs

    data = _inputs(train_work)
    narrow = data / "narrow"
    narrow.mkdir()
    np.save(narrow / "chunk-000.npy", np.zeros((1024, 512), np.float16))
    with pytest.raises(DataError, match=rf"targets {narrow / 'chunk-000.npy'} \(1 chunk file\(s\)\): "
                                        r"512 wide, expected 768 \(the e1 preset expects"):
        check_inputs(_e1_config(data, narrow))
    lines: list[str] = []
    # on purpose; all-zero targets pair with nothing, so the alignment check is overridden
    check_inputs(_e1_config(data, narrow, "target_dim=512", "allow_misaligned=true"),
                 say=lines.append)
    assert "inputs: targets: 1,024 rows x 512" in lines
    assert lines[-1].startswith("inputs: OK: 1,024 captions = 1,024 target rows")
    with pytest.raises(DataError, match="512 wide, expected 640 \\(config field 'target_dim' is 640"):
        check_inputs(_e1_config(data, narrow, "target_dim=640"))
    check_inputs(resolve("smoke", arm="a2_dense", overrides=[  # other presets: any width
        "smoke_data=false", f"captions={data / 'captions.txt'}", f"targets={narrow}",
        f"tokenizer={data / 'tokenizer'}"]))
    assert not (train_work / "runs").exists()


def test_a_missing_captions_path_is_named_before_a_config_mismatch(train_work, capsys):
    """An e1 launch into an existing, trained run with another config and captions that do
    not exist: the error is the captions path, not a list of config differences."""
    from aleph.cli import main

    data = _inputs(train_work)
    run_dir = train_work / "runs" / "a2_dense-s3"  # e1: the seed's name, no preset level
    (run_dir / "checkpoints" / "step-00000003").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-00000003" / "COMPLETE").write_text("x")
    (run_dir / "config.json").write_text('{"arm": "a2_dense", "seed": 3, "lr": 9.0}\n')
    missing = "/nonexistent-h12/cc12m.parquet"
    assert main(["train", "--arm", "a2_dense", "--seed", "3", "--set", f"captions={missing}",
                 "--set", f"targets={data / 'targets'}", "--set", f"tokenizer={data / 'tokenizer'}"]) == 2
    out = capsys.readouterr()
    assert f"aleph train: run a2_dense-s3 in {run_dir}; checking the inputs first" in out.out
    assert out.err.strip() == (f"aleph train: error: captions path {missing} does not exist (config "
                               "field 'captions'; expected a .txt/.jsonl/.json/.parquet/.gz file or a HF "
                               "dataset id)")


def test_hashing_a_caption_source_reports_rows_share_and_eta(work, tmp_path, monkeypatch):
    from aleph.data.captions import open_captions
    from aleph.train import preflight

    monkeypatch.setattr(preflight, "TICK_SECONDS", 0.0)  # every batch reports (E1: every 10 s)
    f = tmp_path / "caps.txt"
    f.write_text("a cat\na dog\na bird\n")
    lines: list[str] = []
    preflight.captions_digest(str(f), open_captions, say=lines.append)
    assert lines[0] == f"inputs: captions {f}: hashing (once per file; memoised for later launches) ..."
    assert lines[1].startswith("inputs: captions hashed: 3 of 3 rows (100%), 0 s, ETA 0 s")
    lines.clear()
    preflight.captions_digest(str(f), open_captions, say=lines.append)  # memo hit: one line
    assert len(lines) == 1 and lines[0].startswith(f"inputs: captions {f}: content hash memoised")


def test_an_e1_launch_without_a_usable_cuda_device_is_refused_in_one_line(train_work, capsys):
    """device=auto would quietly train E1 on the CPU for months; device=cpu says so on purpose."""
    import torch

    from aleph.cli import main
    from aleph.train.preflight import check_e1_device

    if torch.cuda.is_available():
        pytest.skip("a usable CUDA device is present")
    data = smoke_dir(train_work)
    assert main(["train", "--arm", "a2_dense", "--seed", "3", "--set",
                 f"captions={data / 'captions.txt'}", "--set", f"targets={data / 'targets'}",
                 "--set", f"tokenizer={data / 'tokenizer'}", "--set", "batch_size=32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aleph train: error: config field 'device': 'auto' "
                                               "found no usable CUDA device (")
    assert "--set device=cpu to train on the CPU on purpose" in err[0]
    assert not (train_work / "runs").exists()
    check_e1_device(_e1_config(data, data / "targets", "device=cpu"), wants_cuda=False)
    check_e1_device(resolve("smoke", arm="a2_dense"), wants_cuda=False)  # only e1 is refused
