"""R@1, cos->target and erank on hand-built embeddings."""

import math

import pytest
import torch

from aleph.errors import DataError
from aleph.eval.probes import cos_to_target, erank, mimicry_r_at_1, probe_all

E = torch.eye(4)  # e0..e3


def test_r_at_1_counts_own_target_first():
    target = E.clone()
    assert mimicry_r_at_1(target.clone(), target, batch_size=4) == 1.0
    student = torch.stack([E[0], E[0], E[2], E[3]])  # row 1 points at row 0's target
    assert mimicry_r_at_1(student, target, batch_size=4) == 0.75


def test_r_at_1_only_competes_inside_the_batch():
    # row 1 is closest to target 2 overall, but with batch 2 target 2 is not a candidate
    student = torch.stack([E[0], 0.9 * E[2] + 0.1 * E[1], E[2], E[3]])
    assert mimicry_r_at_1(student, E, batch_size=4) == 0.75
    assert mimicry_r_at_1(student, E, batch_size=2) == 1.0


def test_r_at_1_drops_a_partial_last_batch_and_states_it():
    target = torch.eye(5)
    student = torch.stack([target[0], target[1], target[2], target[3], target[0]])  # row 4 wrong
    out = probe_all(student, target, batch_size=2)
    assert out["r_at_1"] == 1.0 and out["rows_scored_r_at_1"] == 4 and out["r_at_1_batch_size"] == 2
    with pytest.raises(DataError, match="full batch"):
        mimicry_r_at_1(student, target, batch_size=8)


def test_cos_to_target():
    target = torch.stack([E[0], (E[0] + E[1]) / math.sqrt(2)])
    student = torch.stack([E[0], 3 * E[1]])  # scale does not matter
    assert cos_to_target(student, target) == pytest.approx((1 + 1 / math.sqrt(2)) / 2)
    with pytest.raises(DataError, match="must both be"):
        cos_to_target(student, target[:1])


def test_erank_participation_ratio():
    iso = torch.cat([E, -E])  # covariance proportional to the identity: 4 equal eigenvalues
    assert erank(iso) == pytest.approx(4.0)
    line = torch.stack([E[0], -E[0], 2 * E[0], -2 * E[0]])  # one direction
    assert erank(line) == pytest.approx(1.0)
    two = torch.stack([E[0], -E[0], 2 * E[1], -2 * E[1]])  # eigenvalues in ratio 1 : 4
    assert erank(two) == pytest.approx((1 + 4) ** 2 / (1 + 16))
    # centred: a constant offset adds no direction
    assert erank(two + 5 * E[3]) == pytest.approx(25 / 17)
