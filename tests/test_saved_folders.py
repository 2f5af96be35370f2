"""Folders saved by 0.1.0 (before the package was regrouped) load with today's code and give what 0.1.0 gave."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_calibration import load_calibrator
from hf_calibration.conformal import load_conformal_predictor

SAVED = Path(__file__).resolve().parent / "fixtures" / "saved_0_1_0"
EXPECTED = json.loads((SAVED / "expected.json").read_text())
CALIBRATORS = sorted(name for name in EXPECTED if not name.startswith("conformal"))


@pytest.mark.parametrize("name", CALIBRATORS)
def test_a_calibrator_saved_by_0_1_0_loads_and_calibrates_as_it_did(name):
    calibrator = load_calibrator(SAVED / name)
    assert calibrator.kind == name
    probe = torch.tensor(EXPECTED[name]["probe"], dtype=torch.float32)
    np.testing.assert_allclose(
        calibrator(probe).double().numpy(), np.array(EXPECTED[name]["output"]), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("name", ["conformal_aps", "conformal_multilabel"])
def test_a_conformal_predictor_saved_by_0_1_0_loads_and_gives_the_same_sets(name):
    predictor = load_conformal_predictor(SAVED / name)
    probe = np.array(EXPECTED[name]["probe"], dtype=np.float32)
    np.testing.assert_array_equal(
        np.asarray(predictor.predict_sets(probe)).astype(int), np.array(EXPECTED[name]["sets"])
    )
