"""Class-based temperature scaling (Frenkel & Goldberger 2021): the incremental grid search against a naive
implementation of the algorithm (a full softmax and a numpy ECE for every candidate)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from _calibrator_data import overconfident
from scipy.special import softmax

from hf_calibration.calibrators import ClassBasedTemperatureScaling, TemperatureScaling
from hf_calibration.calibrators._machinery.fitting import cts_search as search
from hf_calibration.metrics.binning import uniform_edges


def _ece(probs, labels, n_bins=15):
    conf, pred = probs.max(1), probs.argmax(1)
    correct = (pred == labels).astype(np.float64)
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        inside = (conf > lo) & (conf <= hi) if b else (conf <= hi)
        if inside.any():
            total += inside.mean() * abs(conf[inside].mean() - correct[inside].mean())
    return total, correct.mean()


def _naive_cts(logits, labels, grid, sweeps, tolerance):
    """Frenkel & Goldberger's greedy search, as the SMART comparison code runs it, with a softmax per candidate,
    on the logits relative to their row maximum (what our non-shift-invariant maps see)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    k = z.shape[1]
    t0 = TemperatureScaling().fit(logits, labels, progress_bar=False).fitted_temperature
    temps = np.full(k, np.clip(t0, min(grid), max(grid)))
    best_ece, best_acc = _ece(softmax(z / temps, axis=1), labels)
    for _ in range(sweeps):
        for c in np.unique(labels):
            choice, best = None, best_ece
            for t in grid:
                trial = temps.copy()
                trial[c] = t
                ece, acc = _ece(softmax(z / trial, axis=1), labels)
                if ece < best - 1e-12 and (tolerance is None or acc >= best_acc - tolerance - 1e-12):
                    choice, best, choice_acc = t, ece, acc
            if choice is not None and choice != temps[c]:
                temps[c], best_ece, best_acc = choice, best, choice_acc
    return temps, best_ece


@pytest.mark.parametrize("tolerance", [0.0, None])
def test_search_matches_the_naive_algorithm(tolerance):
    z, y = overconfident(400, 5, seed=3, scale=1.0)
    z = z * np.array([0.6, 1.5, 3.0, 4.5, 2.0], dtype=np.float32)  # each class over-confident by its own factor
    grid = (0.5, 0.8, 1.1, 1.5, 2.0, 3.0, 4.5)
    expected, expected_ece = _naive_cts(z, y, grid, sweeps=3, tolerance=tolerance)
    cts = ClassBasedTemperatureScaling(grid=grid, sweeps=3, accuracy_tolerance=tolerance).fit(z, y, progress_bar=False)
    # the same grid values (the temperature-scaling start of a class never moved may differ by rounding)
    np.testing.assert_allclose(cts.temperatures.detach().numpy(), expected, rtol=1e-8, atol=0)
    assert cts.fit_info_["search_ece_after"] == pytest.approx(expected_ece, abs=1e-9)
    assert cts.fit_info_["updates"] > 0  # the search did move the temperatures
    assert cts.fit_info_["search_ece_after"] < cts.fit_info_["search_ece_before"]


def test_forward_divides_each_class_by_its_temperature_and_may_move_the_argmax():
    z, y = overconfident(500, 6, seed=4)
    cts = ClassBasedTemperatureScaling().fit(z, y, progress_bar=False)
    zt = torch.from_numpy(z).double()
    zt = zt - zt.amax(dim=1, keepdim=True)
    torch.testing.assert_close(cts(zt), zt / cts.temperatures, rtol=0, atol=0)
    assert not cts.preserves_argmax
    assert cts.fit_info_["accuracy_after"] >= cts.fit_info_["accuracy"]  # the accuracy condition, on the fit set


def test_a_sweep_that_changes_nothing_ends_the_search():
    z, y = overconfident(300, 4, seed=5)
    cts = ClassBasedTemperatureScaling(sweeps=50).fit(z, y, progress_bar=False)
    assert cts.fit_info_["sweeps"] < 50


def test_row_summaries_survive_many_column_updates():
    # the incremental row sums after a series of column changes equal a fresh summary
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 7)) * 5
    inv_t = np.ones(7)
    n = len(z)
    state = [np.empty(n), np.empty(n, dtype=np.int64), np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)]
    search.summarise(z, inv_t, *state)
    for step in range(40):
        c = step % 7
        old = inv_t[c]
        inv_t[c] = 1 / rng.uniform(0.3, 5)
        search.update_column(z, c, old, inv_t, *state)
    fresh = [np.empty(n), np.empty(n, dtype=np.int64), np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)]
    search.summarise(z, inv_t, *fresh)
    for a, b in zip(state, fresh):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_candidate_bins_do_not_depend_on_the_thread_count():
    z, y = overconfident(3000, 8, seed=6)
    z = z.astype(np.float64)
    inv_t = np.full(8, 0.5)
    n = len(z)
    state = [np.empty(n), np.empty(n, dtype=np.int64), np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)]
    search.summarise(z, inv_t, *state)
    grid_inv = 1 / np.linspace(0.5, 5, 46)
    default = numba.get_num_threads()
    out = []
    try:
        for threads in sorted({1, default}):
            numba.set_num_threads(threads)
            out.append(search.candidate_bins(z, y, 3, inv_t, grid_inv, *state, uniform_edges(15)))
    finally:
        numba.set_num_threads(default)
    np.testing.assert_array_equal(out[0][0], out[-1][0])
    np.testing.assert_array_equal(out[0][1], out[-1][1])


def test_bad_arguments():
    with pytest.raises(TypeError, match="grid"):
        ClassBasedTemperatureScaling(grid=2.0)
    with pytest.raises(ValueError, match="grid"):
        ClassBasedTemperatureScaling(grid=(1.0, -1.0))
    with pytest.raises(ValueError, match="accuracy_tolerance"):
        ClassBasedTemperatureScaling(accuracy_tolerance=2.0)
