"""What SMS and SVS share (``_structured.py``): on the shared real logits, held-out NLL as low as their authors'
probmetrics 1.3 (when installed) and below the uncalibrated model's; save / load keeps the temperature and smoothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _affine_reference import probmetrics_held_out_nll
from _calibrator_data import overconfident, shared_files
from _paths import shared_params

from hf_calibration.calibrators import StructuredMatrixScaling, StructuredVectorScaling, load_calibrator

pytestmark = pytest.mark.kernels  # also run with numba targeting a CPU without AVX-512 (.ci/run)

needs_shared = pytest.mark.skipif(not shared_files(), reason="the shared real-logit files are not beside the repo")


@needs_shared
@pytest.mark.parametrize("cls", [StructuredMatrixScaling, StructuredVectorScaling], ids=["sms", "svs"])
@pytest.mark.parametrize("path", shared_params(shared_files()), ids=lambda p: getattr(p, "stem", p))
def test_held_out_nll_matches_probmetrics_on_the_shared_files(cls, path):
    pytest.importorskip("probmetrics")
    with np.load(path) as d:
        zv, yv, zt, yt = d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]
    cal = cls().fit(zv, yv, progress_bar=False)
    with torch.no_grad():
        ours = float(torch.nn.functional.cross_entropy(cal(torch.from_numpy(zt)).double(), torch.from_numpy(yt)))
    theirs = probmetrics_held_out_nll(cls.kind, zv, yv, zt, yt)
    # measured: equal to 4 decimals on 12 of the 14, SMS 2e-5 / 4e-5 above on two CIFAR-100 files, where our fit reaches
    # the lower training objective (theirs stops earlier, in float32; test_sms.py)
    assert ours <= theirs + 1e-4
    assert ours < float(torch.nn.functional.cross_entropy(torch.from_numpy(zt).double(), torch.from_numpy(yt)))


@pytest.mark.parametrize("cls", [StructuredMatrixScaling, StructuredVectorScaling], ids=["sms", "svs"])
def test_save_and_load_keep_the_preprocessing(cls, tmp_path):
    z, y = overconfident(300, 4, seed=1)
    cal = cls().fit(z, y, progress_bar=False)
    cal.save_pretrained(tmp_path / "cal")
    back = load_calibrator(tmp_path / "cal")
    assert type(back) is cls and float(back.smoothing) == pytest.approx(1 / 301)
    assert float(back.log_temperature.exp()) == pytest.approx(cal.fit_info_["temperature"])
    zt = torch.from_numpy(z).double()
    torch.testing.assert_close(back(zt), cal(zt), rtol=0, atol=0)
