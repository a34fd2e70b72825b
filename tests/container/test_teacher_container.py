"""The teacher image, CPU variant, in the container tier: it builds on the CPU image (the torch
layers shared, only the teacher set's own three wheels added, offline) and extracts a tiny set
of captions with tiny random teachers of the five architectures into a consensus target
directory that the CPU image's target store reads."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO, _import_dir, _run, _scratch_dir, image_exists

pytestmark = pytest.mark.container
TEACHERS_IMAGE = "aleph-e1:teachers-cpu-ci"
ARCHS = ("tiny-albert", "tiny-bert", "tiny-distilbert", "tiny-modernbert", "tiny-roberta")


def _own_entries() -> str:
    """The requirements of teachers.txt that host.txt does not hold at the same version."""
    def entries(name):
        lines, out = (REPO / "lockfiles" / name).read_text().splitlines(), {}
        for i, line in enumerate(lines):
            if "==" in line and not line.startswith("#"):
                out[line.split(" ")[0]] = line + "\n" + lines[i + 1] + "\n"
        return out

    host, teachers = entries("host.txt"), entries("teachers.txt")
    return "".join(v for k, v in sorted(teachers.items()) if k not in host)


@pytest.fixture(scope="module")
def teacher_wheels(engine) -> str:
    """Those wheels (hash-checked by pip download) as an image, for the offline build."""
    reqs = _own_entries()
    assert reqs.count("==") == 3, reqs  # transformers, tokenizers, huggingface_hub
    tag = f"aleph-teacher-wheels:{hashlib.sha256(reqs.encode()).hexdigest()[:16]}"
    if image_exists(tag):
        return tag
    d = _scratch_dir()
    try:
        (d.parent / f"{d.name}.txt").write_text(reqs)
        _run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
              "download", "-q", "--require-hashes", "--no-deps", "--only-binary", ":all:",
              "-r", str(d.parent / f"{d.name}.txt"), "-d", str(d)],
             env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, timeout=600)
        _import_dir(d, tag)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        (d.parent / f"{d.name}.txt").unlink(missing_ok=True)
    return tag


def test_teacher_cpu_image_builds_on_the_cpu_image_and_extracts_a_tiny_set(stack, teacher_wheels):
    env = {"ALEPH_WHEELS_IMAGE": teacher_wheels, "ALEPH_TEACHERS_CPU_IMAGE": TEACHERS_IMAGE,
           "ALEPH_CAPTIONS": "/workspace/tiny/caps.txt",
           "ALEPH_TEACHERS": ",".join(f"/workspace/tiny/models/{a}" for a in ARCHS),
           "ALEPH_TEACHER_OUT": "/workspace/tiny/teachers", "ALEPH_TARGETS": "/workspace/tiny/targets"}
    t0 = time.monotonic()
    stack.compose("--profile", "targets", "build", "extract-targets", extra_env=env, timeout=1200)
    built = time.monotonic()
    make = ("mkdir -p /workspace/tiny && python3 -c \"import random; r = random.Random(0); "
            "w = 'a dog cat runs on the green grass near big red house'.split(); "
            "print('\\n'.join(' '.join(r.choice(w) for _ in range(r.randint(2, 30))) "
            "for _ in range(300)))\" > /workspace/tiny/caps.txt && python3 "
            "/opt/aleph/tests/targets/tiny_teachers.py build /workspace/tiny/models "
            "/workspace/tiny/caps.txt")
    stack.compose("--profile", "targets", "run", "--rm", "extract-targets", "sh", "-c", make,
                  extra_env=env, timeout=900)
    p = stack.compose("--profile", "targets", "run", "--rm", "extract-targets", extra_env=env,
                      timeout=900)
    ran = time.monotonic()
    assert "estimate: 300 rows x 5 teachers" in p.stderr, p.stderr[-3000:]
    assert "/workspace/tiny/targets: 300 x 32 float16 consensus targets of 5 teachers" in p.stdout
    out = stack.on_volume("python3 -m aleph targets build /workspace/tiny/targets --out /tmp/s")
    assert ": 300 x 32 float16" in out, out
    print(f"teacher CPU image: build {built - t0:.0f} s, tiny extraction + consensus "
          f"{ran - built:.0f} s")
    subprocess.run(["docker", "image", "rm", TEACHERS_IMAGE], capture_output=True, timeout=120)
