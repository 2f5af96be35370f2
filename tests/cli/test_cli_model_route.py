"""`hf-calibration report|fit --model M --dataset D`: tiny ViT and timm checkpoints over a saved dataset and an image
folder; numbers checked against the metrics and calibrators run on a bare model loop's logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _image_data import write_route

from hf_calibration.cli import main
from hf_calibration.io import inference
from hf_calibration.metrics import calibration_report


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_route(tmp_path_factory.mktemp("cli_route"))


def _reference(root, name: str, source: str, split: str):
    """Logits of a bare loop (Auto classes, processor, one forward pass) and the labels, read with datasets directly."""
    import datasets
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    if source == "saved":
        data, column, label = datasets.load_from_disk(str(root / "saved"))[split], "img", "digit"
    else:
        data, column, label = (
            datasets.load_dataset("imagefolder", data_dir=str(root / "folder"), split=split),
            "image",
            "label",
        )
    model = AutoModelForImageClassification.from_pretrained(root / name).eval()
    processor = AutoImageProcessor.from_pretrained(root / name)
    with torch.no_grad():
        logits = model(
            pixel_values=processor(images=[im.convert("RGB") for im in data[column]], return_tensors="pt")[
                "pixel_values"
            ]
        ).logits
    return logits.numpy(), np.asarray(data[label])


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _model_args(root, name, source, cache):
    return ["--model", root / name, "--dataset", root / source, "--batch-size", "8", "--cache-dir", cache]


@pytest.mark.parametrize("name, source", [("vit", "saved"), ("timm", "folder")])
def test_report_of_a_model_on_a_dataset(capsys, root, tmp_path, name, source):
    code, out, err = _run(
        capsys, "report", *_model_args(root, name, source, tmp_path / "cache"), "--split", "test", "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    logits, labels = _reference(root, name, source, "test")
    want = calibration_report(logits, labels)
    assert got["n"] == 37 and got["source"] == f"{root / name} on {root / source}[test]"
    for key in ("accuracy", "ece", "adaece", "smce", "classwise_ece", "brier", "nll"):
        assert got[key] == pytest.approx(want[key], abs=1e-5), key


def test_fit_then_report_with_the_calibrator(capsys, root, tmp_path, monkeypatch):
    """fit on the validation split (the default for fit: `val` finds `validation`), then report the test split through it."""
    from hf_calibration.calibrators import TemperatureScaling

    cache = tmp_path / "cache"
    code, out, err = _run(
        capsys, "fit", *_model_args(root, "vit", "saved", cache), "--method", "ts", "--out", tmp_path / "ts"
    )
    assert code == 0, err
    assert f"on {root / 'vit'} on {root / 'saved'}[validation] (logits, N = 61)" in out
    val_logits, val_labels = _reference(root, "vit", "saved", "validation")
    want_t = (
        TemperatureScaling()
        .fit(torch.from_numpy(val_logits), torch.from_numpy(val_labels))
        .temperature(torch.from_numpy(val_logits))
    )
    t = float(out.split("T = ")[1].split()[0])
    assert t == pytest.approx(float(want_t.reshape(-1)[0]), abs=2e-4)
    card = (tmp_path / "ts" / "README.md").read_text()
    assert f"logits of `{root / 'vit'}` on `{root / 'saved'}` (split `validation`)" in card
    assert f'from_pretrained("{root / "vit"}")' in card and f'load_calibrator("{tmp_path / "ts"}")' in card

    def no_inference(*args, **kwargs):
        raise AssertionError("ran the model although its logits are cached")

    _run(capsys, "report", *_model_args(root, "vit", "saved", cache), "--json")  # fills the cache for the test split
    monkeypatch.setattr(inference, "_run", no_inference)
    code, out, err = _run(
        capsys, "report", *_model_args(root, "vit", "saved", cache), "--calibrator", tmp_path / "ts", "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["source"].endswith("[test] + temperature_scaling")
    test_logits, test_labels = _reference(root, "vit", "saved", "test")
    want = calibration_report(test_logits / float(want_t.reshape(-1)[0]), test_labels)
    for key in ("accuracy", "ece", "adaece", "nll"):
        assert got[key] == pytest.approx(want[key], abs=1e-4), key


def test_fit_on_the_timm_model_over_an_image_folder_pushes_beside_the_model(capsys, root, tmp_path, monkeypatch):
    """--push-to-hub on the model route: the calibrator goes to REPO/calibrator with a card that loads both (Hub faked)."""
    import huggingface_hub

    calls = {}

    class FakeApi:
        def __init__(self, *args, **kwargs):
            pass

        def create_repo(self, repo_id, **kwargs):
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, **kwargs):
            calls.update(
                repo_id=repo_id,
                path_in_repo=path_in_repo,
                files=sorted(p.name for p in Path(folder_path).iterdir()),
                card=(Path(folder_path) / "README.md").read_text(),
            )
            return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    code, out, err = _run(
        capsys,
        "fit",
        *_model_args(root, "timm", "folder", tmp_path / "cache"),
        "--split",
        "validation",
        "--method",
        "smart",
        "--out",
        tmp_path / "smart",
        "--push-to-hub",
        "me/tiny-timm",
    )
    assert code == 0, err
    assert calls["repo_id"] == "me/tiny-timm" and calls["path_in_repo"] == "calibrator"
    assert {"config.json", "model.safetensors", "README.md"} <= set(calls["files"])
    assert 'AutoModelForImageClassification.from_pretrained("me/tiny-timm")' in calls["card"]
    assert 'load_calibrator("me/tiny-timm", subfolder="calibrator")' in calls["card"]
    assert "calibrator.attach(model)" in calls["card"]
    assert "pushed to https://huggingface.co/me/tiny-timm/tree/main/calibrator" in out
    # what was pushed is what a fit on the bare loop's logits gives (same seed)
    from hf_calibration import load_calibrator
    from hf_calibration.calibrators import SMARTCalibrator

    logits, labels = _reference(root, "timm", "folder", "validation")
    want = SMARTCalibrator().fit(torch.from_numpy(logits), torch.from_numpy(labels), progress_bar=False)
    got = load_calibrator(tmp_path / "smart")
    z = torch.from_numpy(logits)
    torch.testing.assert_close(got.temperature(z), want.temperature(z), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (
            ["report", "--logits", "x.npz", "--model", "m", "--dataset", "d"],
            2,
            "either --logits, or --model with --dataset",
        ),
        (["report", "--model", "m"], 2, "missing --dataset"),
        (["fit", "--dataset", "d", "--method", "ts", "--out", "o"], 2, "missing --model"),
        (["report", "--model", "m", "--dataset", "d", "--labels", "y.npy"], 2, "--labels goes with a .npy --logits"),
    ],
)
def test_malformed_inputs_are_usage_errors(capsys, argv, status, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == status and err.count("\n") == 1 and message in err


def test_bad_model_route_input_is_one_line(capsys, root, tmp_path):
    base = ["report", "--model", root / "vit", "--dataset", root / "saved", "--no-cache"]
    for extra, message in (
        (["--split", "train"], "it has ['test', 'validation']"),
        (["--split", "test", "--label-column", "nope"], "Expected --label-column to name"),
        (["--split", "test", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--split", "test", "--calibrator", tmp_path / "none"], "no such folder"),
    ):
        code, out, err = _run(capsys, *base, *extra)
        assert code == 1 and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_report_applies_a_calibrator_to_a_probability_file(capsys, root, tmp_path):
    """report --calibrator on probabilities: log p = z - logsumexp(z), so temperature T gives softmax(z / T) again."""
    logits, labels = _reference(root, "vit", "saved", "test")
    probs = torch.softmax(torch.from_numpy(logits).double(), 1).numpy()
    np.savez(tmp_path / "probs.npz", logits=probs, labels=labels)
    np.savez(tmp_path / "logits.npz", logits=logits, labels=labels)
    assert _run(capsys, "fit", "--logits", tmp_path / "logits.npz", "--method", "ts", "--out", tmp_path / "ts")[0] == 0
    from hf_calibration import load_calibrator

    t = float(load_calibrator(tmp_path / "ts").temperature(torch.from_numpy(logits)).reshape(-1)[0])
    want = calibration_report(logits / t, labels)
    for flags in (["--probs"], []):  # given, or detected
        code, out, err = _run(
            capsys, "report", "--logits", tmp_path / "probs.npz", *flags, "--calibrator", tmp_path / "ts", "--json"
        )
        assert code == 0, err
        got = json.loads(out)
        assert got["inputs"] == "logits" and got["source"].endswith("+ temperature_scaling")
        for key in ("ece", "adaece", "nll", "brier"):
            assert got[key] == pytest.approx(want[key], abs=1e-6), (flags, key)


def test_compare_on_a_model_and_a_dataset(capsys, root, tmp_path):
    """compare --model/--dataset (default split: validation) gives the table compare_calibrators gives on the bare logits."""
    from hf_calibration.calibrators import compare_calibrators

    code, out, err = _run(
        capsys,
        "compare",
        *_model_args(root, "vit", "folder", tmp_path / "cache"),
        "--methods",
        "ts",
        "--cv",
        "3",
        "--out",
        tmp_path / "diagrams",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["source"] == f"{root / 'vit'} on {root / 'folder'}[validation]"
    logits, labels = _reference(root, "vit", "folder", "validation")
    want = compare_calibrators(logits, labels, ["temperature_scaling"], cv=3, seed=0).to_dict()
    for method in ("uncalibrated", "temperature_scaling"):
        for metric in ("accuracy_change", "ece", "adaece", "nll"):
            assert got["table"][method][metric]["mean"] == pytest.approx(want[method][metric]["mean"], abs=1e-5), (
                method,
                metric,
            )
    assert (tmp_path / "diagrams" / "reliability_temperature_scaling.png").is_file()


def test_every_model_route_error_names_the_flag_and_the_cause(capsys, root, tmp_path, monkeypatch):
    # issue 23 item 10: Hub repo-id errors for missing folders, a transformers message for a label column given as the
    # image column, a bad class index for an unlabelled split, torch's message for --device tpu
    import datasets

    unlabelled = datasets.load_from_disk(str(root / "saved"))["test"].map(lambda row: {"digit": -1})
    datasets.DatasetDict({"test": unlabelled}).save_to_disk(str(tmp_path / "unlabelled"))
    capsys.readouterr()  # the map's progress bar
    monkeypatch.setattr(inference, "_run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model ran")))
    monkeypatch.chdir(tmp_path)
    model, saved = ["--model", str(root / "vit")], ["--dataset", str(root / "saved"), "--split", "test"]
    for argv, message in (
        (
            ["--model", "./nomodel", *saved],
            "Expected --model to be a folder or a Hub model id ('owner/name'), but there is no folder './nomodel'",
        ),
        (
            [*model, "--dataset", "./nodata"],
            "Expected --dataset to be a folder or a Hub dataset id ('owner/name'), but there is no folder './nodata'",
        ),
        (
            [*model, *saved, "--image-column", "digit"],
            "Expected --image-column to name a column of images, but 'digit' holds ClassLabel values",
        ),
        (
            [*model, "--dataset", str(tmp_path / "unlabelled")],
            "split 'test' has no labels (its 'digit' column is -1 there, an unlabelled split); choose a labelled one with --split",
        ),
        (
            [*model, *saved, "--device", "tpu"],
            "Expected --device to be a device such as 'cpu', 'cuda', 'cuda:1' or 'mps', but got 'tpu'",
        ),
    ):
        code, out, err = _run(capsys, "report", *argv, "--no-cache")
        assert code == 1 and err.count("\n") == 1 and message in err and "the model ran" not in err, (argv, err)
    if not torch.cuda.is_available():
        code, out, err = _run(capsys, "report", *model, *saved, "--device", "cuda", "--no-cache")
        assert (
            code == 1 and "--device to be a device this machine has, but got 'cuda' (cuda is not available here)" in err
        )
