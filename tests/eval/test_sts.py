"""Spearman with average-rank ties against hand-computed cases."""

import math

import numpy as np
import pytest
import torch

from aleph.errors import DataError
from aleph.eval.sts import average_ranks, pair_cosines, spearman


def test_average_ranks_share_the_mean_rank_of_a_tie():
    # 5 -> rank 1, 10 -> rank 2, the three 20s span ranks 3..5 -> 4 each
    assert average_ranks([10, 20, 20, 20, 5]).tolist() == [2.0, 4.0, 4.0, 4.0, 1.0]
    assert average_ranks([3, 1, 2]).tolist() == [3.0, 1.0, 2.0]
    assert average_ranks([7, 7]).tolist() == [1.5, 1.5]


def test_spearman_with_ties_matches_hand_computation():
    # y ranks: [1, 2, 3.5, 5, 3.5]; x ranks 1..5. Deviations from 3:
    # x [-2,-1,0,1,2], y [-2,-1,.5,2,.5]; sum xy = 8, sum xx = 10, sum yy = 9.5
    rho = spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7])
    assert rho == pytest.approx(8 / math.sqrt(95), abs=1e-12)
    # the no-ties shortcut 1 - 6 sum d^2 / (n (n^2-1)) would give 0.825 here
    assert rho != pytest.approx(0.825, abs=1e-6)


def test_spearman_ties_on_both_sides_and_monotone_cases():
    assert spearman([1, 1, 2, 2], [1, 2, 1, 2]) == pytest.approx(0.0, abs=1e-12)
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)  # monotone, not linear
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # x ranks [1.5,1.5,3,4]; y ranks [1,2,3,4]: dev x [-1,-1,.5,1.5], y [-1.5,-.5,.5,1.5]
    # sum xy = 1.5+.5+.25+2.25 = 4.5; sum xx = 4.5; sum yy = 5
    assert spearman([0, 0, 1, 2], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_spearman_is_invariant_to_monotone_rescaling():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    assert spearman(x, y) == pytest.approx(spearman(np.exp(x), 3 * y + 1))


def test_spearman_rejects_undefined_cases():
    with pytest.raises(DataError, match="constant"):
        spearman([1, 2, 3], [4, 4, 4])
    with pytest.raises(DataError, match="length"):
        spearman([1, 2], [1, 2, 3])
    with pytest.raises(DataError, match="at least 2"):
        spearman([1], [1])
    with pytest.raises(DataError, match="NaN"):
        spearman([1, float("nan"), 3], [1, 2, 3])


def test_pair_cosines():
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    b = torch.tensor([[2.0, 0.0], [0.0, 5.0], [3.0, 4.0]])
    assert pair_cosines(a, b) == pytest.approx([1.0, 0.0, 1.0])
