"""``CalibrationTrainer(calibrate_on_eval=...)``: a calibrator fitted on the eval split at the end of training (after
MaC-Cal), saved in ``calibrator/`` by ``save_model`` / ``push_to_hub`` (Hub intercepted), its ECE / NLL before and
after on the card's ``model-index``. Numbers are checked against scipy's NLL minimiser and torchmetrics' ECE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _models import digits_dataset, make_model
from _paths import SHARED_LOGITS
from transformers import TrainerCallback, TrainingArguments

from hf_calibration import CalibrationTrainer, load_calibrated_model
from hf_calibration.calibrators import SMARTCalibrator
from hf_calibration.calibrators._machinery.fitting.cv import stratified_folds
from hf_calibration.calibrators.attach import attached_calibrator
from hf_calibration.training.eval_calibration import EvalCalibration, MetricValue, dataset_fields

torch.set_num_threads(1)
TRAIN, EVAL = slice(0, 1200), slice(1200, 1500)


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=32,
        per_device_eval_batch_size=100,
        max_steps=80,
        learning_rate=5e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    base.update(kw)
    return TrainingArguments(**base)


def _trainer(tmp_path, **kw) -> CalibrationTrainer:
    args = _args(tmp_path, **kw.pop("args", {}))
    return CalibrationTrainer(
        model=make_model("vit", seed=0),
        args=args,
        train_dataset=digits_dataset(TRAIN),
        eval_dataset=digits_dataset(EVAL),
        **kw,
    )


def _eval_logits(trainer) -> tuple[np.ndarray, np.ndarray]:
    out = trainer.predict(trainer.eval_dataset)
    return out.predictions.astype(np.float64), out.label_ids


def _nll(z: np.ndarray, y: np.ndarray) -> float:
    return F.cross_entropy(torch.from_numpy(z), torch.from_numpy(y)).item()


def _ece(z: np.ndarray, y: np.ndarray) -> float:
    from torchmetrics.classification import MulticlassCalibrationError

    probs = torch.softmax(torch.from_numpy(z), dim=1)
    assert bool((probs.max(1).values < 1).all())  # away from torchmetrics' confidence-1 edge case
    return MulticlassCalibrationError(num_classes=z.shape[1], n_bins=15, norm="l1")(probs, torch.from_numpy(y)).item()


def _scipy_temperature(z: np.ndarray, y: np.ndarray) -> float:
    """The NLL-optimal temperature by scipy's bounded scalar search over log T (independent of LBFGS)."""
    from scipy.optimize import minimize_scalar

    result = minimize_scalar(
        lambda t: _nll(z / np.exp(t), y), bounds=(-5, 5), method="bounded", options={"xatol": 1e-9}
    )
    return float(np.exp(result.x))


def _temperature(calibrator) -> float:
    return float(calibrator.log_temperature.detach().exp())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    trainer = _trainer(
        tmp_path_factory.mktemp("trained") / "out", calibrate_on_eval=True, args={"hub_model_id": "me/vit-calibrated"}
    )
    trainer.train()
    return trainer


def test_train_fits_temperature_scaling_on_the_eval_split(trained):
    z, y = _eval_logits(trained)
    assert type(trained.calibrator).__name__ == "TemperatureScaling"
    assert _temperature(trained.calibrator) == pytest.approx(_scipy_temperature(z, y), rel=1e-4)
    result = trained.eval_calibration
    assert result.num_samples == len(y) == 300
    assert result.before["ece"].value == pytest.approx(_ece(z, y), abs=1e-6)
    assert result.before["nll"].value == pytest.approx(_nll(z, y), abs=1e-9)


def test_after_numbers_are_cross_fitted(trained):
    """Each eval sample calibrated by a temperature fitted on the other folds (scipy per fold, same folds)."""
    z, y = _eval_logits(trained)
    oof = np.empty_like(z)
    for train, val in stratified_folds(y, cv=5, seed=0):
        oof[val] = z[val] / _scipy_temperature(z[train], y[train])
    after = trained.eval_calibration.after
    assert after["nll"].value == pytest.approx(_nll(oof, y), abs=1e-5)
    assert after["ece"].value == pytest.approx(_ece(oof, y), abs=1e-4)
    # the fit-set score (temperature of all 300 samples on the same 300) is lower than the honest one
    assert _nll(z / _temperature(trained.calibrator), y) < after["nll"].value


def test_save_model_puts_the_calibrator_beside_the_model(trained, tmp_path):
    from transformers import AutoModelForImageClassification

    trained.save_model(str(tmp_path))
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in (tmp_path / "calibrator").iterdir()}
    plain = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    calibrated = load_calibrated_model(tmp_path)
    assert attached_calibrator(plain) is None and attached_calibrator(calibrated) is not None
    x = digits_dataset(EVAL).pixel_values[:16]
    with torch.no_grad():
        want = plain(pixel_values=x).logits / _temperature(trained.calibrator)
        torch.testing.assert_close(calibrated(pixel_values=x).logits, want, rtol=1e-5, atol=1e-5)
    trained.save_model(str(tmp_path))  # saving again replaces the calibrator saved there


class _RecordingApi:
    """What ``Trainer.push_to_hub`` asks of ``transformers``' HfApi, recorded instead of sent."""

    def __init__(self):
        self.uploads = []

    def create_repo(self, repo_id, **kwargs):
        import huggingface_hub

        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        folder = Path(folder_path)
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        self.uploads.append({"repo_id": repo_id, "files": files, "readme": (folder / "README.md").read_text()})
        return f"https://huggingface.co/{repo_id}/commit/0"


def test_push_to_hub_uploads_the_calibrator_and_the_model_index(trained, monkeypatch, tmp_path):
    import transformers.trainer
    from huggingface_hub import ModelCard

    api = _RecordingApi()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: api)
    trained.push_to_hub()
    trained.push_to_hub()  # a second push replaces the results, never duplicates them
    upload = api.uploads[-1]
    assert upload["repo_id"] == "me/vit-calibrated"
    assert {"model.safetensors", "config.json", "calibrator/config.json", "calibrator/model.safetensors"} <= set(
        upload["files"]
    )
    (tmp_path / "README.md").write_text(upload["readme"])
    card = ModelCard.load(tmp_path / "README.md")
    results = {(r.metric_type, r.metric_config): r for r in card.data.eval_results}
    assert len(card.data.eval_results) == 4 and card.data.model_name == "vit-calibrated"
    z, y = _eval_logits(trained)
    oof = np.empty_like(z)
    for train, val in stratified_folds(y, cv=5, seed=0):
        oof[val] = z[val] / _scipy_temperature(z[train], y[train])
    assert results["ece", "uncalibrated"].metric_value == pytest.approx(_ece(z, y), abs=2e-6)
    assert results["nll", "uncalibrated"].metric_value == pytest.approx(_nll(z, y), abs=2e-6)
    assert results["ece", "temperature_scaling-cross-fitted"].metric_value == pytest.approx(_ece(oof, y), abs=1e-4)
    assert results["nll", "temperature_scaling-cross-fitted"].metric_value == pytest.approx(_nll(oof, y), abs=1e-5)
    assert all(r.task_type == "image-classification" and r.dataset_name == "evaluation split" for r in results.values())
    assert card.text.count("## Calibration") == 1
    assert 'hf_calibration.pipeline("image-classification", model="me/vit-calibrated")' in card.text


def test_calibrator_is_fitted_after_the_maccal_stage(tmp_path):
    """With MaC-Cal, the calibrator sees the final model (new head), not the one training ended with."""
    from hf_calibration.maccal import MaCCalConfig

    class EndOfTraining(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            with torch.no_grad():
                self.logits = model(pixel_values=digits_dataset(EVAL).pixel_values).logits.double().numpy()

    seen = EndOfTraining()
    trainer = _trainer(
        tmp_path,
        calibrate_on_eval="temperature_scaling",
        callbacks=[seen],
        maccal=MaCCalConfig(epochs=2, batch_size=64, progress=False),
    )
    trainer.train()
    z, y = _eval_logits(trainer)
    assert np.abs(z - seen.logits).max() > 0.1  # the stage changed the logits
    calibration = trainer.eval_calibration
    assert calibration.before["nll"].value == pytest.approx(_nll(z, y), abs=1e-6)  # measured on the final model
    assert abs(_nll(z, y) - _nll(seen.logits, y)) > 1e-3
    # fitted on the final model's logits; kept only if it qualifies by AutoCalibrator's rule (else T = 1, and said)
    expected = _scipy_temperature(z, y) if calibration.reason is None else 1.0
    assert _temperature(trainer.calibrator) == pytest.approx(expected, rel=1e-4)


def test_a_calibrator_instance_is_copied_and_fitted(tmp_path):
    given = SMARTCalibrator(max_steps=30)
    trainer = _trainer(tmp_path, calibrate_on_eval=given, args={"max_steps": 5})
    trainer.train()
    assert trainer.calibrator is not given and trainer.calibrator.is_fitted and not given.is_fitted
    assert trainer.eval_calibration.method == "smart"
    if trainer.eval_calibration.reason is None:  # kept: the fitted copy, with the given settings
        assert isinstance(trainer.calibrator, SMARTCalibrator)
        assert trainer.calibrator._hub_mixin_config["max_steps"] == 30
    else:  # after 5 steps SMART does not qualify by AutoCalibrator's rule: the identity is kept, and said
        assert trainer.calibrator.is_identity and "smart did not qualify" in trainer.eval_calibration.reason


def test_bad_calibrate_on_eval_fails_before_training(tmp_path):
    model, args, train = make_model("vit"), _args(tmp_path), digits_dataset(TRAIN)
    with pytest.raises(ValueError, match="eval_dataset"):
        CalibrationTrainer(model=model, args=args, train_dataset=train, calibrate_on_eval=True)
    with pytest.raises(ValueError, match="calibrate_on_eval"):
        CalibrationTrainer(
            model=model, args=args, train_dataset=train, eval_dataset=digits_dataset(EVAL), calibrate_on_eval="nope"
        )
    with pytest.raises(TypeError, match="calibrate_on_eval"):
        CalibrationTrainer(
            model=model, args=args, train_dataset=train, eval_dataset=digits_dataset(EVAL), calibrate_on_eval=3
        )
    with pytest.raises(ValueError, match="one `eval_dataset`"):
        CalibrationTrainer(
            model=model,
            args=args,
            train_dataset=train,
            calibrate_on_eval=True,
            eval_dataset={"a": digits_dataset(EVAL), "b": digits_dataset(EVAL)},
        )


def test_the_card_keeps_other_results_and_names_the_dataset(tmp_path):
    """A card's own model-index results (accuracy here) stay; a datasets.Dataset names itself."""
    import datasets
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    readme = tmp_path / "README.md"
    accuracy = EvalResult(
        task_type="image-classification",
        dataset_type="digits",
        dataset_name="digits",
        metric_type="accuracy",
        metric_value=0.9,
    )
    ModelCard.from_template(ModelCardData(model_name="m", eval_results=[accuracy])).save(readme)
    split = datasets.Dataset.from_dict(
        {"x": [1]}, info=datasets.DatasetInfo(dataset_name="digits", config_name="default"), split="validation"
    )
    fields = dataset_fields(split)
    assert fields == {
        "dataset_type": "digits",
        "dataset_name": "digits",
        "dataset_config": "default",
        "dataset_split": "validation",
    }
    assert dataset_fields(split, dataset_tags=["me/digits"], dataset_name="Digits")["dataset_name"] == "Digits"
    result = EvalCalibration(
        calibrator=SMARTCalibrator(),
        before={"ece": MetricValue(0.1), "nll": MetricValue(0.5)},
        after={"ece": MetricValue(0.02, (0.01, 0.03)), "nll": MetricValue(0.4)},
        num_samples=300,
        cv=5,
        seed=0,
    )
    result.add_to_model_card(readme, model_name="m", **fields)
    card = ModelCard.load(readme)
    assert [r.metric_type for r in card.data.eval_results] == ["accuracy", "ece", "nll", "ece", "nll"]
    ece_after = card.data.eval_results[3]
    assert (
        ece_after.metric_name == "ECE (smart, 5-fold cross-fitted) [1.00, 3.00]"
        and ece_after.dataset_split == "validation"
    )
    assert "| ECE | 10.00 % | 2.00 % [1.00, 3.00] |" in card.text


CE_LOGITS = SHARED_LOGITS / "cifar10_resnet50_cross_entropy_calibench.npz"


@pytest.mark.skipif(not CE_LOGITS.is_file(), reason="the shared real-logit files are not beside the repo")
def test_real_logits_published_temperature_and_an_honest_after():
    """ResNet-50 CIFAR-10 (cross-entropy), val part as the eval split: the NLL temperature is the published 2.50, and
    the cross-fitted ECE of a flexible calibrator (isotonic) is not flattered by its own fit set, as the fit-set ECE is:
    it is the closer of the two to the held-out test ECE."""
    from hf_calibration.metrics import ece
    from hf_calibration.training.eval_calibration import fit_eval_calibration

    data = np.load(CE_LOGITS)
    z, y = data["logits_val"].astype(np.float64), data["labels_val"]
    ts = fit_eval_calibration(z, y)
    assert _temperature(ts.calibrator) == pytest.approx(2.50, abs=0.01)  # ../shared/data/README.md
    assert ts.before["ece"].value == pytest.approx(_ece(z, y), abs=1e-5)  # torchmetrics bins in float32
    iso = fit_eval_calibration(z, y, "isotonic")
    with torch.no_grad():
        fit_set = ece(iso.calibrator(torch.from_numpy(z)).numpy(), y)
        test = ece(iso.calibrator(torch.from_numpy(data["logits_test"])).numpy(), data["labels_test"])
    after = iso.after["ece"].value
    assert fit_set < after  # measured: 0.17 % on its own fit set, 0.61 % cross-fitted
    assert abs(after - test) < abs(fit_set - test)  # test: 0.77 %


def test_too_small_an_eval_split_reports_before_only(caplog, tmp_path):
    """12 samples: the whole split fits temperature scaling (10 needed), but 2 of 5 folds leave 9 to fit on."""
    from hf_calibration.training.eval_calibration import fit_eval_calibration

    rng = np.random.default_rng(0)
    y = np.arange(12) % 2
    z = rng.normal(size=(12, 2)) + 2 * np.eye(2)[y]
    with caplog.at_level("WARNING", logger="hf_calibration.training.eval_calibration"):
        result = fit_eval_calibration(z, y)
    assert result.after is None and result.calibrator.is_fitted and "could not be cross-fitted" in caplog.text
    assert result.before["nll"].value == pytest.approx(_nll(z, y), abs=1e-12)
    assert [r.metric_config for r in result.eval_results(dataset_type="d", dataset_name="d")] == ["uncalibrated"] * 2
    assert "after: not measured" in result.card_section()
    with pytest.raises(ValueError, match="at least 10"):
        CalibrationTrainer(
            model=make_model("vit"),
            args=_args(tmp_path),
            calibrate_on_eval=True,
            eval_dataset=digits_dataset(slice(0, 9)),
        )


def test_card_numbers_carry_bootstrap_intervals(trained):
    """Before and after each carry a 95 % interval (or a note saying why it does not hold the value, as an ECE near 0
    may); the NLL one agrees with a plain numpy percentile bootstrap of the per-row NLL terms (its own generator, so
    only to Monte-Carlo precision)."""
    z, y = _eval_logits(trained)
    before = trained.eval_calibration.before
    for value in (*before.values(), *trained.eval_calibration.after.values()):
        if value.interval is None:
            assert value.note == "no interval"
            continue
        low, high = value.interval
        assert (low <= value.value <= high or value.note) and high >= low
    terms = F.cross_entropy(torch.from_numpy(z), torch.from_numpy(y), reduction="none").numpy()
    rng = np.random.default_rng(12345)
    means = terms[rng.integers(0, len(terms), size=(4000, len(terms)))].mean(axis=1)
    reference = np.percentile(means, [2.5, 97.5])
    width = reference[1] - reference[0]
    assert np.allclose(before["nll"].interval, reference, atol=0.1 * width)


# ----------------------------------------------------------------------------- issue 29 (fourth sweep)


def test_a_calibrator_that_does_not_help_is_not_kept(tmp_path):
    """Item 2: calibrate_on_eval kept a calibrator that made the cross-fitted NLL worse (SMART: 1.854 -> 1.866) without
    a word. It now applies AutoCalibrator's rule: on a model calibrated by construction no gain is significant (scipy's
    paired t-test on the per-sample cross-fitted NLL), so the identity is kept, with a warning and the card saying so."""
    from scipy.special import log_softmax
    from scipy.stats import ttest_rel

    from hf_calibration.calibrators import UncalibratedWarning, compare_calibrators
    from hf_calibration.training.eval_calibration import fit_eval_calibration

    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 200)
    z = 2.2 * (rng.normal(size=(200, 2)) + 1.1 * np.eye(2)[y])  # softmax(z) is the Bayes posterior: nothing to fix
    with pytest.warns(
        UncalibratedWarning, match="calibrate_on_eval leaves every prediction uncalibrated.*smart did not qualify"
    ):
        result = fit_eval_calibration(z, y, "smart")
    table = compare_calibrators(z, y, ["smart"], cv=5, seed=0, race=False, keep_predictions=True, progress_bar=False)
    held_out = {m: -log_softmax(table.predictions[m], axis=1)[np.arange(200), y] for m in ("uncalibrated", "smart")}
    assert ttest_rel(held_out["uncalibrated"], held_out["smart"], alternative="greater").pvalue >= 0.05
    assert result.after["nll"].value == pytest.approx(
        held_out["smart"].mean(), abs=1e-9
    )  # the rejected method's numbers
    assert result.method == "smart" and result.reason is not None and result.calibrator.is_identity
    np.testing.assert_allclose(result.calibrator(torch.from_numpy(z)).numpy(), z, rtol=0, atol=1e-12)
    section = result.card_section()
    assert "but not kept: smart did not qualify" in section and "holds the identity" in section
    result.save(tmp_path)
    from hf_calibration.calibrators import load_calibrator

    assert load_calibrator(tmp_path / "calibrator").is_identity
    # its repr said "TemperatureScaling(fitted)" beside the warning that nothing was kept (share.md printed it)
    assert repr(result.calibrator) == "TemperatureScaling(identity: the model left as it is)"


def test_the_uncalibrated_model_wins_where_its_ece_is_clearly_lower():
    """Item 2 (TS: ECE 1.6 -> 3.8 %): the rule lets the uncalibrated model compete on the selection metric, so a
    calibrator whose NLL gain is significant but whose held-out ECE is worse beyond one standard error is not kept."""
    from scipy.stats import sem

    from hf_calibration.calibrators.selection.auto import CalibratorComparison, MethodScores

    def scores(name, ece, nll):
        s = MethodScores(name)
        for fold, (e, n) in enumerate(zip(ece, nll)):
            s.add_fold(fold, {**{c: 0.0 for c in s.folds}, "ece": e, "nll": n})
        return s

    uncal = scores("uncalibrated", [0.015, 0.017, 0.016], [0.90, 0.91, 0.92])
    ts = scores("temperature_scaling", [0.036, 0.040, 0.038], [0.85, 0.86, 0.86])
    table = CalibratorComparison(
        {"uncalibrated": uncal, "temperature_scaling": ts}, cv=3, seed=0, n_bins=15, num_samples=300, num_classes=3
    )
    gap = np.subtract(ts.folds["ece"], uncal.folds["ece"])
    assert gap.mean() > sem(gap) and table.nll_gain_is_significant("temperature_scaling")
    chosen, why = table.decide("ece")
    assert chosen == "uncalibrated" and "lower than that of every qualifying candidate (temperature_scaling)" in why
    assert table.decide("nll")[0] == "temperature_scaling"


def test_labelled_rows_are_counted_before_training(tmp_path):
    """Item 8: 60 eval rows of which 55 are labelled -100 trained fully, then failed ("got 5"); the check now counts the
    labelled rows (the Trainer's datasets and datasets.Dataset columns alike) before any step."""
    import datasets

    eval_set = digits_dataset(slice(1200, 1260))
    eval_set.labels = eval_set.labels.clone()
    eval_set.labels[5:] = -100
    with pytest.raises(
        ValueError, match="at least 10 labelled samples .* only 5 of its 60 rows have a label other than -100"
    ):
        CalibrationTrainer(
            model=make_model("vit"),
            args=_args(tmp_path),
            train_dataset=digits_dataset(TRAIN),
            eval_dataset=eval_set,
            calibrate_on_eval=True,
        )
    table = datasets.Dataset.from_dict({"x": list(range(60)), "label": [0, 1, 2, 3, 4] + [-100] * 55})
    with pytest.raises(ValueError, match="only 5 of its 60 rows"):
        CalibrationTrainer(
            model=make_model("vit"),
            args=_args(tmp_path),
            train_dataset=digits_dataset(TRAIN),
            eval_dataset=table,
            calibrate_on_eval=True,
        )
    eval_set.labels[5:15] = 3  # 15 labelled rows: enough for temperature scaling (10)
    CalibrationTrainer(
        model=make_model("vit"),
        args=_args(tmp_path),
        train_dataset=digits_dataset(TRAIN),
        eval_dataset=eval_set,
        calibrate_on_eval=True,
    )
