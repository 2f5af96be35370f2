"""`hf-calibration fit|report|apply|conformal --model M --dataset D` on a text classifier (issue 54, item 2): a tiny
BERT folder (its tokenizer saved with it) over a saved text dataset; the numbers are checked against the calibrators
and metrics run on the model's own logits of the tokenized texts, computed here with transformers alone."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from _models import tiny_bert

from hf_calibration import load_calibrator
from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.cli import main
from hf_calibration.metrics import calibration_report

torch.set_num_threads(1)
PHRASES = ["good movie", "the plot was awful and long", "a great film", "bad", "short film", "long bad plot", "good"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """``bert/`` (model + tokenizer, a spread head) and ``text/`` (a saved DatasetDict: validation and test splits of
    premise / hypothesis pairs with ClassLabel labels)."""
    root = tmp_path_factory.mktemp("cli_text")
    model, tokenizer = tiny_bert(num_labels=3, seed=0)
    with torch.no_grad():
        model.classifier.weight.mul_(30.0)
    model.save_pretrained(root / "bert")
    tokenizer.save_pretrained(root / "bert")
    rng = np.random.default_rng(0)
    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
        }
    )

    def split(n):
        return datasets.Dataset.from_dict(
            {
                "premise": [PHRASES[i] for i in rng.integers(0, len(PHRASES), n)],
                "hypothesis": [PHRASES[i] for i in rng.integers(0, len(PHRASES), n)],
                "label": rng.integers(0, 3, n).tolist(),
            },
            features=features,
        )

    datasets.DatasetDict({"validation": split(60), "test": split(40)}).save_to_disk(str(root / "text"))
    return root


def _reference(root, split: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    data = datasets.load_from_disk(str(root / "text"))[split]
    model = AutoModelForSequenceClassification.from_pretrained(root / "bert").eval()
    tokenizer = AutoTokenizer.from_pretrained(root / "bert")
    with torch.no_grad():
        logits = model(
            **tokenizer(
                list(data["premise"]), list(data["hypothesis"]), padding=True, truncation=True, return_tensors="pt"
            )
        ).logits
    return logits.numpy(), np.asarray(data["label"])


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _model_args(root, tmp_path):
    return ["--model", root / "bert", "--dataset", root / "text", "--num-workers", "0", "--cache-dir", tmp_path / "c"]


def test_fit_on_a_text_model_and_its_card(capsys, root, tmp_path):
    code, out, err = _run(capsys, "fit", *_model_args(root, tmp_path), "--method", "ts", "--out", tmp_path / "ts")
    assert code == 0, err
    logits, labels = _reference(root, "validation")
    want = TemperatureScaling().fit(torch.from_numpy(logits), torch.from_numpy(labels), progress_bar=False)
    got = load_calibrator(tmp_path / "ts")
    np.testing.assert_allclose(
        float(got.log_temperature.detach()), float(want.log_temperature.detach()), rtol=0, atol=1e-5
    )
    card = (tmp_path / "ts" / "README.md").read_text()
    assert "- text-classification" in card and "AutoModelForSequenceClassification.from_pretrained(" in card
    assert "image" not in card


def test_report_and_apply_on_a_text_model(capsys, root, tmp_path):
    logits, labels = _reference(root, "test")
    code, out, err = _run(capsys, "report", *_model_args(root, tmp_path), "--split", "test", "--json")
    assert code == 0, err
    got, want = json.loads(out), calibration_report(logits, labels)
    assert got["n"] == 40
    for key in ("accuracy", "ece", "nll", "brier"):
        assert got[key] == pytest.approx(want[key], abs=1e-5), key
    calibrator = TemperatureScaling().fit(torch.from_numpy(logits), torch.from_numpy(labels), progress_bar=False)
    calibrator.save_pretrained(tmp_path / "ts")
    code, out, err = _run(
        capsys, "apply", "--calibrator", tmp_path / "ts", *_model_args(root, tmp_path), "--split", "test", "--json"
    )
    assert code == 0, err
    after = calibration_report(calibrator(torch.from_numpy(logits)).detach().numpy(), labels)
    reports = json.loads(out)["reports"]
    assert reports["temperature_scaling"]["ece"] == pytest.approx(after["ece"], abs=1e-5)
    assert reports["uncalibrated"]["ece"] == pytest.approx(want["ece"], abs=1e-5)


def test_conformal_on_a_text_model(capsys, root, tmp_path):
    from hf_calibration.conformal import ConformalPredictor

    code, out, err = _run(
        capsys, "conformal", *_model_args(root, tmp_path), "--method", "thr", "--alpha", "0.2", "--json"
    )
    assert code == 0, err
    logits, labels = _reference(root, "validation")
    want = ConformalPredictor(method="thr").fit(torch.from_numpy(logits), torch.from_numpy(labels), alpha=0.2)
    got = json.loads(out)
    assert got["num_samples"] == 60
    assert got["q_hat"] == pytest.approx(want.fit_info_["q_hat"], abs=1e-5)


def test_a_named_column_that_is_not_text_is_refused_by_its_flag(capsys, root, tmp_path):
    code, out, err = _run(capsys, "report", *_model_args(root, tmp_path), "--split", "test", "--input-column", "label")
    assert code != 0 and "--input-column" in err and "premise (Value)" in err
