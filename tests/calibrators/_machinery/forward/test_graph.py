"""``Calibrator.graph_forward`` (the branch-free map that tracers follow) against the eager ``forward`` for every
registered calibrator, and the piecewise lookups of ``_graph.py`` against numpy's ``searchsorted`` / ``interp``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident

from hf_calibration.calibrators import create_calibrator, list_calibrators
from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators._machinery.piecewise import PiecewiseMaps

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    z, y = overconfident(1200, 10, seed=3)
    return z[:800], y[:800], z[800:]


@pytest.fixture(scope="module")
def fitted(data):
    z, y, _ = data
    out = {}
    for kind in list_calibrators("multiclass"):
        out[kind] = create_calibrator(kind).fit(z, y, progress_bar=False)
    return out


@pytest.mark.parametrize("kind", list_calibrators("multiclass"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_graph_forward_equals_forward(fitted, data, kind, dtype):
    calibrator = fitted[kind]
    z = torch.from_numpy(data[2]).to(dtype)
    eager = calibrator(z, from_logits=True)
    graph = calibrator.graph_forward(z)
    assert graph.dtype == eager.dtype == dtype and graph.shape == eager.shape
    p_eager, p_graph = torch.softmax(eager.double(), 1), torch.softmax(graph.double(), 1)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert float((p_eager - p_graph).abs().max()) <= tol
    assert torch.equal(eager.argmax(1), graph.argmax(1))
    if calibrator.preserves_argmax:
        assert torch.equal(graph.argmax(1), z.argmax(1))


def test_graph_forward_keeps_the_argmax_on_rounding_ties():
    """Top-two logits one ulp apart: a temperature merges them in float32; the guard keeps the first on top."""
    ts = create_calibrator("temperature_scaling")
    z, y = overconfident(200, 4, seed=0)
    ts.fit(z, y, progress_bar=False)
    with torch.no_grad():
        ts.log_temperature.fill_(np.log(3.0))
    a = torch.tensor(1.0)
    row = torch.stack([torch.nextafter(a, torch.tensor(2.0)), a, torch.tensor(-1.0), torch.tensor(-2.0)])
    z = row[None].repeat(3, 1)
    assert torch.equal(ts.graph_forward(z).argmax(1), torch.zeros(3, dtype=torch.long))
    assert torch.equal(ts.graph_forward(z), ts(z, from_logits=True))


def _maps(groups):
    maps = PiecewiseMaps()
    maps.set([(np.asarray(k, float), np.asarray(v, float)) for k, v in groups])
    return maps


GROUPS = [
    ([0.2, 0.5, 0.5, 0.8, 1.0], [0.1, 0.3, 0.35, 0.6, 0.9]),  # a repeated edge
    ([0.4], [0.7]),  # one knot
    ([], []),  # empty: the identity
    ([0.0, 0.25, 0.6], [0.05, 0.2, 0.95]),
]
# every knot, between knots, below the first, above the last, and the ends of [0, 1]
POINTS = np.array([0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1.0])


def test_step_lookup_matches_searchsorted():
    maps = _maps(GROUPS)
    for g, (knots, values) in enumerate(GROUPS):
        x = torch.from_numpy(POINTS)
        got = _graph.step_lookup(x, torch.full((x.numel(),), g), maps.graph_tables()).numpy()
        if not knots:
            expected = POINTS
        else:
            edges, vals = np.asarray(knots), np.asarray(values)
            expected = vals[np.searchsorted(edges[:-1], POINTS, side="left")]
        np.testing.assert_array_equal(got, expected)


def test_linear_interp_matches_numpy_interp():
    maps = _maps(GROUPS)
    for g, (knots, values) in enumerate(GROUPS):
        x = torch.from_numpy(POINTS)
        got = _graph.linear_interp(x, torch.full((x.numel(),), g), maps.graph_tables()).numpy()
        expected = POINTS if not knots else np.interp(POINTS, np.asarray(knots, float), np.asarray(values, float))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)


def test_lookups_take_each_value_to_its_own_group():
    """(N, K) values, one group per column (one-vs-rest maps): each column read through its own map."""
    maps = _maps(GROUPS)
    rng = np.random.default_rng(0)
    x = rng.random((50, len(GROUPS)))
    groups = torch.arange(len(GROUPS)).expand(50, -1)
    got = _graph.linear_interp(torch.from_numpy(x), groups, maps.graph_tables()).numpy()
    for g, (knots, values) in enumerate(GROUPS):
        expected = x[:, g] if not knots else np.interp(x[:, g], knots, values)
        np.testing.assert_allclose(got[:, g], expected, rtol=0, atol=1e-15)


def test_graph_tables_follow_a_save_and_load(fitted, tmp_path, data):
    """The tables are rebuilt on load (they are not saved): a loaded calibrator's graph path gives the same logits."""
    from hf_calibration import load_calibrator

    hb = fitted["histogram_binning"]
    hb.save_pretrained(tmp_path / "hb")
    loaded = load_calibrator(tmp_path / "hb")
    assert "maps.graph_knots" not in loaded.state_dict()
    z = torch.from_numpy(data[2])
    assert torch.equal(loaded.graph_forward(z), hb.graph_forward(z))
