"""The `evaluate` metric scripts: offline loading, add_batch/compute, combine, and inside a Trainer."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from _models import digits, digits_dataset, tiny_vit
from transformers import Trainer, TrainingArguments

import hf_calibration
from hf_calibration import metric_path
from hf_calibration.hub import list_metric_scripts
from hf_calibration.hub.dense_metric import DENSE_METRICS
from hf_calibration.metrics import adaece, calibration_report, debiased_ece, ece, smce

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
NAMES = ("ece", "adaece", "smce", "calibration", "debiased_ece")
TABLE_SCRIPTS = [name for name in list_metric_scripts() if name not in DENSE_METRICS]  # detection / pixel: own tests

# Hand-worked example shared with the scripts' docstrings.  Top-label confidences and correctness:
#   row 0: 0.90 correct, row 1: 0.75 correct, row 2: 0.70 wrong (label 0), row 3: 0.65 wrong (label 1).
# ECE, 2 bins: all four in (0.5, 1], accuracy 0.5, confidence 0.75 -> 0.25.
# ECE, 15 bins: every row in its own bin -> (0.10 + 0.25 + 0.70 + 0.65) / 4 = 0.425.
# AdaECE, 2 bins: {0.65, 0.70} (acc 0, conf 0.675) and {0.75, 0.90} (acc 1, conf 0.825)
#   -> 0.5 * 0.675 + 0.5 * 0.175 = 0.425.
# smCE: sorted r = a - p = (-0.65, -0.70, 0.25, 0.10), gaps (0.05, 0.05, 0.15).  Raising the last
#   two w helps, the first two hurts, and w_3 <= w_2 + 0.05, w_4 <= w_3 + 0.15: w = (-1, -1, -0.95,
#   -0.80) gives 0.65 + 0.70 - 0.2375 - 0.08 = 1.0325 (raising w_2 by t from -1 changes the value by
#   -0.70t + 0.25t + 0.10t < 0), so smCE = 1.0325 / 4 = 0.258125.
PROBS = [[0.9, 0.1], [0.25, 0.75], [0.3, 0.7], [0.65, 0.35]]
LABELS = [0, 1, 0, 1]


@pytest.fixture(scope="module")
def metrics() -> dict[str, evaluate.EvaluationModule]:
    return {name: evaluate.load(metric_path(name)) for name in NAMES}


def _random_logits(n: int = 300, k: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(scale=2.0, size=(n, k)).astype(np.float32), rng.integers(0, k, n)


def test_metric_path_and_list() -> None:
    assert set(NAMES) <= set(list_metric_scripts())
    for name in NAMES:
        path = Path(metric_path(name))
        assert (path / f"{name}.py").is_file()
        assert (path / "README.md").is_file() and (path / "app.py").is_file()
        assert (path / "requirements.txt").read_text().split() == ["hf-calibration"]
        assert path.resolve() == (REPO / "metrics" / name).resolve()  # the repo's metrics/ is the same folder
    assert hf_calibration.metric_path is metric_path
    with pytest.raises(ValueError, match="`name`"):
        metric_path("no_such_metric")


@pytest.mark.parametrize("name", NAMES)
def test_load_offline_from_both_paths(name: str, metrics) -> None:
    via_repo = evaluate.load(str(REPO / "metrics" / name))
    logits, labels = _random_logits()
    a = via_repo.compute(predictions=logits, references=labels)
    b = metrics[name].compute(predictions=logits, references=labels)
    assert a == b


def test_hand_worked_values(metrics) -> None:
    kw = dict(predictions=PROBS, references=LABELS, from_logits=False)
    assert metrics["ece"].compute(**kw, n_bins=2)["ece"] == pytest.approx(0.25, abs=1e-6)
    assert metrics["ece"].compute(**kw)["ece"] == pytest.approx(0.425, abs=1e-6)
    assert metrics["adaece"].compute(**kw, n_bins=2)["adaece"] == pytest.approx(0.425, abs=1e-6)
    assert metrics["smce"].compute(**kw)["smce"] == pytest.approx(0.258125, abs=1e-6)
    report = metrics["calibration"].compute(**kw, n_bins=2)
    assert report["calibration_n"] == 4 and report["calibration_accuracy"] == pytest.approx(0.5)
    assert report["calibration_ece"] == pytest.approx(0.25, abs=1e-6)
    assert report["calibration_adaece"] == pytest.approx(0.425, abs=1e-6)
    assert report["calibration_o_ece"] + report["calibration_u_ece"] == pytest.approx(
        report["calibration_ece"], abs=1e-12
    )
    assert report["calibration_smce"] == pytest.approx(0.258125, abs=1e-6)
    # debiased L2, 2 equal-mass bins {0.65, 0.70} (conf 0.675, acc 0) and {0.75, 0.90} (conf 0.825, acc 1): no label
    # variance in either, so sqrt((0.675^2 + 0.175^2) / 2)
    expected = np.sqrt((0.675**2 + 0.175**2) / 2)
    assert metrics["debiased_ece"].compute(**kw, n_bins=2)["debiased_ece"] == pytest.approx(expected, abs=1e-6)


def _bare(name: str, logits, labels, **kw):
    if name == "ece":
        return {"ece": ece(logits, labels, **kw)}
    if name == "adaece":
        return {"adaece": adaece(logits, labels, **kw)}
    if name == "smce":
        kw.pop("n_bins", None)
        return {"smce": smce(logits, labels, **kw)}
    if name == "debiased_ece":
        return {"debiased_ece": debiased_ece(logits, labels, **kw)}
    return {f"calibration_{key}": value for key, value in calibration_report(logits, labels, **kw).items()}


@pytest.mark.parametrize("name", NAMES)
def test_add_batch_equals_bare_function(name: str, metrics) -> None:
    logits, labels = _random_logits(seed=1)
    labels[[3, 50, 120]] = -100  # ignored rows travel through the Arrow table too
    metric = metrics[name]
    for rows in np.array_split(np.arange(len(labels)), 3):
        metric.add_batch(predictions=logits[rows], references=labels[rows])
    kw = {} if name == "smce" else {"n_bins": 10}
    got = metric.compute(**kw)
    expected = _bare(name, logits, labels, **kw)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize("name", NAMES)
def test_probabilities_and_torch_inputs(name: str, metrics) -> None:
    logits, labels = _random_logits(seed=2)
    probs = torch.softmax(torch.from_numpy(logits).double(), dim=1).float()
    got = metrics[name].compute(predictions=probs, references=torch.from_numpy(labels), from_logits=False)
    expected = _bare(name, probs.numpy(), labels, from_logits=False)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize("name", NAMES)
def test_probabilities_are_detected(name: str, metrics) -> None:
    # issue 11, case 1: probabilities without from_logits gave the ECE of softmax(probs)
    logits, labels = _random_logits(seed=4)
    probs = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
    got = metrics[name].compute(predictions=probs, references=labels)
    expected = _bare(name, logits.astype(np.float64), labels)  # the bare function on the logits
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("name", NAMES)
def test_script_docstring_examples(name: str, metrics) -> None:
    module = importlib.import_module(type(metrics[name]).__module__)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name", NAMES)
def test_ci_gives_the_functions_interval(name: str, metrics) -> None:
    logits, labels = _random_logits(seed=5)
    got = metrics[name].compute(predictions=logits, references=labels, ci=0.9, n_boot=100, seed=2)
    if name == "calibration":
        report = calibration_report(logits, labels, ci=0.9, n_boot=100, seed=2)
        expected = {f"calibration_{key}": value for key, value in report.items()}
    else:
        expected = _bare(name, logits, labels, ci=0.9, n_boot=100, seed=2)
    for key, value in expected.items():
        if key == "calibration_n":
            continue
        assert got[key] == pytest.approx(float(value), abs=1e-6)  # evaluate stores the predictions as float32
        assert got[f"{key}_ci_low"] == pytest.approx(value.low, abs=1e-6, nan_ok=True)  # NaN: MCE has none
        assert got[f"{key}_ci_high"] == pytest.approx(value.high, abs=1e-6, nan_ok=True)
    plain = metrics[name].compute(predictions=logits, references=labels)
    assert not any(key.endswith(("_ci_low", "_ci_high")) for key in plain)


def test_bad_input_is_reported(metrics) -> None:
    with pytest.raises(ValueError, match="n_bins"):
        metrics["ece"].compute(predictions=PROBS, references=LABELS, from_logits=False, n_bins=0)
    with pytest.raises(ValueError, match="sum to 1"):
        metrics["adaece"].compute(predictions=[[0.5, 0.9], [0.5, 0.5]], references=[0, 1], from_logits=False)
    with pytest.raises(ValueError, match="target"):
        metrics["smce"].compute(predictions=PROBS, references=[0, 1, 0, 2])  # label out of range


@pytest.mark.parametrize("name", NAMES)
def test_batches_of_probabilities_then_logits_are_refused(name: str, metrics) -> None:
    # issue 23 item 1: add_batch(probabilities) then add_batch(logits) was scored as logits, silently
    logits, labels = _random_logits(n=200, seed=5)
    probs = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
    metric = metrics[name]
    metric.add_batch(predictions=probs[:100], references=labels[:100])
    metric.add_batch(predictions=logits[100:], references=labels[100:])
    with pytest.raises(ValueError, match=r"either logits or probabilities.* row 100 is not"):
        metric.compute()
    metric.add_batch(predictions=probs[:100], references=labels[:100])  # the two kinds apart are fine
    metric.add_batch(predictions=probs[100:], references=labels[100:])
    expected = _bare(name, logits.astype(np.float64), labels)
    got = metric.compute()
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key


def test_combine_ece_and_adaece() -> None:
    combined = evaluate.combine([metric_path("ece"), metric_path("adaece")])
    logits, labels = _random_logits(seed=3)
    for rows in np.array_split(np.arange(len(labels)), 2):
        combined.add_batch(predictions=logits[rows], references=labels[rows])
    got = combined.compute()
    assert got == pytest.approx({"ece": ece(logits, labels), "adaece": adaece(logits, labels)}, rel=1e-12)
    hand = evaluate.combine([metric_path("ece"), metric_path("adaece")]).compute(
        predictions=PROBS, references=LABELS, from_logits=False, n_bins=2
    )
    assert hand == pytest.approx({"ece": 0.25, "adaece": 0.425}, abs=1e-6)


def test_combine_all_four_gives_distinct_clean_keys() -> None:
    # issue 11, case 14: `calibration` used the single metrics' key names, so combine renamed both
    combined = evaluate.combine([metric_path(name) for name in ("ece", "adaece", "smce", "calibration")])
    logits, labels = _random_logits(seed=5)
    got = combined.compute(predictions=logits, references=labels)
    report = calibration_report(logits, labels)
    assert set(got) == {"ece", "adaece", "smce"} | {f"calibration_{key}" for key in report}
    assert got["ece"] == pytest.approx(ece(logits, labels), rel=1e-12)
    assert got["adaece"] == pytest.approx(adaece(logits, labels), rel=1e-12)
    assert got["smce"] == pytest.approx(smce(logits, labels), rel=1e-12)
    for key, value in report.items():
        assert got[f"calibration_{key}"] == pytest.approx(value, rel=1e-12), key


# ----------------------------------------------------------------------------------- Trainer

EVAL_ROWS = slice(0, 80)


def _trainer(tmp_path, compute_metrics, **kw) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=32,  # 80 rows -> batches of 32, 32, 16
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **kw,
    )
    return Trainer(
        model=tiny_vit(seed=0), args=args, eval_dataset=digits_dataset(EVAL_ROWS), compute_metrics=compute_metrics
    )


def _expected_eval_logits() -> tuple[np.ndarray, np.ndarray]:
    model = tiny_vit(seed=0).eval()
    x, y = digits(EVAL_ROWS)
    with torch.no_grad():
        return model(pixel_values=x).logits.numpy(), y.numpy()


def test_inside_trainer_compute_metrics(tmp_path) -> None:
    metric = evaluate.combine([metric_path("ece"), metric_path("adaece"), metric_path("smce")])

    def compute_metrics(eval_pred):
        return metric.compute(predictions=eval_pred.predictions, references=eval_pred.label_ids)

    result = _trainer(tmp_path, compute_metrics).evaluate()
    logits, labels = _expected_eval_logits()
    assert result["eval_ece"] == pytest.approx(ece(logits, labels), abs=1e-6)
    assert result["eval_adaece"] == pytest.approx(adaece(logits, labels), abs=1e-6)
    assert result["eval_smce"] == pytest.approx(smce(logits, labels), abs=1e-6)


def test_inside_trainer_batch_eval_metrics(tmp_path) -> None:
    metric = evaluate.load(metric_path("calibration"))
    batches = []

    def compute_metrics(eval_pred, compute_result: bool):
        logits = eval_pred.predictions.detach().cpu().numpy()
        labels = eval_pred.label_ids.detach().cpu().numpy()
        batches.append(len(labels))
        metric.add_batch(predictions=logits, references=labels)
        if compute_result:
            report = metric.compute(n_bins=15)
            return {key: report[f"calibration_{key}"] for key in ("ece", "adaece", "smce", "nll")}
        return {}

    result = _trainer(tmp_path, compute_metrics, batch_eval_metrics=True).evaluate()
    assert batches == [32, 32, 16]  # called once per batch, computed at the end
    logits, labels = _expected_eval_logits()
    expected = calibration_report(logits, labels)
    for key in ("ece", "adaece", "smce", "nll"):
        assert result[f"eval_{key}"] == pytest.approx(expected[key], abs=1e-6), key


def test_scripts_take_multilabel_and_binary_heads(tmp_path, monkeypatch):
    """ece / adaece / calibration on a multi-label head (lists of 0/1 labels) and a binary one (one score each):
    the library's values, read from the shapes or named by task= / the configuration name."""
    import evaluate
    import numpy as np

    from hf_calibration import metric_path
    from hf_calibration.metrics import adaece, calibration_report, ece

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    rng = np.random.default_rng(0)
    y = (rng.random((200, 3)) < 0.4).astype(np.int64)
    z = (3.0 * (2 * y - 1) + 2.0 * rng.normal(size=y.shape)).astype(np.float32)
    got = evaluate.load(metric_path("ece")).compute(predictions=z.tolist(), references=y.tolist())
    assert got["ece"] == pytest.approx(ece(z, y), rel=1e-9)
    got = evaluate.load(metric_path("adaece"), "multilabel").compute(predictions=z.tolist(), references=y.tolist())
    assert got["adaece"] == pytest.approx(adaece(z, y), rel=1e-9)
    got = evaluate.load(metric_path("calibration")).compute(predictions=z.tolist(), references=y.tolist())
    report = calibration_report(z, y)
    assert any(v == pytest.approx(float(report.macro["nll"])) for k, v in got.items() if k.endswith("nll"))
    assert any(k.endswith("ece_micro") for k in got)
    binary = evaluate.load(metric_path("ece")).compute(
        predictions=z[:, 0].tolist(), references=y[:, 0].tolist(), task="binary"
    )
    assert binary["ece"] == pytest.approx(ece(z[:, 0], y[:, 0]), rel=1e-9)


def _function_results(name: str, preds, target, **kw) -> dict:
    """What the library function returns, keyed as the script keys it (the script's own code left out)."""
    if name == "calibration":
        report = calibration_report(preds, target, **kw)
        if hasattr(report, "micro"):
            values = {**report.macro, **{f"{key}_micro": value for key, value in report.micro.items()}}
        else:
            values = dict(report.items())
        return {f"calibration_{key}": float(value) for key, value in values.items()}
    from hf_calibration.metrics.table import get_metric

    return {name: float(get_metric(name).fn(preds, target, **kw))}


def _reference_inputs(name: str):
    """The suite's reference inputs the script's function takes: multi-class float32 and float64 logits, probabilities
    and ignored rows; multi-label and binary heads where the function scores them."""
    logits, labels = _random_logits(n=120, seed=6)
    labels[[2, 40]] = -100
    probs = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
    cases = {"float32 logits": (logits, labels), "float64 logits": (logits.astype(np.float64), labels)}
    cases["probabilities"] = (probs, labels)
    if name in ("ece", "adaece", "calibration"):
        rng = np.random.default_rng(6)
        y = (rng.random((120, 3)) < 0.4).astype(np.int64)
        cases["multilabel"] = (rng.normal(size=(120, 3)), y)
        cases["binary, boolean labels"] = (rng.normal(size=120), y[:, 0].astype(bool))
    return cases


@pytest.mark.parametrize("name", TABLE_SCRIPTS)
def test_every_script_is_its_function_bit_for_bit(name: str, metrics) -> None:
    metric = metrics[name] if name in metrics else evaluate.load(metric_path(name))
    for case, (preds, target) in _reference_inputs(name).items():
        got = metric.compute(predictions=preds, references=target)
        expected = _function_results(name, preds, target)
        assert got.keys() == expected.keys(), case
        for key, value in expected.items():  # exactly: no float32 cast on the way
            assert got[key] == value or (np.isnan(got[key]) and np.isnan(value)), (case, key)
    preds, target = _reference_inputs(name)["float64 logits"]
    for row, label in zip(preds[:40], target[:40]):  # one example at a time: the same
        metric.add(prediction=row, reference=label)
    assert metric.compute() == _function_results(name, preds[:40], target[:40])


@pytest.mark.parametrize("name", TABLE_SCRIPTS)
def test_every_script_refuses_what_its_function_refuses(name: str, metrics) -> None:
    metric = metrics[name] if name in metrics else evaluate.load(metric_path(name))
    logits, labels = _random_logits(n=40, seed=7)
    nan_logits = logits.copy()
    nan_logits[3, 1] = np.nan
    fractional = labels.astype(np.float64)
    fractional[4] = 1.7
    for preds, target in [
        (logits, labels % 2 == 0),  # boolean labels for a softmax head
        (nan_logits, labels),
        (logits, fractional),
    ]:  # each refusal in _compute costs the next call evaluate's 1 s cache-lock wait: three cases
        with pytest.raises((TypeError, ValueError)) as by_function:
            _function_results(name, preds, target)
        with pytest.raises(type(by_function.value), match=re.escape(str(by_function.value))):
            metric.compute(predictions=preds, references=target)
    with pytest.raises(ValueError, match="`predictions` to be non-empty"):
        metric.compute(predictions=[], references=[])
