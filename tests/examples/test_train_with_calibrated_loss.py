"""The training example runs end to end offline (tiny settings) and reports what the metrics compute."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_with_calibrated_loss.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_with_calibrated_loss", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _tiny(tmp_path, *extra):
    return [
        "--output_dir",
        str(tmp_path),
        "--num_train_epochs",
        "1",
        "--max_train_samples",
        "128",
        "--max_eval_samples",
        "64",
        "--per_device_train_batch_size",
        "32",
        "--hidden_size",
        "16",
        "--num_hidden_layers",
        "1",
        "--disable_tqdm",
        "true",
        "--use_cpu",
        "true",
        *extra,
    ]


def test_offline_demo_trains_and_reports(example, tmp_path, capsys):
    torch.set_num_threads(1)
    reports = example.main(_tiny(tmp_path, "--loss", "fedlas_mbls", "--loss_kwargs", '{"beta": 1.0}'))
    report = reports["fedlas_mbls"]
    assert report.n == 64
    printed = capsys.readouterr().out
    assert "| fedlas_mbls" in printed and "ECE (%)" in printed
    # the printed accuracy is the percentage of the report, two decimals
    assert f"{100 * report['accuracy']:.2f}" in printed


def test_offline_demo_with_maccal(example, tmp_path):
    torch.set_num_threads(1)
    reports = example.main(
        _tiny(tmp_path, "--loss", "ls", "--maccal", "--maccal_kwargs", '{"epochs": 2, "batch_size": 32}')
    )
    assert list(reports) == ["ls", "ls + MaC-Cal"]
    for r in reports.values():
        assert 0.0 <= r["ece"] <= 1.0 and np.isfinite(r["nll"])


def test_arguments(example):
    script, training = example.parse(["--loss", "flsd53"])
    assert script.loss == "flsd53" and training.learning_rate == example.DIGITS_DEFAULTS["learning_rate"]
    # a hub run keeps TrainingArguments' own defaults
    script, training = example.parse(["--dataset_name", "d", "--model_name_or_path", "m"])
    assert training.learning_rate == 5e-5 and training.remove_unused_columns is False
    with pytest.raises(ValueError, match="together"):
        example.parse(["--dataset_name", "d"])
