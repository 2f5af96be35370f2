"""One input, every public entry point: inputs are read once, by one rule, wherever they come in.

The same bad labels (1.7 or NaN for a class index, 0.9 for a sigmoid head) get the same refusal from every entry
point; one-hot labels never switch a softmax head into a multi-label one without ``task=``; and an object fitted on
logits reads a row alone as it reads the same row in a batch (the bug fixed for ``ConformalPredictor`` in round 4 and
found again in the sigmoid calibrators and the multi-label conformal predictor).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from hf_calibration import AutoCalibrator, ConformalPredictor, metric_path
from hf_calibration.calibrators import PlattScaling, SigmoidTemperatureScaling, SMARTCalibrator, TemperatureScaling
from hf_calibration.conformal.multilabel import MultiLabelConformalPredictor
from hf_calibration.io import LogitsWriter, save_logits
from hf_calibration.io.logits_files import load_logits
from hf_calibration.metrics import (
    CalibrationAccumulator,
    adaece,
    brier,
    calibration_report,
    classwise_ece,
    ece,
    mce,
    nll,
    smce,
)

RNG = np.random.default_rng(0)
Z = (3 * RNG.normal(size=(60, 4))).astype(np.float32)  # softmax-head logits
Y = RNG.integers(0, 4, 60)
ZL = (2 * RNG.normal(size=(60, 3))).astype(np.float32)  # multi-label logits
YL = (RNG.random((60, 3)) < 0.4).astype(np.int64)


def _evaluate(config: str = "default"):
    evaluate = pytest.importorskip("evaluate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate.load(metric_path("ece"), config)


def _class_label_entries(tmp_path):
    """Every entry point that takes class indices of a softmax head: ``name -> fn(logits, labels)``."""
    return {
        "ece": lambda z, y: ece(z, y),
        "adaece": lambda z, y: adaece(z, y),
        "mce": lambda z, y: mce(z, y),
        "brier": lambda z, y: brier(z, y),
        "nll": lambda z, y: nll(z, y),
        "smce": lambda z, y: smce(z, y),
        "classwise_ece": lambda z, y: classwise_ece(z, y),
        "calibration_report": lambda z, y: calibration_report(z, y),
        "accumulator": lambda z, y: CalibrationAccumulator().update(z, y),
        "TemperatureScaling.fit": lambda z, y: TemperatureScaling().fit(z, y, progress_bar=False),
        "AutoCalibrator.fit": lambda z, y: AutoCalibrator().fit(z, y, progress_bar=False),
        "ConformalPredictor.fit": lambda z, y: ConformalPredictor("aps").fit(z, y, alpha=0.2),
        "evaluate ece": lambda z, y: _evaluate().compute(predictions=z, references=list(y)),
        "save_logits": lambda z, y: save_logits(tmp_path / "x.npz", z, y, overwrite=True),
        "LogitsWriter": lambda z, y: LogitsWriter(tmp_path / "x.npy", z.shape[0], z.shape[1], y, overwrite=True),
    }


@pytest.mark.parametrize("bad", [1.7, float("nan")])
def test_a_class_index_that_is_no_whole_number_is_refused_alike_everywhere(bad, tmp_path):
    y = Y.astype(np.float64)
    y[5] = bad
    for name, entry in _class_label_entries(tmp_path).items():
        with pytest.raises(ValueError, match=rf"to hold class indices.*found {bad}") as info:
            entry(Z, y)
        assert any(arg in str(info.value) for arg in ("`target`", "`labels`", "`references`")), name


def test_class_indices_stored_as_whole_floats_read_as_the_classes_they_name(tmp_path):
    y = Y.astype(np.float64)
    for name in ("ece", "brier", "calibration_report"):
        entry = _class_label_entries(tmp_path)[name]
        assert str(entry(Z, y)) == str(entry(Z, Y)), name
    assert _evaluate().compute(predictions=Z, references=list(y)) == _evaluate().compute(
        predictions=Z, references=list(Y)
    )


def _sigmoid_label_entries(tmp_path):
    return {
        "ece": lambda z, y: ece(z, y),
        "brier": lambda z, y: brier(z, y),
        "calibration_report": lambda z, y: calibration_report(z, y),
        "accumulator": lambda z, y: CalibrationAccumulator().update(z, y),
        "PlattScaling.fit": lambda z, y: PlattScaling().fit(z, y, progress_bar=False),
        "MultiLabelConformalPredictor.fit": lambda z, y: MultiLabelConformalPredictor().fit(z, y, alpha=0.2),
        "evaluate ece": lambda z, y: _evaluate("multilabel").compute(predictions=z, references=[list(r) for r in y]),
        "save_logits": lambda z, y: save_logits(tmp_path / "x.npz", z, y, overwrite=True),
    }


@pytest.mark.parametrize("bad", [0.9, float("nan")])
def test_a_sigmoid_label_that_is_not_0_or_1_is_refused_alike_everywhere(bad, tmp_path):
    y = YL.astype(np.float64)
    y[7, 1] = bad
    for name, entry in _sigmoid_label_entries(tmp_path).items():
        with pytest.raises(ValueError, match=rf"found {bad}") as info:
            entry(ZL, y)
        assert any(arg in str(info.value) for arg in ("`target`", "`labels`", "`references`")), name


def test_one_hot_labels_never_switch_the_head_without_task(tmp_path):
    """``np.eye(K)[y]`` beside softmax logits was read as a multi-label head with no word (ECE 0.444 -> 0.339)."""
    one_hot = np.eye(4, dtype=np.int64)[Y]
    entries = {
        "ece": lambda: ece(Z, one_hot),
        "adaece": lambda: adaece(Z, one_hot),
        "brier": lambda: brier(Z, one_hot),
        "nll": lambda: nll(Z, one_hot),
        "calibration_report": lambda: calibration_report(Z, one_hot),
        "accumulator": lambda: CalibrationAccumulator().update(Z, one_hot),
        "AutoCalibrator.fit": lambda: AutoCalibrator().fit(Z, one_hot, progress_bar=False),
        "evaluate ece": lambda: _evaluate().compute(predictions=Z, references=[list(r) for r in one_hot]),
        "load_logits": lambda: load_logits(save_logits(tmp_path / "onehot.npz", Z, one_hot, overwrite=True)),
    }
    for name, entry in entries.items():
        with pytest.raises(ValueError, match=r"task='multiclass'.*task='multilabel'"):
            entry()
            pytest.fail(f"{name} read one-hot labels without task=")
    # with task= the caller decides: the multi-label reading is then what was asked for
    per_label = [ece(Z[:, k], one_hot[:, k], task="binary") for k in range(4)]
    assert ece(Z, one_hot, task="multilabel") == pytest.approx(np.mean(per_label), rel=1e-12)
    with pytest.raises(ValueError, match="multi-label"):
        ece(Z, one_hot, task="multiclass")


def test_multi_hot_labels_beside_softmax_probability_rows_are_refused():
    p = torch.softmax(torch.from_numpy(ZL), 1).numpy()  # rows summing to 1: a softmax head's output
    with pytest.raises(ValueError, match="probability vector"):
        ece(p, YL)
    assert np.isfinite(ece(p, YL, task="multilabel"))


@pytest.mark.parametrize("make", [TemperatureScaling, SMARTCalibrator], ids=["temperature_scaling", "smart"])
def test_a_softmax_calibrator_reads_a_row_alone_as_in_a_batch(make):
    calibrator = make().fit(Z, Y, progress_bar=False)
    row = np.array([[0.2, 0.3, 0.1, 0.4]], dtype=np.float32)  # logits that happen to sum to 1
    batch = np.vstack([row, Z[:5]])
    with pytest.warns(UserWarning, match="fitted on logits: they are treated as logits"):
        alone = calibrator.predict_proba(row)
    torch.testing.assert_close(alone, calibrator.predict_proba(batch)[:1])
    # an explicit from_logits wins over the record
    p = torch.softmax(torch.from_numpy(Z[:5]), 1).numpy()
    torch.testing.assert_close(
        calibrator.predict_proba(p, from_logits=False), calibrator.predict_proba(Z[:5]), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "make", [PlattScaling, SigmoidTemperatureScaling], ids=["platt", "sigmoid_temperature_scaling"]
)
def test_a_sigmoid_calibrator_reads_a_row_alone_as_in_a_batch(make):
    """The issue's case: Platt gave [0.0871, 0.7854, 0.2886] for the row alone and [0.3323, 0.4927, 0.3981] in a batch."""
    rng = np.random.default_rng(0)
    labels = (rng.random((1000, 3)) < 0.3).astype(int)
    logits = 2 * (2 * labels - 1) + 2 * rng.normal(size=labels.shape)
    calibrator = make().fit(logits, labels, progress_bar=False)
    row = np.array([[0.2, 0.9, 0.5]])
    torch.testing.assert_close(
        calibrator.predict_proba(row), calibrator.predict_proba(np.vstack([row, logits[:5]]))[:1]
    )
    assert calibrator.fit_info_["input"] == "logits"
    binary = make().fit(logits[:, 0], labels[:, 0], progress_bar=False)
    torch.testing.assert_close(
        binary(torch.tensor([0.4], dtype=torch.float64)),
        binary(torch.tensor([0.4, 3.0, -2.0], dtype=torch.float64))[:1],
    )


def test_a_sigmoid_calibrator_fitted_on_probabilities_refuses_logits_naming_from_logits():
    rng = np.random.default_rng(1)
    labels = (rng.random((500, 3)) < 0.3).astype(int)
    probs = 1 / (1 + np.exp(-(2 * (2 * labels - 1) + 2 * rng.normal(size=labels.shape))))
    calibrator = PlattScaling().fit(probs, labels, progress_bar=False)
    assert calibrator.fit_info_["input"] == "probabilities"
    with pytest.raises(ValueError, match=r"fitted on.*from_logits=True"):
        calibrator.predict_proba(np.array([[2.0, -1.0, 0.5]]))
    torch.testing.assert_close(
        calibrator.predict_proba(np.array([[2.0, -1.0, 0.5]]), from_logits=True),
        calibrator.predict_proba(1 / (1 + np.exp(-np.array([[2.0, -1.0, 0.5]])))),
        atol=1e-9,
        rtol=1e-9,
    )


def test_conformal_predictors_read_a_row_alone_as_in_a_batch():
    rng = np.random.default_rng(2)
    labels = (rng.random((400, 3)) < 0.3).astype(int)
    logits = 2 * (2 * labels - 1) + 2 * rng.normal(size=labels.shape)
    multilabel = MultiLabelConformalPredictor().fit(logits, labels, alpha=0.2)
    row = np.array([[0.2, 0.9, 0.5]])
    np.testing.assert_array_equal(
        multilabel.predict_sets(row), multilabel.predict_sets(np.vstack([row, logits[:5]]))[:1]
    )
    probs = 1 / (1 + np.exp(-logits))
    assert MultiLabelConformalPredictor().fit(probs, labels, alpha=0.2).fit_info_["input"] == "probabilities"
    softmax = ConformalPredictor("thr").fit(Z, Y, alpha=0.2)
    srow = np.array([[0.2, 0.3, 0.1, 0.4]], dtype=np.float32)
    with pytest.warns(UserWarning, match="treated as logits"):
        alone = softmax.predict_sets(srow)
    np.testing.assert_array_equal(alone, softmax.predict_sets(np.vstack([srow, Z[:5]]))[:1])


def test_a_one_logit_binary_conformal_predictor_reads_a_logit_alone_as_in_a_batch():
    """One logit of 0.3 alone was read as the probability 0.3 (set {0}), in a batch as a logit (set {1})."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 500)
    z = (2 * y - 1) * 1.5 + rng.normal(size=500)
    predictor = ConformalPredictor("thr").fit(z, y, alpha=0.1)
    alone = predictor.predict_sets(np.array([0.3]))
    np.testing.assert_array_equal(alone, predictor.predict_sets(np.array([0.3, 5.0]))[:1])
    # by hand: the two softmax logits [0, 0.3] give class 1 probability sigmoid(0.3) = 0.574; THR keeps p >= 1 - q_hat
    p1 = 1 / (1 + np.exp(-0.3))
    np.testing.assert_array_equal(alone[0], [1 - p1 >= 1 - float(predictor.q_hat), p1 >= 1 - float(predictor.q_hat)])
    probabilities = ConformalPredictor("thr").fit(1 / (1 + np.exp(-z)), y, alpha=0.1)
    with pytest.raises(ValueError, match="from_logits=True"):
        probabilities.predict_sets(np.array([3.0]))


def test_the_accumulator_names_what_it_read_not_an_argument_the_user_never_passed():
    """One multi-label row of logits in [0, 1] reads as probabilities; the next batch of logits failed citing
    ``from_logits=False``, which the user never passed."""
    acc = CalibrationAccumulator()
    acc.update(np.array([[0.2, 0.9, 0.5]]), np.array([[0, 1, 1]]))
    with pytest.raises(ValueError, match=r"first batch was read as probabilities.*from_logits=True") as info:
        acc.update(ZL, YL)
    assert "(from_logits=False)" not in str(info.value)
    explicit = CalibrationAccumulator(from_logits=True)
    explicit.update(np.array([[0.2, 0.9, 0.5]]), np.array([[0, 1, 1]]))
    explicit.update(ZL, YL)
    assert explicit.compute()["ece"] == pytest.approx(
        ece(np.vstack([[[0.2, 0.9, 0.5]], ZL]), np.vstack([[[0, 1, 1]], YL]), from_logits=True)
    )


def test_a_datasets_column_is_read_as_its_values():
    """``dataset["label"]`` is a ``datasets`` ``Column`` (a Sequence, not a list) since datasets 4: a metric, a fit
    and the evaluate script read it as the labels it holds (it was refused: "got Column"). The reference: torchmetrics."""
    datasets = pytest.importorskip("datasets")

    column = datasets.Dataset.from_dict({"label": Y.tolist(), "logits": Z.tolist()})["label"]
    assert not isinstance(column, (list, tuple, np.ndarray))
    z = Z.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    conf, hit = p.max(1), (p.argmax(1) == Y)
    bins = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)  # (i/15, (i+1)/15]
    expected = sum(abs(conf[bins == b].mean() - hit[bins == b].mean()) * (bins == b).mean() for b in np.unique(bins))
    assert ece(z, column) == pytest.approx(expected, rel=1e-12)
    assert TemperatureScaling().fit(Z, column).fitted_temperature == TemperatureScaling().fit(Z, Y).fitted_temperature
    with pytest.raises(TypeError, match="`target`|`references`|`labels`"):
        ece(Z, "0123")
