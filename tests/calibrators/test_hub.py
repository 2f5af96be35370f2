"""Hub persistence: bit-exact round trips, strict loading, the card, and an intercepted push_to_hub."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from _calibrator_data import overconfident  # noqa: I001

from hf_calibration._core.checkpoints import CHECKPOINT_FORMAT_VERSION
from hf_calibration.calibrators import (
    SMARTCalibrator,
    TemperatureScaling,
    create_calibrator,
    list_calibrators,
    load_calibrator,
)
from hf_calibration.metrics._format import prepare, top_label


@pytest.fixture(scope="module")
def data():
    return overconfident(400, 6, seed=2)


@pytest.fixture(scope="module", params=list_calibrators("multiclass"))
def fitted(request, data):
    z, y = data
    kw = {"max_steps": 200} if request.param == "smart" else {}
    return create_calibrator(request.param, **kw).fit(z, y, progress_bar=False)


def test_round_trip_is_bit_exact(fitted, data, tmp_path):
    z, _ = data
    fitted.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"model.safetensors", "config.json", "README.md"}
    loaded = type(fitted).from_pretrained(tmp_path)
    assert loaded is not fitted and loaded.is_fitted
    for dtype in (torch.float32, torch.float64, torch.float16):
        zt = torch.from_numpy(z).to(dtype)
        assert torch.equal(loaded(zt), fitted(zt))
    assert loaded.fit_info_ == json.loads(json.dumps(fitted.fit_info_))
    generic = load_calibrator(tmp_path)
    assert type(generic) is type(fitted) and torch.equal(generic(torch.from_numpy(z)), fitted(torch.from_numpy(z)))


def test_config_and_card(fitted, data, tmp_path):
    import torchmetrics

    z, y = data
    fitted.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["calibrator"] == fitted.kind and config["format_version"] == CHECKPOINT_FORMAT_VERSION
    assert config["fit"]["num_samples"] == 400 and config["fit"]["objective"] == fitted.default_objective
    # the ECE recorded on the fit set, checked against torchmetrics (float64, no sample at confidence exactly 1)
    metric = torchmetrics.classification.MulticlassCalibrationError(num_classes=6, n_bins=15, norm="l1")
    before = metric(torch.softmax(torch.from_numpy(z).double(), 1), torch.from_numpy(y)).item()
    metric.reset()
    # the record is of the calibrated fit logits as given (float32)
    calibrated = fitted(torch.from_numpy(z))
    probs = torch.softmax(calibrated.double(), 1)
    conf = probs.max(1).values.numpy()
    near_edge = np.abs(conf[:, None] - np.arange(16) / 15).min() < 1e-6
    if not near_edge and bool((probs.max(1).values.float() < 1).all()):
        after = metric(probs, torch.from_numpy(y)).item()
    else:
        # piecewise-constant maps return ratios of counts, which sit on bin edges (1/3 = 5/15, 4/5 = 12/15), where
        # the last bit of a softmax decides the bin; and torchmetrics bins in float32, where a confidence of 1 - 1e-12
        # lands in its phantom bin. So: an independent bin loop over the metric module's own confidences.
        top = top_label(prepare(calibrated.numpy(), y, from_logits=True))
        after = _loop_ece(top.confidence, top.correct)
    assert config["fit"]["ece_before"] == pytest.approx(before, abs=1e-6)
    assert config["fit"]["ece_after"] == pytest.approx(after, abs=1e-6)
    card = (tmp_path / "README.md").read_text()
    assert "library_name: hf_calibration" in card
    assert fitted.default_objective in card and "400 samples" in card
    assert f"{100 * before:.2f}%" in card and f"{100 * after:.2f}%" in card


def _loop_ece(confidence, correct, n_bins=15):
    """Guo et al.'s ECE bin by bin: bins (b / B, (b + 1) / B], 0 in the first."""
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        members = (confidence > lo) & (confidence <= hi) | ((b == 0) & (confidence == 0))
        if members.any():
            total += members.mean() * abs(correct[members].mean() - confidence[members].mean())
    return total


def _save(cal, path):
    cal.save_pretrained(path)
    return path


def test_strict_load_refuses_mismatches(data, tmp_path):
    z, y = data
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    ts_dir, smart_dir = _save(ts, tmp_path / "ts"), _save(smart, tmp_path / "smart")
    with pytest.raises(ValueError, match="calibrator='temperature_scaling'"):
        SMARTCalibrator.from_pretrained(ts_dir)
    with pytest.raises(ValueError, match="calibrator='smart'"):
        TemperatureScaling.from_pretrained(smart_dir)
    with pytest.raises(ValueError, match="strictly"):
        SMARTCalibrator.from_pretrained(smart_dir, strict=False)

    def tamper(src, name, edit):
        import shutil

        dst = tmp_path / name
        shutil.copytree(src, dst)
        edit(dst)
        return dst

    def set_config(key, value):
        def edit(d):
            config = json.loads((d / "config.json").read_text())
            config[key] = value
            (d / "config.json").write_text(json.dumps(config))

        return edit

    with pytest.raises(ValueError, match="format_version"):
        SMARTCalibrator.from_pretrained(tamper(smart_dir, "v99", set_config("format_version", 99)))
    with pytest.raises(ValueError, match="does not match SMARTCalibrator"):  # 8 hidden units vs a 16-unit checkpoint
        SMARTCalibrator.from_pretrained(tamper(smart_dir, "h8", set_config("hidden_size", 8)))
    with pytest.raises(ValueError, match="corrupted"):  # truncated weights
        SMARTCalibrator.from_pretrained(
            tamper(
                smart_dir,
                "trunc",
                lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:60]),
            )
        )
    with pytest.raises(ValueError, match="not valid JSON"):
        SMARTCalibrator.from_pretrained(tamper(smart_dir, "badjson", lambda d: (d / "config.json").write_text("{oops")))
    with pytest.raises(ValueError, match="missing"):
        SMARTCalibrator.from_pretrained(tamper(smart_dir, "noweights", lambda d: (d / "model.safetensors").unlink()))
    with pytest.raises(ValueError, match="config.json"):
        SMARTCalibrator.from_pretrained(tamper(smart_dir, "noconfig", lambda d: (d / "config.json").unlink()))

    def nan_weights(d):
        from safetensors.torch import load_file, save_file

        tensors = load_file(d / "model.safetensors")
        tensors["hidden.bias"][0] = float("nan")
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt", "calibrator": "smart"})

    with pytest.raises(ValueError, match="NaN"):
        SMARTCalibrator.from_pretrained(tamper(smart_dir, "nan", nan_weights))
    with pytest.raises(ValueError, match="calibrator"):
        load_calibrator(tamper(smart_dir, "nokind", set_config("calibrator", "platt")))


def test_subfolder_beside_a_model(data, tmp_path):
    from _models import make_model

    z, y = data
    model = make_model("vit", num_labels=6)
    model.save_pretrained(tmp_path)
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    smart.save_pretrained(tmp_path / "calibrator")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vit"  # the model's config untouched
    loaded = load_calibrator(tmp_path, subfolder="calibrator")
    assert torch.equal(loaded(torch.from_numpy(z)), smart(torch.from_numpy(z)))
    with pytest.raises(ValueError, match="subfolder"):
        load_calibrator(tmp_path, subfolder="nope")


@pytest.mark.parametrize("path_in_repo", [None, "calibrator"])
def test_push_to_hub_is_intercepted(monkeypatch, data, path_in_repo):
    import os

    from huggingface_hub import HfApi

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    z, y = data
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    calls = {}

    class Repo:
        repo_id = "me/vit-calibrated"

    def create_repo(self, repo_id, **kwargs):
        calls["create_repo"] = repo_id
        return Repo()

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, **kwargs):
        from safetensors.torch import load_file

        names = sorted(os.listdir(folder_path))
        calls["upload"] = {
            "repo_id": repo_id,
            "files": names,
            "path_in_repo": path_in_repo,
            "config": json.load(open(os.path.join(folder_path, "config.json"))),
            "card": open(os.path.join(folder_path, "README.md")).read(),
            "weights": load_file(os.path.join(folder_path, "model.safetensors")),
        }
        return "https://huggingface.co/me/vit-calibrated/commit/0"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    url = (
        smart.push_to_hub("me/vit-calibrated", path_in_repo=path_in_repo)
        if path_in_repo
        else smart.push_to_hub("me/vit-calibrated")
    )
    assert url.endswith("/commit/0")
    upload = calls["upload"]
    assert calls["create_repo"] == "me/vit-calibrated" and upload["repo_id"] == "me/vit-calibrated"
    assert upload["files"] == ["README.md", "config.json", "model.safetensors"]
    assert upload["path_in_repo"] == path_in_repo
    assert upload["config"]["calibrator"] == "smart" and upload["config"]["fit"]["num_samples"] == 400
    assert "charbonnier_soft_ece" in upload["card"]
    for name, tensor in smart.state_dict().items():
        assert torch.equal(upload["weights"][name], tensor)


def test_unfitted_push_refused():
    from hf_calibration.calibrators import NotFittedError

    with pytest.raises(NotFittedError):
        SMARTCalibrator().push_to_hub("me/x")


def _copy_with(src, dst, *, config=None, tensors=None):
    """A copy of the checkpoint ``src`` with config entries and/or weight tensors replaced."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config:
        data = json.loads((dst / "config.json").read_text())
        for key, value in config.items():
            target = data
            *path, last = key.split(".")
            for part in path:
                target = target[part]
            target[last] = value
        (dst / "config.json").write_text(json.dumps(data))
    if tensors:
        weights = load_file(dst / "model.safetensors")
        weights.update(tensors)
        kind = json.loads((dst / "config.json").read_text())["calibrator"]
        save_file(weights, dst / "model.safetensors", metadata={"format": "pt", "calibrator": kind})
    return dst


def test_tampered_checkpoints_are_refused(data, tmp_path):
    z, y = data
    smart = _save(SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False), tmp_path / "smart")
    ts_model = TemperatureScaling().fit(z, y, progress_bar=False)
    ts = _save(ts_model, tmp_path / "ts")
    cases = [
        # margin_std = 0 reached numba's dispatcher as a SystemError at the first forward
        (
            _copy_with(smart, tmp_path / "std0", tensors={"margin_std": torch.tensor(0.0, dtype=torch.float64)}),
            "margin_std",
        ),
        (
            _copy_with(smart, tmp_path / "stdneg", tensors={"margin_std": torch.tensor(-1.0, dtype=torch.float64)}),
            "margin_std",
        ),
        # a string class count logged a formatting traceback at every forward
        (_copy_with(smart, tmp_path / "kstr", config={"fit.num_classes": "6"}), "fit.num_classes"),
        (_copy_with(ts, tmp_path / "k1", config={"fit.num_classes": 1}), "fit.num_classes"),
        # a log temperature beyond the fitted range was clamped silently
        (
            _copy_with(ts, tmp_path / "tbig", tensors={"log_temperature": torch.tensor(9.0, dtype=torch.float64)}),
            "log_temperature",
        ),
        # an in-range edit disagrees with the T the fit recorded
        (
            _copy_with(ts, tmp_path / "tedit", tensors={"log_temperature": torch.tensor(0.5, dtype=torch.float64)}),
            "do not match",
        ),
    ]
    for folder, fragment in cases:
        with pytest.raises(ValueError, match=fragment):
            load_calibrator(folder)
    # untouched checkpoints still load, and a fitted T at its bound is stored in range
    assert load_calibrator(ts).fitted_temperature == ts_model.fitted_temperature


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_temperature_resaved_in_a_narrower_float_still_loads(data, tmp_path, dtype):
    # issue 23 item 12: re-saved as float32, refused with "T = 5.08982, the fit record says T = 5.08982"
    z, y = data
    ts_model = TemperatureScaling().fit(z, y, progress_bar=False)
    ts = _save(ts_model, tmp_path / "ts")
    stored = torch.tensor(np.log(ts_model.fitted_temperature), dtype=torch.float64).to(dtype)
    narrow = _copy_with(ts, tmp_path / "narrow", tensors={"log_temperature": stored})
    loaded = load_calibrator(narrow)
    assert loaded.fitted_temperature == float(np.exp(float(stored)))  # what the file holds, read as is
    assert loaded.fitted_temperature == pytest.approx(ts_model.fitted_temperature, rel=1e-2)
    # one step of that float away is an edit, not a rounding
    nudged = torch.nextafter(stored, torch.tensor(10.0, dtype=dtype))
    with pytest.raises(ValueError, match="do not match their config"):
        load_calibrator(_copy_with(ts, tmp_path / "nudged", tensors={"log_temperature": nudged}))


def test_all_correct_fit_stores_the_bounded_temperature(tmp_path):
    from hf_calibration.calibrators.temperature import T_MIN

    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 200)
    z = (rng.normal(size=(200, 5)) + 6 * np.eye(5)[y]).astype(np.float32)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    assert ts.fitted_temperature == pytest.approx(T_MIN)
    assert load_calibrator(_save(ts, tmp_path / "ts")).fitted_temperature == ts.fitted_temperature


@pytest.mark.parametrize("name", ["./no-such-folder", "no/such/folder", "/definitely/not/here", "../x"])
def test_a_missing_local_folder_is_named(name, monkeypatch, tmp_path):
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"argument `name_or_path` to be a local folder or a Hub repo id .* no folder"):
        load_calibrator(name)
    with pytest.raises(ValueError, match=r"argument `pretrained_model_name_or_path`"):
        SMARTCalibrator.from_pretrained(name)
    with pytest.raises(ValueError, match="no folder"):
        load_calibrator(Path("no-such-folder"))  # a Path is always local


def test_a_file_or_a_bad_name_is_named(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        load_calibrator(tmp_path / "weights.bin")
    with pytest.raises(TypeError, match="name_or_path"):
        load_calibrator(3)
    with pytest.raises(TypeError, match="name_or_path"):
        load_calibrator("")


def test_a_repo_id_offline_and_uncached_says_so(monkeypatch, tmp_path):
    from hf_calibration._core.checkpoints import HubUnreachableError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(HubUnreachableError, match="'me/not-cached' is no local folder.*not in the local cache"):
        load_calibrator("me/not-cached", cache_dir=tmp_path / "cache")


# ----------------------------------------------------------------------------- files a user owns


def _snapshot(folder):
    """Every file directly in ``folder``, by name, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_save_refuses_a_non_empty_folder_unless_overwrite(data, tmp_path):
    z, y = data
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    smart.save_pretrained(tmp_path / "cal")
    before = _snapshot(tmp_path / "cal")
    with pytest.raises(
        ValueError, match=r"argument `save_directory` to be a new or empty folder.*holds a calibrator.*overwrite=True"
    ):
        ts.save_pretrained(tmp_path / "cal")
    assert _snapshot(tmp_path / "cal") == before
    # overwrite replaces the whole calibrator: the card describes the new weights (the mixin kept the old README)
    ts.save_pretrained(tmp_path / "cal", overwrite=True)
    card = (tmp_path / "cal" / "README.md").read_text()
    assert "TemperatureScaling calibrator" in card and "SMART" not in card and "temperature_scaling" in card
    assert json.loads((tmp_path / "cal" / "config.json").read_text())["calibrator"] == "temperature_scaling"
    assert load_calibrator(tmp_path / "cal").fitted_temperature == ts.fitted_temperature
    (tmp_path / "empty").mkdir()
    ts.save_pretrained(tmp_path / "empty")  # an existing empty folder is fine
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        ts.save_pretrained(tmp_path / "afile")
    with pytest.raises(TypeError, match="overwrite"):
        ts.save_pretrained(tmp_path / "new", overwrite="yes")


def test_save_never_touches_a_model_folder(data, tmp_path):
    from _models import make_model

    z, y = data
    make_model("vit", num_labels=6).save_pretrained(tmp_path / "model")
    before = _snapshot(tmp_path / "model")
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    for overwrite in (False, True):  # the mixin deleted the model's config.json and replaced its model.safetensors
        with pytest.raises(ValueError, match=r"holds a model's files \(config.json, model.safetensors\).*calibrator'"):
            ts.save_pretrained(tmp_path / "model", overwrite=overwrite)
    assert _snapshot(tmp_path / "model") == before
    (tmp_path / "weights_only").mkdir()
    (tmp_path / "weights_only" / "pytorch_model.bin").write_bytes(b"weights")
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        ts.save_pretrained(tmp_path / "weights_only", overwrite=True)
    ts.save_pretrained(tmp_path / "model" / "calibrator")  # the suggested place
    assert _snapshot(tmp_path / "model") == before


def test_overwrite_keeps_files_that_are_not_the_calibrators(data, tmp_path):
    z, y = data
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"1 file\(s\) \(notes.txt\)"):
        ts.save_pretrained(tmp_path)
    ts.save_pretrained(tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert {p.name for p in tmp_path.iterdir()} == {"notes.txt", "config.json", "model.safetensors", "README.md"}


def test_a_users_readme_is_never_replaced_or_deleted(data, tmp_path, caplog):
    # issue 23 item 5: the first save kept the user's README.md and silently wrote no card; the second deleted it
    z, y = data
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    (tmp_path / "README.md").write_text("# my project\n")
    for calibrator, title in ((smart, "SMARTCalibrator calibrator"), (ts, "TemperatureScaling calibrator")):
        with caplog.at_level("WARNING", logger="hf_calibration"):
            calibrator.save_pretrained(tmp_path, overwrite=True)
        assert (tmp_path / "README.md").read_text() == "# my project\n"
        assert "README.md that hf_calibration did not write: it is kept" in caplog.text
        card = (tmp_path / "README.hf_calibration.md").read_text()
        assert title in card and card.count("calibrator |") == 1  # the card of the weights saved now
        config = json.loads((tmp_path / "config.json").read_text())
        assert sorted(config["files"]) == ["README.hf_calibration.md", "model.safetensors"]
        assert all(
            config["files"][name] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
            for name in config["files"]
        )
        caplog.clear()
    assert load_calibrator(tmp_path).fitted_temperature == ts.fitted_temperature
    assert {p.name for p in tmp_path.iterdir()} == {
        "README.md",
        "README.hf_calibration.md",
        "config.json",
        "model.safetensors",
    }


def test_only_the_files_a_save_wrote_are_replaced(data, tmp_path):
    z, y = data
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    ts.save_pretrained(tmp_path / "a")
    (tmp_path / "a" / "README.md").write_text("edited by hand\n")  # the card, edited since: the user's now
    ts.save_pretrained(tmp_path / "a", overwrite=True)
    assert (tmp_path / "a" / "README.md").read_text() == "edited by hand\n"
    assert "TemperatureScaling calibrator" in (tmp_path / "a" / "README.hf_calibration.md").read_text()
    # weights that changed since the save are not replaced: nothing is written
    ts.save_pretrained(tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").write_bytes(b"someone else's weights")
    before = _snapshot(tmp_path / "b")
    with pytest.raises(ValueError, match="holds model.safetensors, which hf_calibration did not write"):
        ts.save_pretrained(tmp_path / "b", overwrite=True)
    assert _snapshot(tmp_path / "b") == before
    # a save from before the record (no `files`): its config and weights are the package's, its README.md is not
    ts.save_pretrained(tmp_path / "c")
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    del config["files"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(config))
    readme = (tmp_path / "c" / "README.md").read_bytes()
    ts.save_pretrained(tmp_path / "c", overwrite=True)
    assert (tmp_path / "c" / "README.md").read_bytes() == readme
    assert load_calibrator(tmp_path / "c").fitted_temperature == ts.fitted_temperature


# ----------------------------------------------------------------------------- push_to_hub: offline, dry run


@pytest.mark.parametrize("path_in_repo", [None, "calibrator"])
def test_push_offline_is_one_sentence_naming_the_folder(data, path_in_repo):
    import os
    from pathlib import Path

    from hf_calibration._core.checkpoints import HubUnreachableError

    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # huggingface_hub raises OfflineModeIsEnabled at create_repo
    z, y = data
    ts = TemperatureScaling().fit(z, y, progress_bar=False)
    with pytest.raises(
        HubUnreachableError, match="unreachable \\(offline mode is on: HF_HUB_OFFLINE=1\\); nothing was uploaded"
    ) as info:
        ts.push_to_hub("me/ts", path_in_repo=path_in_repo)
    assert isinstance(info.value, ConnectionError) and "\n" not in str(info.value)
    folder = Path(str(info.value).split("'")[-2])
    assert folder.name == (path_in_repo or folder.name) and {p.name for p in folder.iterdir()} == {
        "README.md",
        "config.json",
        "model.safetensors",
    }
    assert load_calibrator(folder).fitted_temperature == ts.fitted_temperature


def test_push_dry_run_builds_the_exact_folder_and_uploads_nothing(data, monkeypatch):
    from pathlib import Path

    from huggingface_hub import HfApi

    def no_network(*args, **kwargs):
        raise AssertionError("a dry run must not call the Hub")

    monkeypatch.setattr(HfApi, "create_repo", no_network)
    monkeypatch.setattr(HfApi, "upload_folder", no_network)
    z, y = data
    smart = SMARTCalibrator(max_steps=20).fit(z, y, progress_bar=False)
    folder = Path(smart.push_to_hub("me/vit-digits", path_in_repo="calibrator", dry_run=True))
    assert folder.name == "calibrator" and {p.name for p in folder.iterdir()} == {
        "README.md",
        "config.json",
        "model.safetensors",
    }
    loaded = load_calibrator(folder.parent, subfolder="calibrator")
    assert torch.equal(loaded(torch.from_numpy(z)), smart(torch.from_numpy(z)))
    for bad, error in ((("a/b/c",), ValueError), ((3,), TypeError)):
        with pytest.raises(error, match="repo_id"):
            smart.push_to_hub(*bad, dry_run=True)
    with pytest.raises(ValueError, match="path_in_repo"):
        smart.push_to_hub("me/x", path_in_repo="/", dry_run=True)


def test_a_dry_run_leaves_no_temporary_folder_behind(tmp_path):
    # issue 23 item 12: every dry run left an hf_calibration_push_* folder in the temporary directory
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
import numpy as np, os
from hf_calibration.calibrators import TemperatureScaling
rng = np.random.default_rng(0); y = rng.integers(0, 4, 200); z = 3 * rng.normal(size=(200, 4)) + 3 * np.eye(4)[y]
folder = TemperatureScaling().fit(z, y, progress_bar=False).push_to_hub("me/ts", path_in_repo="calibrator", dry_run=True)
print(folder, sorted(os.listdir(folder)))
"""
    import hf_calibration

    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(hf_calibration.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    folder, files = out.stdout.strip().split(" ", 1)
    assert (
        folder.startswith(str(tmp_path)) and files == "['README.md', 'config.json', 'model.safetensors']"
    )  # readable meanwhile
    assert not Path(folder).exists() and list(tmp_path.glob("hf_calibration_push_*")) == []


# ----------------------------------------------------------------------------- references on the card


VERIFIED_PAPER_URLS = {  # checked against the papers: Guo et al. 2017; SMART (Guo, Tao, Luo, Dong, Xu)
    "temperature_scaling": "https://arxiv.org/abs/1706.04599",
    "smart": "https://arxiv.org/abs/2506.23492",
    # Gupta & Ramdas (top-label binning), Gupta et al. (spline), Zadrozny & Elkan's KDD 2002 paper (isotonic)
    "histogram_binning": "https://arxiv.org/abs/2107.08353",
    "spline": "https://arxiv.org/abs/2006.12800",
    "isotonic": "https://doi.org/10.1145/775047.775151",
    "isotonic_ovr": "https://doi.org/10.1145/775047.775151",
    # vector scaling: Guo et al. 2017; matrix / Dirichlet with ODIR: Kull et al. 2019; ETS: Zhang et al. 2020 (Mix-n-Match);
    # PTS: Tomani et al. 2022 (its official code's README links it); CTS: Frenkel & Goldberger 2021 (EUSIPCO, no preprint)
    "vector_scaling": "https://arxiv.org/abs/1706.04599",
    "matrix_scaling": "https://arxiv.org/abs/1910.12656",
    "dirichlet": "https://arxiv.org/abs/1910.12656",
    "ets": "https://arxiv.org/abs/2003.07329",
    "pts": "https://arxiv.org/abs/2102.12182",
    "cts": "https://cris.iucc.ac.il/en/publications/network-calibration-by-class-based-temperature-scaling/",
    # SMS / SVS: Berta, Holzmüller, Jordan & Bach (AISTATS 2026), the arXiv link of probmetrics 1.3's own README
    "sms": "https://arxiv.org/abs/2511.03685",
    "svs": "https://arxiv.org/abs/2511.03685",
}


def test_card_links_only_verified_urls_and_names_the_package(fitted, tmp_path):
    import re

    fitted.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "pip install hf-calibration" in card and "github.com" not in card
    assert re.findall(r"https?://[^\s)>\]]+", card) == [VERIFIED_PAPER_URLS[fitted.kind]]
    assert fitted.paper_citation and fitted.paper_citation in card


@pytest.mark.parametrize(
    "kind,edit,field",
    [
        ("temperature_scaling", {"fit.ece_after": 0.001}, "fit.ece_after"),  # a number the card states, edited
        ("smart", {"fit.num_samples": 10}, "fit.num_samples"),
        ("platt", {"fit.task": "binary"}, "fit.task"),  # decides which labels predict() reads
        ("platt", {"smooth_targets": False}, "init.smooth_targets"),
    ],
)
def test_an_edited_config_is_refused(data, tmp_path, kind, edit, field):
    """config.json was trusted for everything the weights do not hold (the card's numbers, the task a Platt map was
    fitted for); the weights file now keeps a copy of the settings, and a config that says otherwise is refused."""
    z, y = data
    if kind == "platt":
        rng = np.random.default_rng(0)
        z = rng.normal(size=(300, 3))
        y = (rng.random((300, 3)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    kw = {"max_steps": 20} if kind == "smart" else {}
    saved = _save(create_calibrator(kind, **kw).fit(z, y, progress_bar=False), tmp_path / "saved")
    load_calibrator(saved)  # untouched: loads
    with pytest.raises(ValueError, match=r"config.json' does not match its weights \(" + field.replace(".", r"\.")):
        load_calibrator(_copy_with(saved, tmp_path / "edited", config=edit))
