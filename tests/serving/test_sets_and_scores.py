"""Sets and scores agree: a conformal predictor records the fingerprint of the calibrator it was fitted behind, and a
folder whose ``conformal/`` was fitted on other scores than ``calibrator/`` serves is refused at load, with a message
saying to refit. Predictors saved before the record (tests/fixtures) still load, with one warning. The sets of an
agreeing folder are checked by hand: a class is in a THR set iff its calibrated probability is at least 1 - q_hat."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _models import digits, make_model

from hf_calibration import create_calibrator, list_calibrators, load_calibrated_model, pipeline
from hf_calibration.calibrators import TemperatureScaling, load_calibrator, scores_fingerprint
from hf_calibration.conformal import ConformalPredictor, MultiLabelConformalPredictor, load_conformal_predictor

torch.set_num_threads(1)
LOGGER = "hf_calibration.serving.calibrated_model"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "saved_0_1_0"


def _logits(k: int = 10, n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    return 4 * torch.randn(n, k, generator=g) + 4 * torch.nn.functional.one_hot(y, k), y  # over-confident: T > 1


def _model_folder(folder: Path, num_labels: int = 10) -> torch.nn.Module:
    model = make_model("vit", seed=0, num_labels=num_labels).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)  # sizeable logits, so that the temperature matters
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def fitted():
    z, y = _logits()
    return z, y, TemperatureScaling().fit(z, y, progress_bar=False)


def test_a_fingerprint_survives_a_save_and_tells_calibrators_apart(tmp_path):
    z, y = _logits(4)
    g = torch.Generator().manual_seed(1)
    yb = torch.randint(0, 2, (400, 3), generator=g)
    zb = torch.randn(400, 3, generator=g) + 2 * yb
    prints = {}
    for kind in list_calibrators():
        sigmoid = kind.startswith("sigmoid") or kind in ("platt", "beta")
        calibrator = create_calibrator(kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if sigmoid:
                calibrator.fit(zb, yb, progress_bar=False, task="multilabel")
            else:
                calibrator.fit(z, y, progress_bar=False)
        calibrator.save_pretrained(tmp_path / kind)
        assert load_calibrator(tmp_path / kind).fingerprint() == calibrator.fingerprint(), kind
        prints[kind] = calibrator.fingerprint()
    assert len(set(prints.values())) == len(prints)  # one per fitted calibrator
    a = TemperatureScaling().fit(z, y, progress_bar=False)
    b = TemperatureScaling().fit(z[:300], y[:300], progress_bar=False)  # another T
    assert a.fingerprint() != b.fingerprint()


def test_the_predictor_records_the_calibrator_it_was_fitted_behind(fitted):
    z, y, ts = fitted
    behind = ConformalPredictor("thr").fit(z, y, calibrator=ts)
    plain = ConformalPredictor("thr").fit(z, y)
    assert behind.fit_info_["calibrator_fingerprint"] == ts.fingerprint()
    assert plain.fit_info_["calibrator_fingerprint"] is None
    multi = MultiLabelConformalPredictor().fit(torch.randn(300, 3), torch.randint(0, 2, (300, 3)), alpha=0.2)
    assert multi.fit_info_["calibrator_fingerprint"] is None


def test_a_folder_whose_sets_were_fitted_on_the_uncalibrated_scores_is_refused(fitted, tmp_path, caplog):
    z, y, ts = fitted
    _model_folder(tmp_path)
    ts.save_pretrained(tmp_path / "calibrator")
    ConformalPredictor("thr").fit(z, y).save_pretrained(tmp_path / "conformal")  # on the model's own scores
    with pytest.raises(ValueError, match=r"fitted on the model's own scores.*temperature_scaling.*Refit"):
        load_calibrated_model(tmp_path)
    with pytest.raises(ValueError, match="Refit"):
        pipeline("image-classification", model=tmp_path)


def test_a_folder_whose_sets_were_fitted_behind_another_calibrator_is_refused(fitted, tmp_path):
    z, y, ts = fitted
    _model_folder(tmp_path)
    ts.save_pretrained(tmp_path / "calibrator")
    other = TemperatureScaling().fit(z[:200], y[:200], progress_bar=False)
    ConformalPredictor("thr").fit(z, y, calibrator=other).save_pretrained(tmp_path / "conformal")
    with pytest.raises(ValueError, match="Refit the predictor behind the served calibrator"):
        load_calibrated_model(tmp_path)


def test_sets_fitted_on_the_model_s_own_scores_load_beside_no_calibrator(tmp_path, caplog):
    z, y = _logits()
    _model_folder(tmp_path)
    ConformalPredictor("thr").fit(z, y).save_pretrained(tmp_path / "conformal")
    model = load_calibrated_model(tmp_path)  # the plain model (one warning: no calibrator/), sets on its scores
    assert model.conformal_predictor.fit_info_["calibrator_fingerprint"] is None


def test_an_agreeing_folder_loads_silently_and_its_sets_follow_the_served_scores(fitted, tmp_path, caplog):
    z, y, ts = fitted
    plain = _model_folder(tmp_path)
    ts.save_pretrained(tmp_path / "calibrator")
    ConformalPredictor("thr").fit(z, y, calibrator=ts).save_pretrained(tmp_path / "conformal")
    with caplog.at_level(logging.WARNING):
        model = load_calibrated_model(tmp_path)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    x = digits(slice(0, 64))[0]
    t = float(ts.log_temperature.detach().exp())
    with torch.no_grad():
        raw = plain(pixel_values=x).logits.double()
        served = model(pixel_values=x).logits.double()
    np.testing.assert_allclose(served.numpy(), (raw / t).numpy(), rtol=1e-5, atol=1e-5)
    # the sets by hand: THR keeps class k iff its calibrated probability >= 1 - q_hat, q_hat the
    # ceil((n+1)(1-alpha))-th smallest of 1 - p_y over the calibration rows
    p_cal = torch.softmax(z.double() / t, dim=1)
    scores = np.sort(1 - p_cal[torch.arange(len(y)), y].numpy())
    q_hat = scores[int(np.ceil((len(y) + 1) * 0.9)) - 1]
    assert float(model.conformal_predictor.q_hat) == pytest.approx(q_hat, abs=1e-6)
    probs = torch.softmax(raw / t, dim=1).numpy()
    want = probs >= 1 - q_hat
    empty = ~want.any(axis=1)  # allow_empty=False: an empty set gets the most probable class
    want[empty, probs[empty].argmax(1)] = True
    np.testing.assert_array_equal(np.asarray(model.conformal_predictor.predict_sets(raw, from_logits=True)), want)


def test_a_predictor_saved_before_the_record_loads_with_one_warning(tmp_path, caplog):
    _model_folder(tmp_path, num_labels=4)
    shutil.copytree(FIXTURES / "temperature_scaling", tmp_path / "calibrator")
    shutil.copytree(FIXTURES / "conformal_aps", tmp_path / "conformal")  # 0.1.0: no fingerprint, no calibrator
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            model = load_calibrated_model(tmp_path)
    said = [r for r in caplog.records if "Refit it behind calibrator/" in r.getMessage()]
    assert len(said) == 1 and model.conformal_predictor is not None
    assert "calibrator_fingerprint" not in model.conformal_predictor.fit_info_


def test_a_predictor_whose_own_calibrator_was_swapped_is_refused(fitted, tmp_path):
    z, y, ts = fitted
    ConformalPredictor("thr").fit(z, y, calibrator=ts).save_pretrained(tmp_path / "conformal")
    other = TemperatureScaling().fit(z[:200], y[:200], progress_bar=False)
    other.save_pretrained(tmp_path / "conformal" / "calibrator", overwrite=True)
    with pytest.raises(ValueError, match="not the one the conformal predictor was fitted behind"):
        load_conformal_predictor(tmp_path / "conformal")
    assert scores_fingerprint(other) != scores_fingerprint(ts)
