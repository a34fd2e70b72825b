"""Replaying the seed's a1 in-RAM store inside an envelope that refuses it: only on purpose.

The planner's headroom is a config field (store_headroom_gib), and forcing an implementation
the plan refuses needs store_override=true, which the launch log says in capitals.
"""

from __future__ import annotations

import importlib

import pytest

from aleph.env.cgroup import Envelope
from aleph.errors import QuotaError
from aleph.train import preflight
from aleph.train.config import resolve
from aleph.train.distributed import World


@pytest.fixture
def small_envelope(monkeypatch):
    """A 4,000,000 B memory limit, as the cgroup would report it (the planner reads it twice).

    The test's smoke store (1,024 rows) is 1,572,864 B, so in_ram peaks at 3,145,728 B: above
    the 3,000,000 B the default headroom leaves (capped at a quarter of the limit), below
    the limit itself."""
    env = Envelope(1, 4_000_000, None, None, None)
    monkeypatch.setattr("aleph.env.cgroup.read_envelope", lambda *a, **k: env)
    plan_module = importlib.import_module("aleph.targets.plan")  # the package re-exports plan()
    monkeypatch.setattr(plan_module, "read_envelope", lambda *a, **k: env)
    return env


def test_forcing_a_refused_store_needs_store_override_and_is_logged(work, smoke_data_dir,
                                                                     small_envelope):
    sources = [str(p) for p in sorted((smoke_data_dir / "targets").iterdir())]
    lines: list[str] = []
    forced = resolve("smoke", overrides=["store_implementation=in_ram"])
    with pytest.raises(QuotaError, match=r"^target store implementation 'in_ram' refused: "):
        preflight.prepare_targets(forced, sources, World(), lines.append)
    assert not (work / "cache" / "targets").exists()  # refused before any chunk was read

    # the headroom is a field: with room for the process it is simply allowed
    roomy = resolve("smoke", overrides=["store_implementation=in_ram", "store_headroom_gib=0.0001"])
    assert preflight.prepare_targets(roomy, sources, World(), lines.append).implementation == "in_ram"
    assert not any("FORCED" in line for line in lines)

    lines.clear()
    override = resolve("smoke", overrides=["store_implementation=in_ram", "store_override=true",
                                           "store_headroom_gib=1"])
    store = preflight.prepare_targets(override, sources, World(), lines.append)
    assert store.implementation == "in_ram"
    assert lines[0].startswith("target store: in_ram FORCED AGAINST THE QUOTA PLANNER "
                               "(store_override=true); the plan refused it: ")
    assert "4,000,000 B" in lines[0]  # the limit it overrode, named
