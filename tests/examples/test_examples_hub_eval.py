"""examples/evaluate_metrics.py and examples/hub_calibrator.py, run offline with small settings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    if f"example_{name}" in sys.modules:
        return sys.modules[f"example_{name}"]
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models train fastest on one thread (and don't fight other processes for cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _reference_ece(logits, labels) -> float:
    from torchmetrics.functional.classification import multiclass_calibration_error

    z = torch.as_tensor(np.asarray(logits)).double()
    return float(
        multiclass_calibration_error(
            torch.softmax(z, 1), torch.as_tensor(np.asarray(labels)), z.shape[1], n_bins=15, norm="l1"
        )
    )


def _small(tmp_path, *extra):
    return ["--output_dir", str(tmp_path / "out"), "--num_train_epochs", "1", "--disable_tqdm", "true", *extra]


# ----------------------------------------------------------------------------- evaluate_metrics.py


@pytest.mark.parametrize("source, batched", [("package", False), ("repo", True)])
def test_evaluate_metrics_example(tmp_path, capsys, source, batched):
    example = _load("evaluate_metrics")
    argv = _small(tmp_path, "--max_train_samples", "96", "--max_eval_samples", "64", "--metric_source", source)
    if batched:
        argv += ["--batch_eval_metrics", "--per_device_eval_batch_size", "16"]  # 4 streamed batches
    result = example.main(argv)
    out = capsys.readouterr().out
    assert "1. evaluate ECE" in out and "2. evaluate.combine" in out and "3. Trainer.evaluate()" in out

    # the streamed evaluate metric and the combined one agree with torchmetrics on the same logits
    g = np.random.default_rng(42)  # TrainingArguments' default seed
    labels = g.integers(0, 10, 1000)
    logits = (3 * g.standard_normal((1000, 10)) + 4 * np.eye(10)[labels]).astype(np.float32)
    reference = _reference_ece(logits, labels)
    assert result["streamed_ece"] == pytest.approx(reference, abs=1e-6)
    assert result["combined"]["ece"] == pytest.approx(reference, abs=1e-6)
    assert set(result["combined"]) == {"ece", "adaece", "smce"}
    # Trainer's compute_metrics (whole or streamed) equals torchmetrics on Trainer.predict's logits
    assert result["logits"].shape == (64, 10)
    assert result["trainer"]["eval_ece"] == pytest.approx(_reference_ece(result["logits"], result["labels"]), abs=1e-6)
    assert 0 <= result["trainer"]["eval_smce"] <= 1 and 0 <= result["trainer"]["eval_adaece"] <= 1


def test_evaluate_metrics_example_takes_hub_names():
    example = _load("evaluate_metrics")
    script, training = example.parse(
        [
            "--dataset_name",
            "uoft-cs/cifar10",
            "--model_name_or_path",
            "google/vit-base-patch16-224",
            "--output_dir",
            "x",
            "--metric_source",
            "some-org",
        ]
    )
    assert script.dataset_name == "uoft-cs/cifar10" and script.model_name_or_path == "google/vit-base-patch16-224"
    assert training.remove_unused_columns is False  # the on-the-fly transform needs the image column
    with pytest.raises(ValueError, match="together"):
        example.parse(["--dataset_name", "uoft-cs/cifar10"])


# ----------------------------------------------------------------------------- hub_calibrator.py


@pytest.mark.parametrize(
    "arch, model_class", [("vit", "ViTForImageClassification"), ("swin", "SwinForImageClassification")]
)
def test_hub_calibrator_example(tmp_path, capsys, arch, model_class):
    example = _load("hub_calibrator")
    argv = _small(
        tmp_path,
        "--arch",
        arch,
        "--train_size",
        "96",
        "--max_calibration_samples",
        "60",
        "--max_test_samples",
        "64",
        "--pipeline_images",
        "3",
        "--push_to_hub_repo",
        "someone/digits-smart",
    )
    result = example.main(argv)
    out = capsys.readouterr().out
    assert type(result["model"]).__name__ == model_class

    # dry run (the default, and always under HF_HUB_OFFLINE): saved locally, nothing pushed
    folder = tmp_path / "out" / "calibrator"
    assert result["source"] == str(folder)
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in folder.iterdir()}
    assert "would upload to https://huggingface.co/someone/digits-smart/calibrator" in out

    # attached to the model, Trainer.predict returns z / T(z) with the loaded calibrator's temperatures
    before = torch.as_tensor(result["before"].predictions).double()
    after = torch.as_tensor(result["after"].predictions).double()
    t = result["calibrator"].temperature(before.float()).double()
    torch.testing.assert_close(after, before / t[:, None], rtol=1e-5, atol=1e-5)
    assert torch.equal(after.argmax(1), before.argmax(1))
    assert result["reports"]["SMART (attached)"].accuracy == result["reports"]["uncalibrated"].accuracy
    assert result["reports"]["uncalibrated"].ece == pytest.approx(
        _reference_ece(before, result["before"].label_ids), abs=1e-6
    )

    # pipeline scores on the first test images are the softmax of the same logits, without and with the calibrator
    for i, (b, a) in enumerate(zip(result["scores_before"], result["scores_after"])):
        p_before, p_after = torch.softmax(before[i], 0), torch.softmax(after[i], 0)
        assert b[0]["label"] == a[0]["label"] == str(int(p_before.argmax()))
        assert b[0]["score"] == pytest.approx(p_before.max().item(), abs=1e-5)
        assert a[0]["score"] == pytest.approx(p_after.max().item(), abs=1e-5)
    # detach() restored the model: its logits are the uncalibrated ones again
    with torch.no_grad():
        raw = result["model"](pixel_values=result["test"][0]["pixel_values"][None]).logits.double()
    torch.testing.assert_close(raw[0], before[0], rtol=1e-5, atol=1e-5)


def test_hub_calibrator_bad_arguments(tmp_path):
    example = _load("hub_calibrator")
    with pytest.raises(ValueError, match="arch"):
        example.main(_small(tmp_path, "--arch", "resnet"))
    with pytest.raises(ValueError, match="together"):
        example.parse(["--model_name_or_path", "google/vit-base-patch16-224"])
    script, training = example.parse(["--model_name_or_path", "a/b", "--dataset_name", "c/d", "--no_dry_run"])
    assert script.dry_run is False and training.remove_unused_columns is False
