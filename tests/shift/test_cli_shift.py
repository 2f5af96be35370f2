"""`hf-calibration shift --model M --dataset D`: a tiny ViT over a saved digits dataset, checked against a bare loop
over images corrupted by `corruption_transform` and `shift_report` on its logits; the cache keeps one entry per
corruption x severity."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("cv2")
pytest.importorskip("imagecorruptions")

from _image_data import write_route  # noqa: E402

from hf_calibration.cli import main  # noqa: E402
from hf_calibration.shift import corruption_transform, shift_report  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_route(tmp_path_factory.mktemp("shift_route"))


def _bare_logits(root, split: str, corruption=None):
    import datasets
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    data = datasets.load_from_disk(str(root / "saved"))[split]
    if corruption is not None:
        data = data.with_transform(corruption_transform(*corruption, seed=0, image_column="img"))
    images = [row["img"].convert("RGB") for row in data]
    labels = np.asarray(datasets.load_from_disk(str(root / "saved"))[split]["digit"])
    model = AutoModelForImageClassification.from_pretrained(root / "vit").eval()
    processor = AutoImageProcessor.from_pretrained(root / "vit")
    with torch.no_grad():
        logits = model(pixel_values=processor(images=images, return_tensors="pt")["pixel_values"]).logits
    return logits.numpy(), labels


def test_shift_command_equals_shift_report_on_a_bare_loop(capsys, root, tmp_path):
    argv = ["shift", "--model", root / "vit", "--dataset", root / "saved", "--split", "test", "--val-split", "validation",
            "--calibrator", "ts", "--corruptions", "gaussian_noise,contrast", "--severities", "1,5",
            "--batch-size", "8", "--cache-dir", tmp_path / "cache", "--json", "--out", tmp_path / "out"]  # fmt: skip
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    shifted = {(c, s): _bare_logits(root, "test", (c, s)) for c in ("gaussian_noise", "contrast") for s in (1, 5)}
    want = shift_report(_bare_logits(root, "validation"), _bare_logits(root, "test"), shifted, calibrators=["ts"])
    assert len(got["rows"]) == len(want.rows) == 2 * 5
    for g, w in zip(got["rows"], want.rows):
        assert (g["method"], g["corruption"], g["severity"]) == (w["method"], w["corruption"], w["severity"])
        for key in ("accuracy", "ece", "adaece", "smce", "nll"):
            assert g[key] == pytest.approx(w[key], abs=1e-5), (g["method"], g["corruption"], key)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "ece_vs_severity.png",
        "shift_report.json",
        "shift_report.txt",
    ]
    # one cache entry per clean split and per corruption x severity: 2 + 4
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == 6
    # the outputs are never replaced silently; a second run with --overwrite reads every logit from the cache
    before = (tmp_path / "out" / "shift_report.json").read_text()
    assert main([str(a) for a in argv]) == 1 and "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "out" / "shift_report.json").read_text() == before
    assert main([str(a) for a in [*argv, "--overwrite"]]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == got["rows"]
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == 6


@pytest.mark.parametrize(
    "flag, value, message", [("--severities", "0-3", "severities"), ("--corruptions", "rain", "unknown corruption")]
)
def test_bad_arguments(capsys, root, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:  # a malformed command line: argparse's status 2, one line
        main(["shift", "--model", str(root / "vit"), "--dataset", str(root / "saved"), flag, value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_unknown_method_and_missing_split(capsys, root, tmp_path):
    base = ["shift", "--model", str(root / "vit"), "--dataset", str(root / "saved"), "--cache-dir", str(tmp_path)]
    assert main([*base, "--calibrator", "no_such_method"]) == 1
    assert (
        "--calibrator 'no_such_method' is neither a method name (ts, " in capsys.readouterr().err
    )  # issue 23 item 11: not "--method"
    assert main([*base, "--val-split", "train", "--corruptions", "fog", "--severities", "1"]) == 1
    assert "train" in capsys.readouterr().err
    assert main(["shift", "--logits", str(tmp_path / "z.npz")]) == 1 and "not --logits" in capsys.readouterr().err


def test_ood_dataset_without_labels(root, tmp_path):
    """model_shift_report with an OOD set that has no label column: its AUROC equals ood_metrics on bare-loop logits."""
    import datasets

    from hf_calibration.metrics import ood_metrics
    from hf_calibration.shift.model import model_shift_report

    noise = np.random.default_rng(0).integers(0, 256, (20, 8, 8, 3), dtype=np.uint8)
    from PIL import Image

    unlabeled = datasets.Dataset.from_dict(
        {"picture": [Image.fromarray(x) for x in noise]}, features=datasets.Features({"picture": datasets.Image()})
    )
    report = model_shift_report(root / "vit", str(root / "saved"), split="test", val_split="validation", calibrators=[],
                                corruptions=["contrast"], severities=[2], ood_dataset=unlabeled, batch_size=8, device="cpu")  # fmt: skip
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(root / "vit").eval()
    processor = AutoImageProcessor.from_pretrained(root / "vit")
    with torch.no_grad():
        z_ood = model(
            pixel_values=processor(images=list(unlabeled["picture"]), return_tensors="pt")["pixel_values"]
        ).logits.numpy()
    z_test, _ = _bare_logits(root, "test")
    for row in report.ood:
        assert row["auroc"] == pytest.approx(ood_metrics(z_test, z_ood, row["score"])["auroc"], abs=1e-6)
    assert [r["corruption"] for r in report.rows] == ["clean", "contrast"]


def _saved_ts(folder):
    """A temperature-scaling calibrator fitted on logits of its own (not the model's), saved to ``folder``."""
    from hf_calibration.calibrators import TemperatureScaling

    g = np.random.default_rng(5)
    labels = g.integers(0, 10, 200)
    logits = 3.0 * g.standard_normal((200, 10)) + 4.0 * np.eye(10)[labels]
    calibrator = TemperatureScaling().fit(torch.from_numpy(logits), torch.from_numpy(labels), progress_bar=False)
    calibrator.save_pretrained(folder)
    return calibrator


def test_a_saved_calibrator_is_labelled_by_its_folder_beside_the_method_of_its_kind(capsys, root, tmp_path):
    """`--calibrator temperature_scaling DIR` (DIR a saved TS): two rows, not 'appears twice' after every corruption ran."""
    saved = _saved_ts(tmp_path / "my-ts")
    argv = ["shift", "--model", root / "vit", "--dataset", root / "saved", "--val-split", "validation",
            "--calibrator", "temperature_scaling", tmp_path / "my-ts", "--corruptions", "contrast", "--severities", "2",
            "--batch-size", "8", "--cache-dir", tmp_path / "cache", "--json"]  # fmt: skip
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert got["methods"] == ["uncalibrated", "temperature_scaling", str(tmp_path / "my-ts")]
    z, y = _bare_logits(root, "test", ("contrast", 2))
    want = shift_report(_bare_logits(root, "validation"), _bare_logits(root, "test"), {("contrast", 2): (z, y)},
                        calibrators={"temperature_scaling": "ts", "saved": saved})  # fmt: skip
    for g, w in zip(got["rows"], want.rows):
        for key in ("accuracy", "ece", "nll"):
            assert g[key] == pytest.approx(w[key], abs=1e-5), (g["method"], key)


def test_calibrator_lists_are_checked_before_the_model_runs(capsys, root, tmp_path, monkeypatch):
    from hf_calibration.io import inference
    from hf_calibration.shift.model import model_shift_report

    def no_inference(*args, **kwargs):
        raise AssertionError("ran the model before checking the calibrators")

    monkeypatch.setattr(inference, "_run", no_inference)
    monkeypatch.chdir(tmp_path)
    _saved_ts(tmp_path / "ts")  # what `hf-calibration fit ... --out ts` leaves behind
    _saved_ts(tmp_path / "smart")
    base = [
        "shift",
        "--model",
        str(root / "vit"),
        "--dataset",
        str(root / "saved"),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    # issue 23 item 11: the spelling decides (a path is a folder, a bare method name the method), so these reach the
    # model (which raises here); the bare name beside a folder of that name says which it took
    for calibrators in (["temperature_scaling", "smart", "./smart"], ["ts"], [str(tmp_path / "ts"), "ts"]):
        assert main([*base, "--calibrator", *calibrators]) == 1
        err = capsys.readouterr().err
        assert "ran the model before checking the calibrators" in err, (calibrators, err)
    assert main([*base, "--calibrator", "ts"]) == 1
    assert (
        "--calibrator ts: the temperature_scaling method, fitted on --val-split; a folder ts is here too: write ./ts"
        in capsys.readouterr().err
    )
    for calibrators, message in (
        (["smart", "SMART"], "'SMART' and 'smart' name the same method"),
        (["ts", "temperature_scaling"], "'temperature_scaling' and 'ts' name the same method"),
        (["./ts", str(tmp_path / "ts")], "name the same folder"),
        (["./nothing"], "--calibrator './nothing': no such folder"),
    ):
        assert main([*base, "--calibrator", *calibrators]) == 1
        assert message in capsys.readouterr().err, calibrators
    with pytest.raises(ValueError, match="appears twice"):
        model_shift_report(root / "vit", str(root / "saved"), val_split="validation", calibrators=["ts", "ts"])


def test_out_refuses_a_model_folder_and_a_test_split_used_for_fitting_warns(capsys, root, tmp_path, monkeypatch):
    # issue 23 items 7 and 11: shift --out took a model's folder; --val-split test --split test said nothing
    from hf_calibration.io import inference

    monkeypatch.setattr(inference, "_run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model ran")))
    base = [
        "shift",
        "--model",
        str(root / "vit"),
        "--dataset",
        str(root / "saved"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--corruptions",
        "contrast",
        "--severities",
        "1",
    ]
    before = sorted(p.name for p in (root / "vit").iterdir())
    assert main([*base, "--out", str(root / "vit")]) == 1
    assert "--out" in (err := capsys.readouterr().err) and "is a model's folder" in err and "the model ran" not in err
    assert sorted(p.name for p in (root / "vit").iterdir()) == before
    assert main([*base, "--val-split", "test", "--split", "test"]) == 1  # the warning comes first, then the model runs
    err = capsys.readouterr().err
    assert "--val-split test is the evaluated --split test: the calibrators are fitted on the very samples" in err
    assert main([*base, "--val-split", "validation", "--split", "test"]) == 1
    assert "fitted on the very samples" not in capsys.readouterr().err
    assert main([*base, "--ood-dataset", "./no-ood-folder"]) == 1  # named by its own flag, not --dataset
    assert "Expected --ood-dataset to be a folder or a Hub dataset id" in capsys.readouterr().err
