"""Structured vector scaling (Berta et al. 2026): the fit against a scipy minimisation of the same objective, the
structure it shares with SMS (the shared real logits against probmetrics: ``test_structured.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import fit_structured_reference, smoothed_temperature_features
from _calibrator_data import overconfident

from hf_calibration.calibrators import StructuredVectorScaling, create_calibrator, list_calibrators


@pytest.mark.parametrize("lambdas", [(1.0, 1.0), (0.05, 0.2)])
def test_fit_reaches_the_scipy_minimum_of_the_same_objective(lambdas):
    z, y = overconfident(300, 5, seed=6)
    z = z * np.array([0.7, 1.0, 1.5, 1.2, 0.9], dtype=np.float32) + np.array([0.5, 0, 0, -0.5, 1.0], dtype=np.float32)
    n, k = z.shape
    li, ld = lambdas
    svs = StructuredVectorScaling(lambda_intercept=li, lambda_diagonal=ld, tol=1e-14, max_iter=5000).fit(
        z, y, progress_bar=False
    )
    features, t, eps = smoothed_temperature_features(z, y)
    assert svs.fit_info_["temperature"] == pytest.approx(t, rel=1e-6)
    weights = (0.0, ld * k / n, li * k / n)  # the paper's scaling: lambda K / N
    _, ref_objective, ref_nll = fit_structured_reference(features, y, True, *weights)
    assert svs.fit_info_["best_objective"] == pytest.approx(ref_objective, abs=1e-7)
    assert svs.fit_info_["nll"] == pytest.approx(ref_nll, abs=1e-6)
    expected = torch.from_numpy(features) * svs.weight.detach() + svs.bias.detach()
    torch.testing.assert_close(svs(torch.from_numpy(z).double()), expected, rtol=0, atol=1e-6)


def test_registered():
    assert "svs" in list_calibrators() and type(create_calibrator("svs")) is StructuredVectorScaling
    assert StructuredVectorScaling.diagonal and not StructuredVectorScaling.preserves_argmax


@pytest.mark.parametrize("method", ["svs", "vector_scaling"])
def test_fit_frees_its_working_arrays_without_the_garbage_collector(method):
    """No reference cycle keeps the fit's (N, K) arrays (SVS's features) alive past the fit: with the collector off,
    what the fit allocated and still holds afterwards is a small fraction of the input (SVS's features alone are the
    input's size; they were held by objective <-> thread-count chooser, 4.1 GB at 50,000 x 21,843)."""
    import gc
    import tracemalloc

    z, y = overconfident(4000, 200, seed=3)
    create_calibrator(method).fit(
        z, y, progress_bar=False
    )  # every kernel this size runs (serial or parallel) loaded first
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        create_calibrator(method).fit(z, y, progress_bar=False)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    if method == "svs":
        assert peak >= z.nbytes  # the features were made (the check below would otherwise be empty)
    assert held < z.nbytes / 10


@pytest.mark.parametrize("source", ["memory", "npy"])
def test_fit_set_report_from_the_fit_features_equals_the_forward_pass(source, tmp_path):
    """SVS's fit-set report reads the features its fit kept (``x w + b``) instead of running the forward pass, which
    recomputes them (16 of 46 s at 50,000 x 21,843): the same accuracy and ECE as the forward's outputs give, to the
    float rounding of the features; the features are gone once ``fit`` returns, also without the report."""
    from hf_calibration.metrics import ece

    z, y = overconfident(3000, 40, seed=4)
    logits = z
    if source == "npy":
        np.save(tmp_path / "z.npy", z)
        logits = np.load(tmp_path / "z.npy", mmap_mode="r")
    svs = create_calibrator("svs").fit(logits, y, progress_bar=False)
    out = svs(torch.from_numpy(z)).numpy()
    assert svs.fit_info_["ece_after"] == pytest.approx(ece(out, y), abs=1e-6)
    assert svs.fit_info_["ece_after"] < svs.fit_info_["ece_before"] - 0.02  # the map did move the confidences
    assert svs.fit_info_["accuracy_after"] == pytest.approx((out.argmax(1) == y).mean(), abs=1 / 3000)
    assert "_fit_features" not in svs.__dict__
    quiet = create_calibrator("svs")
    quiet._fit_checked(np.ascontiguousarray(z), y.astype(np.int64), "nll", {}, False, report=False)
    assert "_fit_features" not in quiet.__dict__
