"""Parameterized temperature scaling (Tomani et al. 2022): the forward against an independent numpy implementation
of the paper's map, the degenerate constant network = temperature scaling, and the fit against temperature scaling
and an oracle temperature on data whose right temperature depends on the logits."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch
from _calibrator_data import overconfident
from scipy.special import softmax

from hf_calibration.calibrators import ParameterizedTemperatureScaling, TemperatureScaling


def _paper_pts_proba(logits, layers, top_k=10, clip=100.0):
    """T = |MLP(top-k of the clipped logits, descending)| (ReLU between layers), p = softmax(z / T), in numpy; the MLP
    sees the logits relative to their row maximum, rounded to float32 (our change to the paper's input)."""
    z = logits.astype(np.float64)
    relative = (z - z.max(axis=1, keepdims=True)).astype(np.float32).astype(np.float64)
    h = -np.sort(-np.clip(relative, -clip, clip), axis=1)[:, :top_k]
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    t = np.clip(np.abs(h[:, 0]), 1e-12, 1e12)
    return softmax(z / t[:, None], axis=1)


def _layers(pts):
    return [(layer.weight.detach().numpy(), layer.bias.detach().numpy()) for layer in pts.layers]


def _brier(p, labels):
    return np.mean(np.sum((p - np.eye(p.shape[1])[labels]) ** 2, axis=1))


def _scale_dependent(n, k=12, seed=0):
    """Labels drawn from ``softmax(base)`` (so ``base`` is calibrated) with ``base`` of a per-row scale ``s`` in
    [0.5, 3], and logits ``z = s * base``: the right temperature is ``s``, which the sorted logits reveal and one
    global temperature cannot match."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.5, 3.0, size=(n, 1))
    base = rng.normal(size=(n, k)) * s
    y = np.array([rng.choice(k, p=softmax(row)) for row in base])
    return (base * s).astype(np.float32), y, softmax(base, axis=1)


def test_forward_is_the_papers_map():
    z, y = overconfident(400, 15, seed=1)
    pts = ParameterizedTemperatureScaling(seed=3).fit(z, y, progress_bar=False)
    zt = torch.from_numpy(z).double()
    np.testing.assert_allclose(pts.predict_proba(zt).numpy(), _paper_pts_proba(z, _layers(pts)), rtol=1e-10, atol=1e-14)
    assert torch.equal(pts(torch.from_numpy(z)).argmax(1), torch.from_numpy(z).argmax(1))
    assert sum(p.numel() for p in pts.parameters()) == 10 * 5 + 5 + 5 * 5 + 5 + 5 + 1  # 91, the paper's network


def test_a_constant_network_is_temperature_scaling():
    z, y = overconfident(300, 8, seed=2)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    pts = ParameterizedTemperatureScaling().fit(z, y, progress_bar=False)
    with torch.no_grad():
        for layer in pts.layers:
            layer.weight.zero_()
            layer.bias.zero_()
        pts.layers[-1].bias.fill_(ts.fitted_temperature)
    zt = torch.from_numpy(z).double()
    torch.testing.assert_close(pts(zt), ts(zt), rtol=1e-14, atol=0)
    torch.testing.assert_close(pts.temperature(zt), ts.temperature(zt), rtol=1e-14, atol=0)


def test_fewer_classes_than_inputs_pads_with_the_smallest_logit():
    pts = ParameterizedTemperatureScaling(top_k=6)
    z = torch.tensor([[3.0, -1.0, 2.0, 50.0], [0.0, -150.0, 1.0, 2.0]])
    # relative to the row maximum, clipped at -100, sorted, padded with the smallest
    assert pts.sorted_inputs(z).tolist() == [
        [0.0, -47.0, -48.0, -51.0, -51.0, -51.0],
        [0.0, -1.0, -2.0, -100.0, -100.0, -100.0],
    ]
    assert torch.equal(pts.sorted_inputs(z + 5.0), pts.sorted_inputs(z))


def test_fit_beats_temperature_scaling_where_the_temperature_should_vary():
    z, y, oracle = _scale_dependent(6000, seed=2)
    zf, yf, zt, yt, oracle_t = z[:3000], y[:3000], z[3000:], y[3000:], oracle[3000:]
    pts = ParameterizedTemperatureScaling().fit(zf, yf, progress_bar=False)
    # temperature scaling under the same objective, fitted independently (scipy, exact softmax)
    t_ts = scipy.optimize.minimize_scalar(
        lambda t: _brier(softmax(zf / t, axis=1), yf), bounds=(0.05, 100), method="bounded", options={"xatol": 1e-10}
    ).x
    fit_ts = _brier(softmax(zf / t_ts, axis=1), yf)
    fit_pts = _brier(_paper_pts_proba(zf, _layers(pts)), yf)
    assert fit_pts <= fit_ts  # starts from temperature scaling: does not end worse on the fit objective
    assert pts.fit_info_["temperature_scaling"] == pytest.approx(t_ts, rel=1e-3)
    test_pts, test_ts, test_oracle = (
        _brier(_paper_pts_proba(zt, _layers(pts)), yt),
        _brier(softmax(zt / t_ts, axis=1), yt),
        _brier(oracle_t, yt),
    )
    # held out: most of the way from temperature scaling to the true temperatures (measured: 97 %)
    assert test_pts < test_ts - 0.5 * (test_ts - test_oracle)


def test_deterministic_given_seed():
    z, y = overconfident(300, 10, seed=4)
    a = ParameterizedTemperatureScaling(seed=5).fit(z, y, progress_bar=False)
    b = ParameterizedTemperatureScaling(seed=5).fit(z, y, progress_bar=False)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(
    "kwargs, match", [({"top_k": 0}, "top_k"), ({"clip": 0.0}, "clip"), ({"hidden_size": 1.5}, "hidden_size")]
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ParameterizedTemperatureScaling(**kwargs)
