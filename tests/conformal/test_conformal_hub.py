"""Saving, loading and pushing a ConformalPredictor (and its calibrator): exact round trips, the card, files a user owns."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _conformal_data import synthetic

from hf_calibration.calibrators import TemperatureScaling, load_calibrator
from hf_calibration.conformal import ConformalPredictor

FILES = {"README.md", "config.json", "model.safetensors"}


@pytest.fixture(scope="module")
def data():
    z, y = synthetic(2400, 10, seed=1)
    return z[:1200], y[:1200], z[1200:], y[1200:]


def test_round_trip_repeats_the_predictions(data, tmp_path):
    z, y, zt, _ = data
    predictor = ConformalPredictor("raps", seed=3).fit(z, y, alpha=0.1)
    first = [predictor.predict_sets(zt) for _ in range(2)]  # the stream's first draws after the fit
    predictor.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == FILES
    loaded = ConformalPredictor.from_pretrained(tmp_path)
    assert loaded.method == "raps" and loaded.seed == 3 and float(loaded.q_hat) == float(predictor.q_hat)
    assert loaded.fit_info_ == json.loads(json.dumps(predictor.fit_info_))
    for expected in first:  # a loaded predictor restarts the stream: the same randomised sets, call after call
        assert np.array_equal(loaded.predict_sets(zt), expected)
    assert not np.array_equal(first[0], first[1])


TASKS = {  # pipeline task: (the model saved beside conformal/: config class, architecture; its Auto class; card words)
    "image-classification": ("ViTConfig", "ViTForImageClassification", "AutoModelForImageClassification", "images"),
    "text-classification": (
        "BertConfig",
        "BertForSequenceClassification",
        "AutoModelForSequenceClassification",
        "texts",
    ),
    "audio-classification": (
        "Wav2Vec2Config",
        "Wav2Vec2ForSequenceClassification",
        "AutoModelForAudioClassification",
        "audio clips",
    ),
    "video-classification": (
        "VideoMAEConfig",
        "VideoMAEForVideoClassification",
        "AutoModelForVideoClassification",
        "videos",
    ),
}


@pytest.mark.parametrize("task", list(TASKS))
def test_the_cards_name_the_modality_of_the_model_beside_them(task, data, tmp_path):
    """Saved in a model's ``conformal/``, the cards (sets, multi-label sets, their calibrators) take the model's task from
    its ``config.json``: tags, words and the snippet; no other task is named. Given alone, the task is
    ``model_card_kwargs["pipeline_task"]``."""
    import transformers
    from huggingface_hub import ModelCard

    from hf_calibration.conformal import MultiLabelConformalPredictor

    config_class, architecture, auto_class, inputs = TASKS[task]
    config = getattr(transformers, config_class)(num_labels=10, architectures=[architecture])
    config.save_pretrained(tmp_path)  # a model's folder: its config.json names the architecture
    z, y, _, _ = data
    calibrator = TemperatureScaling().fit(z, y, progress_bar=False)
    ConformalPredictor("thr").fit(z, y, alpha=0.1, calibrator=calibrator).save_pretrained(tmp_path / "conformal")
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (300, 4), generator=g)
    multi = MultiLabelConformalPredictor().fit(torch.randn(300, 4, generator=g) + 2 * labels, labels, alpha=0.2)
    multi.save_pretrained(tmp_path / "multi", model_card_kwargs={"pipeline_task": task})
    for card_path in ("conformal", "conformal/calibrator", "multi"):
        card = ModelCard.load(tmp_path / card_path / "README.md")
        assert {t for t in card.data.tags if t.endswith("-classification")} == {task}, card_path
        others = [t for t in TASKS if t != task]
        assert not any(other in card.text for other in others), card_path
    sets_card = (tmp_path / "conformal" / "README.md").read_text()
    assert f"1200 calibration {inputs}" in sets_card and f'pipeline("{task}", model=' in sets_card
    assert "hf_calibration.pipeline(model=" in sets_card
    assert auto_class in (tmp_path / "conformal" / "calibrator" / "README.md").read_text()
    assert f"300 calibration {inputs}" in (tmp_path / "multi" / "README.md").read_text()


def test_a_card_without_a_model_names_no_task(data, tmp_path):
    from huggingface_hub import ModelCard

    z, y, _, _ = data
    ConformalPredictor("thr").fit(z, y, alpha=0.1).save_pretrained(tmp_path / "alone")
    card = ModelCard.load(tmp_path / "alone" / "README.md")
    assert not [t for t in card.data.tags if t.endswith("-classification")]
    assert "-classification" not in card.text and "hf_calibration.pipeline(model=" in card.text
    with pytest.raises(ValueError, match="pipeline_task"):
        ConformalPredictor("thr").fit(z, y, alpha=0.1).save_pretrained(
            tmp_path / "bad", model_card_kwargs={"pipeline_task": "object-detection"}
        )
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_the_card_states_the_fit_and_the_guarantee(data, tmp_path):
    z, y, _, _ = data
    exact = ConformalPredictor("aps", allow_empty=True).fit(z, y, alpha=0.1)
    exact.save_pretrained(tmp_path / "exact")
    card = (tmp_path / "exact" / "README.md").read_text()
    info = exact.fit_info_
    assert f"{100 * info['coverage']:.2f}%" in card and f"{info['mean_set_size']:.3f} of 10 classes" in card
    assert "at least 1 - alpha = 0.9" in card and f"at most 1 - alpha + 1/(n+1) = {0.9 + 1 / 1201:.4g}" in card
    assert (
        "1200 calibration inputs" in card and "library_name: hf_calibration" in card and "conformal-prediction" in card
    )
    assert (
        "(the 1081st smallest of the 1200 calibration scores)" in card and "| checkpoint format | 1 |" in card
    )  # ceil(1201 * 0.9)
    never_empty = ConformalPredictor("thr").fit(z, y, alpha=0.2)
    never_empty.save_pretrained(tmp_path / "thr")
    card = (tmp_path / "thr" / "README.md").read_text()
    assert (
        "at least 1 - alpha = 0.8" in card and "may exceed it" in card and "1/(n+1) =" not in card and "Sadinle" in card
    )


def test_the_calibrator_is_saved_beside_and_loaded_back(data, tmp_path):
    z, y, zt, _ = data
    predictor = ConformalPredictor("aps", seed=1).fit(
        z, y, calibrator=TemperatureScaling()
    )  # fitted on the tuning split
    predictor.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == FILES | {"calibrator"}
    assert {p.name for p in (tmp_path / "calibrator").iterdir()} == FILES
    loaded = ConformalPredictor.from_pretrained(tmp_path)
    assert isinstance(loaded.calibrator, TemperatureScaling)
    assert loaded.calibrator.fitted_temperature == predictor.calibrator.fitted_temperature
    assert np.array_equal(loaded.predict_sets(zt, generator=0), predictor.predict_sets(zt, generator=0))
    assert "`temperature_scaling` (fitted on the tuning split" in (tmp_path / "README.md").read_text()


def test_files_a_user_owns(data, tmp_path):
    z, y, _, _ = data
    predictor = ConformalPredictor("thr").fit(z, y)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="new or empty folder"):
        predictor.save_pretrained(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ValueError, match=r"model's files.*save it in .*model/conformal' instead"):
        predictor.save_pretrained(model, overwrite=True)
    assert json.loads((model / "config.json").read_text()) == {"model_type": "vit"}
    # a predictor saved there is replaced only when asked, card and calibrator folder included
    folder = tmp_path / "conformal"
    ConformalPredictor("aps").fit(z, y, calibrator=TemperatureScaling()).save_pretrained(folder)
    with pytest.raises(ValueError, match="holds a conformal predictor; pass overwrite=True"):
        predictor.save_pretrained(folder)
    predictor.save_pretrained(folder, overwrite=True)
    assert {p.name for p in folder.iterdir()} == FILES and "THR" in (folder / "README.md").read_text()
    assert ConformalPredictor.from_pretrained(folder).method == "thr"


def test_a_users_readme_beside_a_predictor_is_kept(data, tmp_path):
    # issue 23 item 5, for the predictors saved with the same machinery: the first save kept the user's README.md and
    # wrote no card, the second deleted it
    z, y, _, _ = data
    (tmp_path / "README.md").write_text("# my project\n")
    for method in ("aps", "thr"):
        ConformalPredictor(method).fit(
            z, y, calibrator=TemperatureScaling() if method == "aps" else None
        ).save_pretrained(tmp_path, overwrite=True)
        assert (tmp_path / "README.md").read_text() == "# my project\n"
        assert method.upper() in (tmp_path / "README.hf_calibration.md").read_text()
    assert ConformalPredictor.from_pretrained(tmp_path).method == "thr"
    assert not (tmp_path / "calibrator").exists()  # the earlier predictor's calibrator: the package's files, removed


def test_checkpoints_that_are_not_a_predictors(data, tmp_path):
    z, y, _, _ = data
    TemperatureScaling().fit(z, y, progress_bar=False).save_pretrained(tmp_path / "ts")
    with pytest.raises(ValueError, match="ConformalPredictor checkpoint.*it is a calibrator: use load_calibrator"):
        ConformalPredictor.from_pretrained(tmp_path / "ts")
    ConformalPredictor("thr").fit(z, y).save_pretrained(tmp_path / "cp")
    with pytest.raises(ValueError, match="not an hf_calibration calibrator checkpoint"):
        load_calibrator(tmp_path / "cp")
    config = json.loads((tmp_path / "cp" / "config.json").read_text())
    (tmp_path / "cp" / "config.json").write_text(json.dumps({**config, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version"):
        ConformalPredictor.from_pretrained(tmp_path / "cp")
    (tmp_path / "cp" / "config.json").write_text(json.dumps(config))
    (tmp_path / "cp" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupted"):
        ConformalPredictor.from_pretrained(tmp_path / "cp")
    with pytest.raises(ValueError, match="strict"):
        ConformalPredictor.from_pretrained(tmp_path / "cp", strict=False)


def test_from_a_hub_repo_with_its_calibrator(data, tmp_path, monkeypatch):
    """A repo holding a model with ``conformal/`` and ``conformal/calibrator/``: downloads are intercepted."""
    import fnmatch

    import huggingface_hub

    z, y, zt, _ = data
    remote = tmp_path / "remote"
    predictor = ConformalPredictor("aps").fit(z, y, calibrator=TemperatureScaling())
    predictor.save_pretrained(remote / "conformal")
    requested = []

    def snapshot_download(repo_id, allow_patterns, **kwargs):
        requested.append((repo_id, sorted(allow_patterns)))
        root = tmp_path / "cache"
        for path in remote.rglob("*"):
            rel = path.relative_to(remote).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(rel, p) for p in allow_patterns):
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, root / rel)
        return str(root)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    loaded = ConformalPredictor.from_pretrained("me/vit", subfolder="conformal")
    assert [r[0] for r in requested] == ["me/vit", "me/vit"]
    assert requested[1][1] == sorted(f"conformal/calibrator/{f}" for f in FILES)
    assert loaded.calibrator.fitted_temperature == predictor.calibrator.fitted_temperature
    assert np.array_equal(loaded.predict_sets(zt, generator=0), predictor.predict_sets(zt, generator=0))


@pytest.mark.parametrize("path_in_repo", [None, "conformal"])
def test_push_to_hub_is_intercepted(data, monkeypatch, path_in_repo):
    from huggingface_hub import HfApi

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    z, y, _, _ = data
    predictor = ConformalPredictor("raps").fit(z, y, calibrator=TemperatureScaling())
    calls = {}

    class Repo:
        repo_id = "me/vit"

    def create_repo(self, repo_id, **kwargs):
        return Repo()

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, **kwargs):
        calls.update(
            repo_id=repo_id,
            path_in_repo=path_in_repo,
            message=commit_message,
            files=sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file()),
        )
        calls["loaded"] = ConformalPredictor.from_pretrained(folder_path)
        return "https://huggingface.co/me/vit/commit/0"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    assert predictor.push_to_hub("me/vit", path_in_repo=path_in_repo).endswith("/commit/0")
    assert (
        calls["repo_id"] == "me/vit"
        and calls["path_in_repo"] == path_in_repo
        and calls["message"] == "Upload raps conformal predictor"
    )
    assert calls["files"] == sorted([*FILES, *(f"calibrator/{f}" for f in FILES)])
    assert float(calls["loaded"].q_hat) == float(predictor.q_hat)


def test_push_dry_run_and_offline(data, monkeypatch):
    from huggingface_hub import HfApi

    from hf_calibration._core.checkpoints import HubUnreachableError

    z, y, _, _ = data
    predictor = ConformalPredictor("thr").fit(z, y)
    with pytest.raises(HubUnreachableError, match="nothing was uploaded"):
        predictor.push_to_hub("me/vit", path_in_repo="conformal")

    def no_network(*args, **kwargs):
        raise AssertionError("a dry run must not call the Hub")

    monkeypatch.setattr(HfApi, "create_repo", no_network)
    monkeypatch.setattr(HfApi, "upload_folder", no_network)
    folder = Path(predictor.push_to_hub("me/vit", path_in_repo="conformal", dry_run=True))
    assert folder.name == "conformal" and {p.name for p in folder.iterdir()} == FILES
    assert float(ConformalPredictor.from_pretrained(folder.parent, subfolder="conformal").q_hat) == float(
        predictor.q_hat
    )
    with pytest.raises(ValueError, match="repo_id"):
        predictor.push_to_hub("a/b/c", dry_run=True)
    with pytest.raises(Exception, match="not fitted"):
        ConformalPredictor("thr").push_to_hub("me/x", dry_run=True)
    assert torch.isnan(ConformalPredictor("thr").q_hat)


# ----------------------------------------------------------------------------- issue 29 (fourth sweep)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda c: c["fit"].__setitem__("alpha", 0.2), "fit.alpha"),
        (lambda c: c["fit"].__setitem__("q_hat", 0.5), "fit.q_hat"),
        (lambda c: c.__setitem__("randomized", False), "init.randomized"),
        (lambda c: c["fit"].__setitem__("coverage", 0.99), "fit.coverage"),
        (lambda c: c["fit"].__setitem__("calibrator", None), "fit.calibrator"),
    ],
)
def test_a_tampered_config_is_refused(data, tmp_path, edit, field):
    """Item 4: an edited config.json was trusted (alpha and q_hat shown in the card and repr, randomized=False changed
    the sets, calibrator=null dropped calibrator/); its settings are now checked against the weights file's."""
    z, y, zt, _ = data
    predictor = ConformalPredictor("aps", seed=1).fit(z, y, calibrator=TemperatureScaling())
    predictor.save_pretrained(tmp_path)
    assert np.array_equal(
        ConformalPredictor.from_pretrained(tmp_path).predict_sets(zt, generator=0),
        predictor.predict_sets(zt, generator=0),
    )
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json' does not match its weights \(" + field.replace(".", r"\.")):
        ConformalPredictor.from_pretrained(tmp_path)


def test_a_tampered_config_of_an_older_save_is_checked_for_consistency(data, tmp_path):
    """Saves without the settings in their weights' metadata: the threshold and the fit record are still cross-checked."""
    from safetensors.torch import load_file, save_file

    z, y, _, _ = data
    ConformalPredictor("aps", seed=1).fit(z, y).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file(
        tensors, tmp_path / "model.safetensors", metadata={"format": "pt", "conformal": "aps", "format_version": "1"}
    )
    ConformalPredictor.from_pretrained(tmp_path)  # untouched: loads
    config = json.loads((tmp_path / "config.json").read_text())
    for key, value, message in (("q_hat", 0.5, "fit.q_hat is 0.5"), ("alpha", 0.3, "fit.alpha = 0.3")):
        edited = json.loads(json.dumps(config))
        edited["fit"][key] = value
        (tmp_path / "config.json").write_text(json.dumps(edited))
        with pytest.raises(ValueError, match=message):
            ConformalPredictor.from_pretrained(tmp_path)
    edited = json.loads(json.dumps(config))
    edited["randomized"] = False
    (tmp_path / "config.json").write_text(json.dumps(edited))
    with pytest.raises(ValueError, match="`randomized` is False but fit.randomized is True"):
        ConformalPredictor.from_pretrained(tmp_path)


def test_missing_calibrator_folder_and_junk_are_named(data, tmp_path):
    """Item 11: a deleted calibrator/ said "Expected argument `subfolder`..."; junk in a predictor's folder said
    "Expected a calibrator checkpoint"."""
    z, y, _, _ = data
    ConformalPredictor("thr").fit(z, y, calibrator=TemperatureScaling()).save_pretrained(tmp_path / "saved")
    shutil.rmtree(tmp_path / "saved" / "calibrator")
    with pytest.raises(
        ValueError, match=r"temperature_scaling calibrator in '.*saved/calibrator', but that folder is missing"
    ):
        ConformalPredictor.from_pretrained(tmp_path / "saved")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("x")
    with pytest.raises(
        ValueError,
        match=r"Expected a conformal predictor checkpoint with a config.json in '.*junk', but there is none \(it holds notes.txt\)",
    ):
        ConformalPredictor.from_pretrained(junk)
