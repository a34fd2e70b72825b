"""Golden losses: what the smoke model learns in its first steps, pinned.

The bitwise resume tests compare the code with itself; these compare it with numbers
written down. A changed init, loss scale, learning rate, data order or model formula moves
them (a changed init moved step 1 by 0.14, far outside the tolerance), a rounding change
does not (merging the bank's matmuls moved a1 by at most 2.4e-7).

Both runs are the real trainer (`python -m aleph train --preset smoke`, conftest's TINY
config, seed 0, 12 steps, one thread, deterministic CPU), read from its TensorBoard
scalars; two runs of either arm were bitwise equal when these were pinned (2026-12-01).

To update them ON PURPOSE (a change meant to alter what the model learns): run
    ALEPH_PRINT_GOLDEN=1 .venv/bin/python -m pytest tests/train/test_golden_loss.py -s
paste the printed dicts below, and say in the commit message why the losses moved.
"""

from __future__ import annotations

import os

import pytest

from tests.train.conftest import completed_run

STEPS = 12
TOLERANCE = 5e-4  # absolute; other CPUs' kernels round differently, the drift stays ~1e-6
GOLDEN = {
    "a1_anchored": {1: 3.6436336, 4: 3.33277416, 8: 2.93772173, 12: 2.4237597},
    "a2_dense": {1: 3.55525732, 4: 3.14584422, 8: 2.5123086, 12: 2.14046979},
}


def tb_losses(run_dir) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("train/loss")}


@pytest.mark.parametrize("arm", sorted(GOLDEN))
def test_smoke_losses_match_the_pinned_ones(arm, tmp_path_factory, smoke_data_dir):
    run = completed_run(tmp_path_factory, smoke_data_dir, arm, 0, f"max_steps={STEPS}")
    losses = tb_losses(run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    if os.environ.get("ALEPH_PRINT_GOLDEN"):
        print(f'"{arm}": {{{", ".join(f"{s}: {losses[s]:.9g}" for s in GOLDEN[arm])}}},')
    off = {s: losses[s] - v for s, v in GOLDEN[arm].items() if abs(losses[s] - v) > TOLERANCE}
    assert not off, (f"{arm}: losses moved from the pinned ones at steps {off} (got "
                     f"{ {s: losses[s] for s in GOLDEN[arm]} }); if on purpose, see the "
                     "module docstring")
