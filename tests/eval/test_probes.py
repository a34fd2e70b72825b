"""R@1, cos->target and erank on hand-built embeddings."""

import math

import pytest
import torch
import torch.nn.functional as F

from aleph.data.align import bitwise_same, retrieval_credit
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


def test_r_at_1_duplicated_targets_split_the_hit():
    # rows 0 and 1 share a bit-identical target: whichever of the two the student points
    # at, the two candidates tie, so each row scores 1/2 (never 1 or 0 by rounding)
    target = torch.stack([E[0], E[0], E[2], E[3]])
    student = target.clone()
    assert mimicry_r_at_1(student, target, batch_size=4) == pytest.approx((0.5 + 0.5 + 1 + 1) / 4)
    # tilting row 0's embedding does not break the tie: its two candidates are one vector
    student[0] = E[0] + 1e-9 * E[1]
    assert mimicry_r_at_1(student, target, batch_size=4) == pytest.approx(0.75)
    # a row closer to another (distinct) target is a miss: no credit from the tie rule
    student[1] = E[2]
    assert mimicry_r_at_1(student, target, batch_size=4) == pytest.approx((0.5 + 0 + 1 + 1) / 4)
    # three copies: 1/3 each; the rule is recorded beside the figure
    target3 = torch.stack([E[1], E[1], E[1], E[3]])
    out = probe_all(target3.clone(), target3, batch_size=4)
    assert out["r_at_1"] == pytest.approx((3 * (1 / 3) + 1) / 4) and out["r_at_1_ties"] == "split"


def test_r_at_1_copies_tie_even_when_rounding_differs():
    # many copies of one random target in a wide batch: computed scores of identical
    # columns could differ in the last bit; the rule gives exactly 1/copies each
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 64, generator=g, dtype=torch.float64)
    target = base[torch.tensor([0, 0, 0, 0, 0, 1, 2, 0])]  # row 0's target six times
    student = target + 1e-3 * torch.randn(8, 64, generator=g, dtype=torch.float64)
    assert mimicry_r_at_1(student, target, batch_size=8) == pytest.approx((6 * (1 / 6) + 2) / 8)
    # the first copy's row misses (it points at row 5's target): the other five copies
    # keep their 1/6 each; an argmax rule would credit none of them (index 0 wins the tie)
    student[0] = base[1]
    assert mimicry_r_at_1(student, target, batch_size=8) == pytest.approx((5 * (1 / 6) + 2) / 8)


def test_r_at_1_duplicates_whose_gemm_scores_differ_in_the_last_bit():
    """Two bitwise-equal target rows in one batch, whose bmm scores really differ in the last
    bit, both rounded the same way for their two rows (asserted), so a rule by score would
    give rows 0 and 8 both 1 or both 0 (R@1 9/9 or 7/9): by identity they tie, 1/2 each."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):  # a batch where the GEMM rounds the two copies apart
        target = F.normalize(torch.randn(9, 64, generator=g, dtype=torch.float64), dim=-1)
        target[8] = target[0]
        student = target + 1e-2 * torch.randn(9, 64, generator=g, dtype=torch.float64)
        sims = F.normalize(student, dim=-1).view(1, 9, 64) @ target.view(1, 9, 64).transpose(1, 2)
        a, b = sims[0, 0, 0] - sims[0, 0, 8], sims[0, 8, 8] - sims[0, 8, 0]  # own - copy
        if a != 0 and b != 0 and (a > 0) == (b > 0):
            break
    else:
        pytest.skip("this BLAS computed every pair of duplicate columns bitwise alike")
    assert (sims[0, 0, 0] - sims[0, 0, 8]).abs() < 1e-12  # the last bits, not the values
    assert torch.equal(sims[0].argmax(-1)[1:8], torch.arange(1, 8))  # the others are hits
    assert mimicry_r_at_1(student, target, batch_size=9) == (7 + 0.5 + 0.5) / 9


def test_retrieval_credit_ties_by_identity_not_by_score():
    own = torch.tensor(0.75, dtype=torch.float64)
    up = torch.nextafter(own, torch.tensor(1.0, dtype=torch.float64))  # one ulp above
    scores = torch.tensor([[own, up, 0.1], [own, up, 0.1], [0.2, 0.3, 0.9]], dtype=torch.float64)
    same = torch.tensor([[True, True, False], [True, True, False], [False, False, True]])
    assert retrieval_credit(scores, same).tolist() == [0.5, 0.5, 1.0]
    # without the identity the last bit decides: row 0 misses, row 1 hits
    assert retrieval_credit(scores, torch.eye(3, dtype=torch.bool)).tolist() == [0.0, 1.0, 1.0]
    rows = torch.tensor([[1.0, 2.0], [1.0, 2.0], [-0.0, 2.0], [0.0, 2.0]], dtype=torch.float16)
    # bitwise, not by value: -0.0 and 0.0 are equal numbers but different rows
    assert bitwise_same(rows).tolist() == [[True, True, False, False], [True, True, False, False],
                                           [False, False, True, False], [False, False, False, True]]
