"""The HF token through `aleph campaign`: in the children's environment, nowhere else.

A real campaign (one smoke run) syncs to the fake hub, which answers only requests that
carry the token; `--set hf_token=...` and HF_TOKEN in the campaign's environment are two
different unique markers. While it runs every process's command line is read (but the
campaign's own: what the user typed); after it, every file of the work root
(campaign.json, launch logs, the run directory, HF_HOME).
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from aleph.campaign.spec import make_spec, redact_overrides
from aleph.train.config import REDACTED
from tests.campaign.conftest import campaign_cmd, start
from tests.sync.fake_hub import FakeHub

REPO_ID = "me/campaign-runs"
RUN = "a2_dense-s0"


def _cmdlines() -> dict[int, bytes]:
    """pid -> command line (NULs as spaces) of every process this user can read."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    out[int(entry.name)] = f.read().replace(b"\0", b" ")
            except OSError:  # gone meanwhile
                pass
    return out


def _files_holding(root: Path, markers: list[bytes]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {m.decode()}" for m in markers if m in data]
    return found


def test_secret_overrides_leave_the_spec_and_travel_as_environment():
    spec = make_spec("x", "smoke", None, ["hf_token=hf_abc", "batch_size=32"], ["a2_dense"], [0])
    assert spec.overrides == ("batch_size=32",)
    assert "hf_abc" not in repr(spec) and "hf_abc" not in str(spec.identity())
    assert "hf_abc" not in " ".join(spec.train_args("a2_dense", 0))
    assert spec.secret_env() == {"HF_TOKEN": "hf_abc"}
    assert redact_overrides(["hf_token=hf_abc", "epochs=2"]) == [f"hf_token={REDACTED}", "epochs=2"]


@pytest.mark.slow
def test_campaign_token_only_in_the_childrens_environment(campaign_work, tmp_path):
    work, name = campaign_work, "secrets"
    set_token = f"hf_campaign_set_{uuid.uuid4().hex}"  # --set hf_token: what the hub wants
    env_token = f"hf_campaign_env_{uuid.uuid4().hex}"  # HF_TOKEN of the campaign: overridden
    markers = [set_token.encode(), env_token.encode()]
    with FakeHub(tmp_path / "hub", token=set_token) as hub:
        cmd = campaign_cmd(name, "--arms", "a2_dense", "--seeds", "0", "--devices", "cpu:1",
                           "--set", f"hf_token={set_token}", "--set", f"sync_to=hf:{REPO_ID}",
                           "--set", "sync_every_minutes=0")
        proc = start(work, cmd, HF_TOKEN=env_token, HF_ENDPOINT=hub.endpoint,
                     HF_HOME=str(work / "cache" / "huggingface"))
        typed = " ".join(cmd).encode() + b" "
        leaks: list[str] = []
        trainers: set[int] = set()

        def watch() -> None:  # every process's argv, as `ps` shows it, while the campaign runs
            while proc.poll() is None:
                for pid, line in _cmdlines().items():
                    if line == typed:  # what the user typed (the campaign, its forks before exec)
                        continue
                    leaks.extend(f"pid {pid}: {line[:200]!r}" for m in markers if m in line)
                    if b"-m aleph train" in line and f"sync_to=hf:{REPO_ID}".encode() in line:
                        trainers.add(pid)  # this campaign's child (others may train meanwhile)

        t = threading.Thread(target=watch)
        t.start()
        out = proc.communicate(timeout=600)[0]
        t.join()
        assert proc.returncode == 0, out[-3000:]
        pushed = hub.files_at(REPO_ID, "main")
    assert trainers, "no trainer process was seen while the campaign ran"
    assert not leaks, "token on a command line:\n" + "\n".join(leaks[:5])
    # The child had the token: the hub took its pushes (every request needs the bearer token).
    assert pushed and any(RUN in path for path in pushed[1]), pushed
    assert not [m for m in markers if m.decode() in out], "token on the campaign's stdout"
    assert not _files_holding(work, markers), _files_holding(work, markers)
    state = (work / "campaigns" / name / "campaign.json").read_text()
    assert f"hf_token={REDACTED}" in state  # the process's options, as recorded
    (log,) = (work / "campaigns" / name / "launches").glob(f"{RUN}.*.log")
    first = log.read_text().splitlines()[0]
    assert first.endswith("(and HF_TOKEN in its environment)"), first
    print(f"\n{first}\ntrainer pids seen: {sorted(trainers)}; hub commits: "
          f"{len(hub.repos[REPO_ID]['commits'])}; no marker in any argv or file of {work}")
