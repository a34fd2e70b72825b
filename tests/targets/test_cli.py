"""`aleph targets build|verify|plan|info` through the real CLI entry point."""

from __future__ import annotations

import json

import pytest
import torch
from targets_helpers import save_chunk, store_bytes

from aleph.cli import main
from aleph.cli.targets import expand_sources
from aleph.errors import StoreError


def test_directory_sources_in_name_order_and_unpadded_numbers_refused(tmp_path, capsys):
    for i in ("10", "02", "01"):
        save_chunk(torch.full((2, 4), float(i), dtype=torch.float16), tmp_path / f"c_{i}.npy")
    (tmp_path / "notes.txt").write_text("ignored")
    assert [p.rsplit("/", 1)[1] for p in expand_sources([str(tmp_path)])] == ["c_01.npy", "c_02.npy", "c_10.npy"]
    # c_1, c_10, c_2: name order (the trainer's for a targets= directory) differs from number
    # order, so the rows' order is ambiguous: an error, never a store in another row order
    (tmp_path / "c_02.npy").rename(tmp_path / "c_2.npy")
    with pytest.raises(StoreError, match=r"c_10\.npy first\) and by number \(c_2\.npy first\)"):
        expand_sources([str(tmp_path)])
    assert main(["targets", "build", str(tmp_path), "--out", str(tmp_path / "s")]) == 2
    assert "zero-pad the numbers" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_build_info_verify_roundtrip(make_chunks, tmp_path, work, capsys):
    paths, ref = make_chunks(rows=(12, 9))
    assert main(["targets", "build", str(paths[0].parent)]) == 0
    out = capsys.readouterr().out
    store_dir = out.split(":")[0]
    assert store_dir.startswith(str(work / "cache" / "targets"))
    assert "21 x 8 float16" in out and "built by streaming" in out
    assert store_bytes(store_dir) == ref.numpy().tobytes()
    assert main(["targets", "info", store_dir]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == 21 and len(info["manifest_sha256"]) == 64
    assert main(["targets", "verify", store_dir, "--full"]) == 0
    assert "OK, full" in capsys.readouterr().out
    with open(f"{store_dir}/targets.bin", "r+b") as f:
        f.write(b"\x00\x01")
    assert main(["targets", "verify", store_dir]) == 0
    assert main(["targets", "verify", store_dir, "--full"]) == 2
    assert "chunk 0 (store rows 0..12" in capsys.readouterr().err


def test_plan_reads_the_cgroup_and_exit_code(make_chunks, tmp_path, capsys):
    paths, _ = make_chunks(rows=(50, 50), dim=16)  # 3,200 B store in two 1,600 B chunks
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("memory\n")
    (cg / "memory.max").write_text("5000\n")
    assert main(["targets", "plan", *map(str, paths), "--cgroup-root", str(cg), "--headroom", "0"]) == 0
    out = capsys.readouterr().out
    assert "memory quota: 5,000 B" in out and "in_ram    predicted peak 6,400 B" in out
    assert "streaming predicted peak 3,200 B (0.00 GiB): fits" in out
    assert "REFUSED" in out and "choice: streaming" in out
    assert main(["targets", "plan", *map(str, paths), "--quota", "100", "--headroom", "0"]) == 1


def test_build_in_ram_refused_by_quota(make_chunks, tmp_path, capsys):
    paths, _ = make_chunks(rows=(100,), dim=16)
    rc = main(["targets", "build", *map(str, paths), "--out", str(tmp_path / "s"),
               "--implementation", "in_ram", "--quota", "5000", "--headroom", "0"])
    assert rc == 2
    assert "'in_ram' refused: " in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_bad_input_exit_code_names_the_file(tmp_path, capsys):
    (tmp_path / "bad.pt").write_bytes(b"junk")
    assert main(["targets", "build", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "s")]) == 2
    assert "bad.pt: unreadable .pt" in capsys.readouterr().err


def test_verify_sources_catches_a_chunk_edited_with_size_and_mtime_kept(make_chunks, tmp_path,
                                                                         capsys):
    """The store cache keys on (path, size, mtime): an in-place edit that keeps both is reused
    stale, and --full passes (the store agrees with its own manifest). --sources re-reads
    the chunks and compares them with the store's bytes, range by range."""
    import os

    paths, ref = make_chunks(rows=(12, 9, 7))  # .pt, .npy, .safetensors
    out = tmp_path / "s"
    assert main(["targets", "build", *map(str, paths), "--out", str(out)]) == 0
    assert main(["targets", "verify", str(out), "--sources"]) == 0
    assert "OK, sources (every chunk range re-hashed and equal to its source chunk)" in \
        capsys.readouterr().out
    edited = paths[0]  # the .pt (E1's chunk format): new values, same shape, same size
    st = edited.stat()
    save_chunk(ref[:12] * -1, edited)
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (edited.stat().st_size, edited.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert main(["targets", "build", *map(str, paths), "--out", str(out)]) == 0  # stale cache hit
    assert store_bytes(out) == ref.numpy().tobytes()
    assert main(["targets", "verify", str(out)]) == 0
    assert main(["targets", "verify", str(out), "--full"]) == 0
    capsys.readouterr()
    assert main(["targets", "verify", str(out), "--sources"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "1 chunk range(s) differ from their source chunk" in err
    assert f"chunk 0 (store rows 0..12, from {edited}): source rows sha256" in err
    assert "chunk 1" not in err and "chunk 2" not in err
    # a source that is gone is named too
    paths[2].unlink()
    assert main(["targets", "verify", str(out), "--sources"]) == 2
    assert f"chunk 2 (store rows 21..28, from {paths[2]}): source unusable: " in capsys.readouterr().err


def test_verify_help_says_what_each_level_catches(capsys):
    with pytest.raises(SystemExit):
        main(["targets", "verify", "--help"])
    text = capsys.readouterr().out
    for level in ("quick ", "--full ", "--sources "):
        assert f"\n  {level}" in text
    assert "even with size and mtime kept" in text and "Misses:" in text


def test_a_chunk_directory_given_to_verify_info_and_probes_is_its_built_store(make_chunks, work, capsys):
    paths, _ = make_chunks(rows=(12, 9))
    chunks = paths[0].parent
    # not built yet: the error names the build command and the path it writes, no loop
    assert main(["targets", "verify", str(chunks)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"aleph targets: error: {chunks} is a chunk directory, not a target store; "
                          f"its store {work / 'cache' / 'targets'}/")
    assert err.endswith(f" does not exist yet: run `aleph targets build {chunks}` to build it there, "
                        "then pass either path")
    assert "no manifest" not in err
    assert main(["targets", "build", str(chunks)]) == 0
    store_dir = capsys.readouterr().out.splitlines()[-1].split(":")[0]
    assert main(["targets", "verify", str(chunks), "--full"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{store_dir} (the store of chunk directory {chunks}): OK, full")
    assert main(["targets", "info", str(chunks)]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 21
    from aleph.eval.probe_data import _load_targets

    assert _load_targets(chunks, 5).shape == (5, 8)  # eval --probe-targets takes it too


def test_a_sigterm_while_build_writes_exits_76_in_one_line_and_the_rerun_resumes(
        make_chunks, tmp_path, capsys, monkeypatch):
    """Two SIGTERMs (as Slurm sends) after the first chunk is recorded: exit 76, one line
    naming the command that resumes; that command completes the store."""
    import signal

    from aleph.targets import build_streaming

    paths, ref = make_chunks(rows=(12, 9))

    def stop_at(name, index=0):
        if (name, index) == ("recorded", 0):
            signal.raise_signal(signal.SIGTERM)  # the handler runs before this returns
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(build_streaming, "fault_point", stop_at)
    out = tmp_path / "s"
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # without a handler: not a death here
    try:
        rc = main(["targets", "build", str(paths[0].parent), "--out", str(out)])
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    lines = capsys.readouterr().out.splitlines()
    assert rc == 76 and len(lines) == 1, (rc, lines)
    assert lines[0].startswith(f"aleph targets build: stopped by SIGTERM before the store was "
                               f"complete: {out} holds the unfinished build"), lines
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    again = lines[0].split("resume with: aleph ", 1)[1].split()
    assert main(again) == 0
    assert store_bytes(out) == ref.numpy().tobytes()
