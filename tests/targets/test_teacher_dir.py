"""Teacher directories someone handed over: code they ask transformers to run, FIFOs and
devices as tokenizer files, links out of the directory, JSON nested 100k deep, a model type
transformers does not know. `targets extract` refuses each before anything is loaded, in one
line; the payload's marker file stays absent even with `y` on stdin."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from test_extract import run_teacher, teacher_python

from aleph.errors import ConfigError
from aleph.targets.extract import resolve
from aleph.targets.teacher_dir import check_model_dir
from aleph.targets.teachers import TeacherSpec

KNOWN = frozenset({"bert", "roberta"})
PAYLOAD = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def plain_teacher(d, config: dict | None = None):
    """A directory shaped like a saved BERT (the checks read no weights)."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config or {"model_type": "bert"}))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    (d / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    return d


def code_teacher(d, marker):
    """A directory whose auto_map asks transformers to import evil.py, which writes `marker`."""
    plain_teacher(d, {"model_type": "aleph-evil",
                      "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}})
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]},
         "tokenizer_class": "EvilTokenizer"}))
    (d / "evil.py").write_text(PAYLOAD.format(marker=str(marker)))
    return d


def extract(tmp_path, teacher, stdin: str = "", timeout: float = 120):
    """`aleph targets extract` of `teacher` in the teacher venv; (exit code, stderr)."""
    caps = tmp_path / "caps.txt"
    caps.write_text("a dog runs\na cat sleeps\n")
    proc = run_teacher(["-m", "aleph", "targets", "extract", "--captions", str(caps), "--out",
                        str(tmp_path / "out"), "--teachers", str(teacher)],
                       {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
                       stdin=subprocess.PIPE)
    try:
        _, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"extract still running after {timeout} s (blocked on the teacher dir)")
    return proc.returncode, err


def one_line(code: int, err: str, *parts: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err[-3000:])
    for p in parts:
        assert p in lines[0], (p, lines[0])
    return lines[0]


def test_a_teacher_asking_to_run_its_code_is_refused_whatever_stdin_holds(tmp_path):
    teacher_python()
    marker = tmp_path / "payload-ran"
    teacher = code_teacher(tmp_path / "evil-teacher", marker)
    code, err = extract(tmp_path, teacher, stdin="y\n" * 20)
    assert not marker.exists(), "the teacher directory's code ran"
    line = one_line(code, err, f"teacher directory {teacher}", "auto_map",
                    "refused before anything of it was loaded")
    print(line)
    assert not (tmp_path / "out").exists()


def test_a_fifo_named_tokenizer_json_is_refused_without_opening_it(tmp_path):
    teacher_python()
    teacher = plain_teacher(tmp_path / "t")
    (teacher / "tokenizer.json").unlink()
    os.mkfifo(teacher / "tokenizer.json")
    code, err = extract(tmp_path, teacher, timeout=60)
    print(one_line(code, err, "tokenizer.json is a FIFO; expected a regular file"))


def _refusal(path, blobs=None) -> str:
    with pytest.raises(ConfigError) as e:
        check_model_dir(str(path), KNOWN, blobs=blobs)
    msg = str(e.value)
    assert "\n" not in msg and f"teacher directory {path}" in msg
    return msg


def test_a_link_to_dev_zero_as_tokenizer_json_is_refused(tmp_path):
    teacher = plain_teacher(tmp_path / "t")
    (teacher / "tokenizer.json").unlink()
    (teacher / "tokenizer.json").symlink_to("/dev/zero")
    assert "tokenizer.json is a symbolic link to '/dev/zero'" in _refusal(teacher)


def test_weights_linking_out_of_the_directory_are_refused_and_never_hashed(tmp_path):
    """The plan would have recorded the outside file's sha256 as the teacher's weights."""
    outside = tmp_path / "someone-elses.bin"
    outside.write_bytes(b"not yours")
    teacher = plain_teacher(tmp_path / "t")
    (teacher / "model.safetensors").unlink()
    (teacher / "model.safetensors").symlink_to(outside)
    with pytest.raises(ConfigError, match="model.safetensors is a symbolic link to .*someone-"):
        resolve(TeacherSpec(str(teacher), None, True), set(KNOWN))


def test_a_hub_snapshot_may_link_into_its_blobs_and_nowhere_else(tmp_path):
    blobs = tmp_path / "models--me--t" / "blobs"
    blobs.mkdir(parents=True)
    snap = tmp_path / "models--me--t" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for name, data in {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"w"}.items():
        (blobs / name.replace(".", "-")).write_bytes(data)
        (snap / name).symlink_to(blobs / name.replace(".", "-"))
    got = check_model_dir(str(snap), KNOWN, blobs=str(blobs))
    assert got.config == {"model_type": "bert"} and sorted(got.files_sha256) == [
        "config.json", "model.safetensors"]
    (snap / "vocab.txt").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere.txt").write_text("x")
    assert "vocab.txt is a symbolic link to" in _refusal(snap, blobs=str(blobs))


@pytest.mark.parametrize("name,text,expected", [
    ("config.json", "[" * 100_000 + "]" * 100_000, "config.json: JSON nested too deeply"),
    ("config.json", "[]", "config.json is a JSON list, expected an object"),
    ("config.json", '{"model_type": "aleph-evil"}', "model_type 'aleph-evil' is not a model type"),
    ("tokenizer_config.json", '{"auto_map": {"AutoTokenizer": ["x.T", null]}}', "auto_map"),
    ("preprocessor_config.json", '{"auto_map": {"AutoProcessor": "x.P"}}', "auto_map"),
], ids=["config nested 100k deep", "config a list", "unknown model_type",
        "tokenizer auto_map", "any json's auto_map"])
def test_json_that_is_not_a_plain_config_is_one_line(tmp_path, name, text, expected):
    teacher = plain_teacher(tmp_path / "t")
    (teacher / name).write_text(text)
    assert expected in _refusal(teacher)


def test_a_plain_teacher_passes_with_every_file_hashed(tmp_path):
    teacher = plain_teacher(tmp_path / "t")
    (teacher / "sub").mkdir()  # not read by the loaders: neither refused nor hashed
    got = check_model_dir(str(teacher), KNOWN)
    assert sorted(got.files_sha256) == ["config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"]
