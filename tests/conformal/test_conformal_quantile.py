"""The split-conformal threshold: the ceil((n+1)(1-alpha))-th smallest score, exact arithmetic, clear errors."""

from __future__ import annotations

import math

import pytest
import torch

from hf_calibration.conformal.quantile import check_alpha, conformal_quantile, min_samples, quantile_rank


def test_order_statistic_by_hand():
    scores = torch.arange(1, 20, dtype=torch.float64)[torch.randperm(19)]  # 1..19, shuffled
    assert conformal_quantile(scores, 0.1) == 18.0  # ceil(20 * 0.9) = 18
    assert conformal_quantile(scores, 0.05) == 19.0  # ceil(20 * 0.95) = 19 = n
    assert conformal_quantile(scores, 0.5) == 10.0  # ceil(20 * 0.5) = 10


def test_rank_is_exact_where_floats_round_up():
    assert math.ceil(10 * (1 - 0.7)) == 4 and math.ceil(100 * (1 - 0.45)) == 56  # the float pitfall
    assert quantile_rank(9, 0.7) == 3 and quantile_rank(99, 0.45) == 55
    assert quantile_rank(99, 0.1) == 90 and quantile_rank(100, 0.1) == 91
    assert quantile_rank(4999, 0.05) == 4750


def test_too_few_samples_for_alpha():
    assert min_samples(0.05) == 19 and min_samples(0.1) == 9 and min_samples(0.3) == 3
    with pytest.raises(ValueError, match=r"`alpha`.*n = 18 .*every set would hold every class.*at least 19"):
        conformal_quantile(torch.rand(18, dtype=torch.float64), 0.05)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_alpha_outside_the_open_unit_interval(alpha):
    with pytest.raises(ValueError, match="`alpha`"):
        check_alpha(alpha)


def test_alpha_must_be_a_number():
    with pytest.raises(TypeError, match="`alpha`"):
        check_alpha("0.1")
