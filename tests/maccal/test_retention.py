"""MaC-Cal's adaptive retention rule (Eqs. 12–13 as we implement them): direction, clip bound, bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_calibration.maccal import MaCCalConfig
from hf_calibration.maccal.retention import clip_bound, update_retention


def test_clip_bound_decays_exponentially():
    cfg = MaCCalConfig(epochs=40, clip_bound=0.1, clip_decay=3.0)
    assert clip_bound(0, cfg) == pytest.approx(0.1)
    assert clip_bound(20, cfg) == pytest.approx(0.1 * math.exp(-1.5))  # 0.022313...
    assert clip_bound(40, cfg) == pytest.approx(0.1 * math.exp(-3.0))
    values = [clip_bound(t, cfg) for t in range(40)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert MaCCalConfig(clip_decay=0.0).clip_bound == clip_bound(39, MaCCalConfig(clip_decay=0.0))


def test_rule_raises_retention_when_over_confident_and_lowers_it_when_under_confident():
    cfg = MaCCalConfig(epochs=40, kappa=1.0, step=1.0, clip_bound=0.1, rho_min=0.05, rho_max=1.0)
    # over-confident: conf 0.95 > acc 0.90 → ρ goes up by the gap 0.05 (inside the clip 0.1)
    assert update_retention(0.8, 0.90, 0.95, 0, cfg) == pytest.approx(0.85)
    # under-confident: conf 0.70 < acc 0.90 → ρ goes down by 0.1, the clip bound at epoch 0
    assert update_retention(0.8, 0.90, 0.70, 0, cfg) == pytest.approx(0.7)
    # later epochs clip harder: epoch 20 of 40 with γ = 3 → τ = 0.1·e^{-1.5} = 0.0223130
    assert update_retention(0.8, 0.90, 0.70, 20, cfg) == pytest.approx(0.8 - 0.1 * math.exp(-1.5))
    # κ discounts the accuracy: acc 1.0, conf 0.95, κ 0.9 → conf − κ·acc = +0.05
    assert update_retention(0.8, 1.0, 0.95, 0, MaCCalConfig(kappa=0.9, rho_min=0.05)) == pytest.approx(0.85)
    # a calibrated input (κ·acc == conf) leaves ρ unchanged; the bounds hold
    assert update_retention(0.6, 0.5, 0.5, 3, cfg) == pytest.approx(0.6)
    assert update_retention(0.98, 0.5, 1.0, 0, cfg) == 1.0
    assert update_retention(0.06, 1.0, 0.2, 0, cfg) == 0.05


@settings(max_examples=200, deadline=None)
@given(
    rho=st.floats(0.05, 1.0),
    acc=st.floats(0.0, 1.0),
    conf=st.floats(0.0, 1.0),
    epoch=st.integers(0, 39),
    step=st.floats(0.1, 10.0),
)
def test_rule_stays_within_bounds_and_clip(rho, acc, conf, epoch, step):
    cfg = MaCCalConfig(rho_min=0.05, rho_max=1.0, step=step, rho0=0.5)  # rho may start anywhere in the bounds
    new = update_retention(rho, acc, conf, epoch, cfg)
    assert 0.05 <= new <= 1.0
    assert abs(new - rho) <= clip_bound(epoch, cfg) + 1e-12
    gap = conf - cfg.kappa * acc  # over-confidence
    if gap > 0:
        assert new >= rho
    elif gap < 0:
        assert new <= rho
