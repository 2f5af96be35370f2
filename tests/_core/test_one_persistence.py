"""The one persistence (``hf_calibration._core.persistence``) for calibrators, conformal and multi-label predictors:
a NaN in a fit record saves and loads for all three; an edited config is refused for all three."""

import json
import math

import numpy as np
import pytest
import torch

from hf_calibration._core.persistence import Saved
from hf_calibration.calibrators import TemperatureScaling, load_calibrator
from hf_calibration.conformal import ConformalPredictor, MultiLabelConformalPredictor, load_conformal_predictor


@pytest.fixture(scope="module")
def adapted():
    """A temperature scaling adapted by ``adapt()`` whose record holds a NaN estimate (as an estimate on rows where
    ATC is undefined would)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 300)
    z = (3 * rng.normal(size=(300, 4)) + 4 * np.eye(4)[y]).astype(np.float32)
    calibrator = TemperatureScaling().fit(z, y, progress_bar=False)
    copy = calibrator.adapt(z[:50] + 0.5 * rng.normal(size=(50, 4)).astype(np.float32))
    copy.fit_info_["adaptation"]["estimated_accuracy"] = float("nan")
    return copy, z, y


def _edit(folder, path, value):
    config = json.loads((folder / "config.json").read_text())
    node = config["fit"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (folder / "config.json").write_text(json.dumps(config))


def test_an_adapt_record_with_a_nan_estimate_saves_and_loads(adapted, tmp_path):
    calibrator, z, _ = adapted
    calibrator.save_pretrained(tmp_path / "ts")
    assert "NaN" in (tmp_path / "ts" / "config.json").read_text()  # JSON's spelling, read back by json.loads
    loaded = load_calibrator(tmp_path / "ts")
    assert math.isnan(loaded.fit_info_["adaptation"]["estimated_accuracy"])
    # the adapted map divides the fitted map's logits by the recorded temperatures, one after the other
    temperature = calibrator.fit_info_["temperature"] * calibrator.fit_info_["adaptation"]["temperature"]
    expected = torch.softmax(torch.from_numpy(z).double() / temperature, dim=1)
    torch.testing.assert_close(loaded.predict_proba(z).double(), expected, rtol=1e-5, atol=1e-6)
    _edit(tmp_path / "ts", ("adaptation", "estimated_accuracy"), 0.5)  # the NaN replaced by a number: refused
    with pytest.raises(ValueError, match=r"does not match its weights \(fit\.adaptation\.estimated_accuracy"):
        load_calibrator(tmp_path / "ts")


def test_a_predictor_behind_that_calibrator_saves_and_loads(adapted, tmp_path):
    calibrator, z, y = adapted
    predictor = ConformalPredictor("thr").fit(z, y, alpha=0.1, calibrator=calibrator)
    predictor.save_pretrained(tmp_path / "cp")
    loaded = load_conformal_predictor(tmp_path / "cp")
    assert math.isnan(loaded.calibrator.fit_info_["adaptation"]["estimated_accuracy"])
    # THR by hand: the classes whose calibrated probability is at least 1 - q_hat
    probs = torch.softmax(calibrator(torch.from_numpy(z)).double(), dim=1).numpy()
    np.testing.assert_array_equal(np.asarray(loaded.predict_sets(z)), probs >= 1 - float(predictor.q_hat))


def test_a_multilabel_record_with_a_nan_saves_and_loads_and_an_edit_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(200, 3)) * 2
    y = (rng.random((200, 3)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    predictor = MultiLabelConformalPredictor().fit(z, y, alpha=0.2)
    predictor.fit_info_["false_negative_rate"] = float("nan")
    predictor.save_pretrained(tmp_path / "crc")
    loaded = load_conformal_predictor(tmp_path / "crc")
    assert math.isnan(loaded.fit_info_["false_negative_rate"])
    threshold = predictor.fit_info_["threshold"]
    np.testing.assert_array_equal(np.asarray(loaded.predict_sets(z)), 1 / (1 + np.exp(-z)) > threshold)
    _edit(tmp_path / "crc", ("threshold",), threshold / 2)
    with pytest.raises(ValueError, match=r"does not match its weights \(fit\.threshold"):
        load_conformal_predictor(tmp_path / "crc")


class _Bank(Saved):
    """The smallest saved object with an array whose size the fit decides (the ``shaped_buffers`` hook)."""

    checkpoint_key = checkpoint_what = save_subfolder = "calibrator"
    checkpoint_kind = "bank"
    shaped_buffers = ("bank",)

    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.register_buffer("bank", torch.zeros(0, width))
        self.fit_info_ = None

    @classmethod
    def _own_kinds(cls) -> str:
        return "bank"

    def _check_fitted(self) -> None:
        if self.fit_info_ is None:
            raise ValueError("not fitted")


def test_an_array_sized_by_the_fit_loads_at_its_saved_shape(tmp_path):
    bank = _Bank(width=3)
    bank.bank = torch.arange(12, dtype=torch.float32).reshape(4, 3)  # 4 rows: known only after the fit
    bank.fit_info_ = {"num_samples": 4}
    bank.save_pretrained(tmp_path / "bank")
    loaded = _Bank.from_pretrained(tmp_path / "bank")
    assert loaded.bank.shape == (4, 3) and loaded.bank.sum().item() == sum(range(12))


def test_a_multilabel_threshold_of_minus_infinity_saves_and_loads(tmp_path):
    """Three samples cannot control the risk at alpha = 0.2 (1 / (n + 1) > alpha): the threshold is -inf, every label
    predicted; JSON writes it as -Infinity, and the load takes it back rather than refusing a non-finite weight."""
    z = np.array([[1.0, -1.0], [0.5, 2.0], [-2.0, 0.0]])
    y = np.array([[1, 0], [0, 1], [1, 1]])
    with pytest.warns(UserWarning):
        predictor = MultiLabelConformalPredictor().fit(z, y, alpha=0.2)
    predictor.save_pretrained(tmp_path / "crc")
    loaded = load_conformal_predictor(tmp_path / "crc")
    assert float(loaded.threshold) == -math.inf and np.asarray(loaded.predict_sets(z)).all()
