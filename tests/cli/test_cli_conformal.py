"""`hf-calibration conformal`: the printed figures are the library's, files are saved where asked, bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.cli import main
from hf_calibration.conformal import ConformalPredictor, coverage, set_size


@pytest.fixture(scope="module")
def npz_file(tmp_path_factory):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 6, 1600)
    logits = (2.0 * (rng.standard_normal((1600, 6)) + 1.5 * np.eye(6)[labels])).astype(np.float32)
    path = tmp_path_factory.mktemp("logits") / "split.npz"
    np.savez(path, logits_val=logits[:800], labels_val=labels[:800], logits_test=logits[800:], labels_test=labels[800:])
    return path, logits, labels


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_figures_are_the_librarys(capsys, npz_file, tmp_path):
    path, z, y = npz_file
    code, out, err = _run(
        capsys,
        "conformal",
        "--logits",
        path,
        "--method",
        "aps",
        "--alpha",
        "0.2",
        "--seed",
        "4",
        "--test-split",
        "test",
        "--json",
        "--out",
        tmp_path / "cp",
    )
    assert code == 0, err
    result = json.loads(out)
    predictor = ConformalPredictor("aps", seed=4).fit(z[:800], y[:800], alpha=0.2)
    sets = predictor.predict_sets(z[800:])
    assert result["q_hat"] == float(predictor.q_hat) and result["num_samples"] == 800
    assert result["calibration"] == {
        "coverage": predictor.fit_info_["coverage"],
        "mean_set_size": predictor.fit_info_["mean_set_size"],
    }
    assert result["test"]["coverage"] == coverage(sets, y[800:]) and result["test"]["mean_set_size"] == set_size(sets)
    assert float(ConformalPredictor.from_pretrained(tmp_path / "cp").q_hat) == float(predictor.q_hat)


def test_table_with_a_calibrator_method(capsys, npz_file):
    path, z, y = npz_file
    code, out, err = _run(
        capsys, "conformal", "--logits", path, "--method", "raps", "--calibrator", "ts", "--test-split", "test"
    )
    assert code == 0, err
    predictor = ConformalPredictor("raps").fit(z[:800], y[:800], calibrator=TemperatureScaling())
    info = predictor.fit_info_
    assert (
        f"threshold {info['q_hat']:.6g} from 560 samples (240 held out to tune), k_reg = {info['k_reg']}, lambda = {info['penalty']}"
        in out
    )
    assert f"{info['coverage']:8.2%}" in out and "split.npz[test]" in out


def test_saved_calibrator_folder_and_push_dry_run(capsys, npz_file, tmp_path):
    path, z, y = npz_file
    ts = TemperatureScaling().fit(z[:400], y[:400], progress_bar=False)
    ts.save_pretrained(tmp_path / "ts")
    code, out, err = _run(
        capsys,
        "conformal",
        "--logits",
        path,
        "--method",
        "thr",
        "--calibrator",
        tmp_path / "ts",
        "--push-to-hub",
        "me/vit",
        "--dry-run",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    names = [entry.split(" (")[0] for entry in result["dry_run_files"]]
    assert names == [
        "README.md",
        "calibrator/README.md",
        "calibrator/config.json",
        "calibrator/model.safetensors",
        "config.json",
        "model.safetensors",
    ]
    assert result["repo_url"] == "https://huggingface.co/me/vit/tree/main/conformal" and "dry_run_folder" not in result


def test_dry_run_lists_what_would_be_uploaded_and_leaves_nothing(capsys, npz_file, tmp_path, monkeypatch):
    """Item 12: --dry-run printed a temporary folder that was already deleted when the command exited; it now lists the
    files (with their sizes, those of a save of the same predictor) and leaves no folder behind."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path, z, y = npz_file
    code, out, err = _run(
        capsys, "conformal", "--logits", path, "--method", "thr", "--push-to-hub", "me/vit", "--dry-run"
    )
    assert code == 0, err
    ConformalPredictor("thr").fit(z[:800], y[:800]).save_pretrained(tmp_path / "saved")
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "saved").iterdir()}
    listed = ", ".join(f"{name} ({size:,} bytes)" for name, size in sorted(sizes.items()) if name != "README.md")
    assert "would receive README.md (" in out and listed in out
    assert list((tmp_path / "tmp").iterdir()) == []  # nothing left, and no path printed that points at nothing


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--alpha", "1.5"], "`alpha`"),
        (["--alpha", "0.001"], "every set would hold every class"),
        (["--method", "aps", "--k-reg", "2"], "--k-reg and --penalty apply to --method raps only"),
        (["--method", "thr", "--not-randomized"], "thr has no randomised form"),
        (["--dry-run"], "--dry-run applies to --push-to-hub only"),
        (["--calibrator", "nonsense"], "neither a folder nor a calibrator method"),
    ],
)
def test_bad_input_is_one_line(capsys, npz_file, argv, message):
    path, _, _ = npz_file
    code, out, err = _run(capsys, "conformal", "--logits", path, *argv)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1


def test_out_is_checked_before_the_fit(capsys, npz_file, tmp_path):
    path, _, _ = npz_file
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code, _, err = _run(capsys, "conformal", "--logits", path, "--out", model)
    assert code == 1 and "model's files" in err and (model / "conformal").name in err
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
