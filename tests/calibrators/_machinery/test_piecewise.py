"""PiecewiseMaps: per-group evaluation by hand, and checkpoints whose size or contents do not fit."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident

from hf_calibration.calibrators import (
    HistogramBinning,
    IsotonicRegression,
    OneVsRestIsotonicRegression,
    load_calibrator,
)
from hf_calibration.calibrators._machinery.piecewise import PiecewiseMaps


def test_groups_by_hand():
    maps = PiecewiseMaps()
    # group 0: bins (.., 0.5] -> 0.2, (0.5, ..] -> 0.9; group 1: no bins (identity); group 2: one bin -> 0.4
    maps.set(
        [(np.array([0.5, 1.0]), np.array([0.2, 0.9])), (np.zeros(0), np.zeros(0)), (np.array([1.0]), np.array([0.4]))]
    )
    x = np.array([0.1, 0.5, 0.51, 0.3, 0.7, 0.9, 0.6])
    groups = np.array([0, 0, 0, 1, 2, 3, 1])  # group 3 was never fitted: the identity
    np.testing.assert_array_equal(maps.evaluate(x, groups, step=True), [0.2, 0.2, 0.9, 0.3, 0.4, 0.9, 0.6])
    # as linear maps: group 0 interpolates between (0.5, 0.2) and (1.0, 0.9), constant below 0.5
    np.testing.assert_allclose(
        maps.evaluate(x, groups, step=False), [0.2, 0.2, 0.214, 0.3, 0.4, 0.9, 0.6], rtol=0, atol=1e-15
    )
    np.testing.assert_array_equal(maps.evaluate(np.array([0.75]), step=False), [0.55])
    assert maps.inconsistency() is None and maps.num_groups == 3


@pytest.fixture()
def saved(tmp_path):
    z, y = overconfident(400, 5, seed=1)
    iso = IsotonicRegression().fit(z, y, progress_bar=False)
    iso.save_pretrained(tmp_path / "iso")
    return iso, z, tmp_path


def _tamper(folder, target, edit):
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, target)
    tensors = load_file(target / "model.safetensors")
    edit(tensors)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt", "calibrator": "isotonic"})
    return target


def test_checkpoint_size_follows_the_fit(saved):
    iso, z, tmp_path = saved
    loaded = load_calibrator(tmp_path / "iso")
    assert loaded.maps.knots.shape == iso.maps.knots.shape and loaded.maps.knots.numel() > 2
    assert torch.equal(loaded(torch.from_numpy(z)), iso(torch.from_numpy(z)))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: t.__setitem__("maps.offsets", torch.tensor([0, 3])), "do not index"),
        (lambda t: t.__setitem__("maps.knots", t["maps.knots"].flip(0)), "not increasing"),
        (lambda t: t.__setitem__("maps.values", t["maps.values"][:-1].clone()), "do not index"),
    ],
)
def test_inconsistent_checkpoints_are_refused(saved, edit, match):
    _, _, tmp_path = saved
    bad = _tamper(tmp_path / "iso", tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=match):
        load_calibrator(bad)


@pytest.mark.parametrize("kind", ["isotonic", "isotonic_ovr", "histogram_binning", "spline"])
@pytest.mark.parametrize("name, value", [("maps.values", 1.5), ("maps.values", -0.25), ("maps.knots", 1.5)])
def test_maps_outside_the_probabilities_are_refused(kind, name, value, tmp_path):
    # issue 23 item 12: tampered values outside [0, 1] loaded without complaint
    from safetensors.torch import load_file, save_file

    from hf_calibration.calibrators import create_calibrator

    z, y = overconfident(600, 5, seed=1)
    create_calibrator(kind).fit(z, y, progress_bar=False).save_pretrained(tmp_path / "ok")
    load_calibrator(tmp_path / "ok")  # as fitted: loads
    shutil.copytree(tmp_path / "ok", tmp_path / "bad")
    tensors = load_file(tmp_path / "bad" / "model.safetensors")
    index = len(tensors[name]) - 1 if name == "maps.knots" else 0  # the last knot: the order stays increasing
    tensors[name][index] = value
    save_file(tensors, tmp_path / "bad" / "model.safetensors", metadata={"format": "pt", "calibrator": kind})
    with pytest.raises(ValueError, match=rf"corrupted: {name.split('.')[1]} hold {value!r}, outside \[0, 1\]"):
        load_calibrator(tmp_path / "bad")


@pytest.mark.parametrize(
    "make",
    [
        OneVsRestIsotonicRegression,
        lambda: HistogramBinning(points_per_bin=10),
        lambda: HistogramBinning(points_per_bin=200),
    ],
    ids=["isotonic_ovr", "histogram_binning per_class", "histogram_binning pooled rare classes"],
)
def test_per_class_maps_refuse_another_number_of_classes(make, tmp_path):
    # issue 23 item 2: class k's map was applied to whatever class k of K = 3 or K = 8 logits was, with a log line only
    z, y = overconfident(600, 5, seed=3)
    fitted = make().fit(z, y, progress_bar=False)
    fitted.save_pretrained(tmp_path / "cal")
    for calibrator in (fitted, load_calibrator(tmp_path / "cal")):
        for k in (3, 8):
            other, _ = overconfident(50, k, seed=4)
            for call in (calibrator, calibrator.predict_proba):
                with pytest.raises(ValueError, match=rf"K = 5 classes \(one map per class\), but got K = {k}"):
                    call(other)
        assert calibrator(z).shape == (600, 5)


def test_one_top_label_map_serves_any_number_of_classes():
    # per_class=False: a single map of the top confidence, whatever class is on top: any K is fine, argmax kept
    z, y = overconfident(600, 5, seed=3)
    hb = HistogramBinning(per_class=False, binning="equal_width", n_bins=10).fit(z, y, progress_bar=False)
    other, _ = overconfident(50, 8, seed=4)
    assert torch.equal(hb(other).argmax(1), torch.from_numpy(other).argmax(1))
