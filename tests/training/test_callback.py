"""``CalibrationCallback`` on any ``Trainer``: the plain one with a tiny BERT on a toy text task (sentences whose
class is named by two of their words, or misnamed) and a tiny wav2vec2 on noisy tones, a user's own subclass and ``CalibrationTrainer`` with a tiny ViT, all trained for real. Checked by
hand: the weights are those training left; the saved temperature equals scipy's NLL-optimal T on the eval logits
computed here; the conformal threshold and sets are those of the calibrated probabilities (THR by hand); the folder
reloads with ``load_calibrated_model`` serving ``softmax(z / T)``; ``push_to_hub`` uploads ``calibrator/`` and
``conformal/``; ``on_evaluate`` logs the ECE torchmetrics gives."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _models import digits_dataset, make_model
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_calibration import CalibrationCallback, CalibrationTrainer, load_calibrated_model
from hf_calibration.calibrators import TemperatureScaling
from hf_calibration.conformal import ConformalPredictor

torch.set_num_threads(1)
TRAIN, EVAL = slice(0, 1200), slice(1200, 1500)
ALPHA = 0.1


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


class ToySentences(torch.utils.data.Dataset):
    """A toy text task: 12-token sentences ([CLS] = 1, then noise words 10..29) in which two words name the class
    (2 + 2k and 3 + 2k for class k); in a quarter of them they name a random class instead of the label."""

    def __init__(self, n: int, seed: int):
        g = np.random.default_rng(seed)
        labels = g.integers(0, 4, n)
        shown = np.where(g.random(n) < 0.25, g.integers(0, 4, n), labels)
        ids = g.integers(10, 30, (n, 12))
        ids[:, 0] = 1
        where = np.argsort(g.random((n, 11)), axis=1)[:, :2] + 1
        ids[np.arange(n), where[:, 0]], ids[np.arange(n), where[:, 1]] = 2 + 2 * shown, 3 + 2 * shown
        self.input_ids, self.labels = torch.as_tensor(ids), torch.as_tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {
            "input_ids": self.input_ids[i],
            "attention_mask": torch.ones(12, dtype=torch.long),
            "labels": self.labels[i],
        }


def tiny_bert(seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=12,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=4,
    )
    return BertForSequenceClassification(config)


class WeightsAtTrainEnd(TrainerCallback):
    """The model's weights as training left them: called at ``on_train_end`` before the calibration callback."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}


class MyTrainer(Trainer):
    """A user's own subclass: label-smoothed cross-entropy of its own."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits, labels, label_smoothing=0.05)
        return (loss, outputs) if return_outputs else loss


def _logits_by_hand(model, dataset) -> tuple[np.ndarray, np.ndarray]:
    """The eval logits, the model run here (eval mode, no gradient), not through the trainer."""
    model.eval()
    rows = [dataset[i] for i in range(len(dataset))]
    inputs = {k: torch.stack([r[k] for r in rows]) for k in rows[0] if k != "labels"}
    with torch.no_grad():
        z = model(**inputs).logits.double().numpy()
    return z, np.array([int(r["labels"]) for r in rows])


def _nll(z: np.ndarray, y: np.ndarray) -> float:
    return F.cross_entropy(torch.from_numpy(z), torch.from_numpy(y)).item()


def _scipy_temperature(z: np.ndarray, y: np.ndarray) -> float:
    from scipy.optimize import minimize_scalar

    result = minimize_scalar(
        lambda t: _nll(z / np.exp(t), y), bounds=(-5, 5), method="bounded", options={"xatol": 1e-9}
    )
    return float(np.exp(result.x))


def _thr_by_hand(z: np.ndarray, y: np.ndarray, t: float, z_test: np.ndarray) -> tuple[float, np.ndarray]:
    """THR's threshold on the calibrated probabilities softmax(z / T) and the sets of ``z_test``: class k is in iff
    its calibrated probability is at least 1 - q_hat (an empty set gets the most probable class)."""
    p = torch.softmax(torch.from_numpy(z / t), dim=1).numpy()
    scores = np.sort(1 - p[np.arange(len(y)), y])
    q_hat = scores[int(np.ceil((len(y) + 1) * (1 - ALPHA))) - 1]
    probs = torch.softmax(torch.from_numpy(z_test / t), dim=1).numpy()
    sets = probs >= 1 - q_hat
    empty = ~sets.any(axis=1)
    sets[empty, probs[empty].argmax(1)] = True
    return float(q_hat), sets


def _check_folder(folder: Path, trained_model, eval_dataset, task: str) -> None:
    """The saved calibrator and sets against the hand computation on the eval logits; the folder served calibrated."""
    z, y = _logits_by_hand(trained_model, eval_dataset)
    t = _scipy_temperature(z, y)
    calibrator = TemperatureScaling.from_pretrained(folder / "calibrator")
    assert not calibrator.is_identity  # kept: its cross-fitted NLL beat the model's
    assert float(calibrator.log_temperature.detach().exp()) == pytest.approx(t, rel=1e-4)
    with torch.no_grad():
        np.testing.assert_allclose(calibrator(torch.from_numpy(z)).numpy(), z / t, rtol=1e-4, atol=1e-6)
    predictor = ConformalPredictor.from_pretrained(folder / "conformal")
    q_hat, sets = _thr_by_hand(z, y, t, z)
    assert float(predictor.q_hat) == pytest.approx(q_hat, abs=1e-5)
    differs = np.asarray(predictor.predict_sets(z, from_logits=True)) != sets
    assert differs.sum() <= 2  # a probability within 1e-5 of the threshold may fall either side (T to 1e-4)
    assert predictor.fit_info_["calibrator_fingerprint"] == calibrator.fingerprint()
    served = load_calibrated_model(folder, task=task)  # sets fitted behind calibrator/: no refusal
    rows = [eval_dataset[i] for i in range(8)]
    inputs = {k: torch.stack([r[k] for r in rows]) for k in rows[0] if k != "labels"}
    with torch.no_grad():
        scores = torch.softmax(served(**inputs).logits.double(), dim=1).numpy()
    np.testing.assert_allclose(scores, torch.softmax(torch.from_numpy(z[:8] / t), dim=1).numpy(), atol=1e-5)
    assert served.conformal_predictor is not None


# -------------------------------------------------------------------- the plain Trainer, a text model


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bert") / "out"
    weights, callback = WeightsAtTrainEnd(), CalibrationCallback("temperature_scaling", conformal="thr", alpha=ALPHA)
    trainer = Trainer(
        model=tiny_bert(),
        args=_args(out, max_steps=300, learning_rate=3e-3, hub_model_id="me/bert-toy"),
        train_dataset=ToySentences(300, seed=0),  # a small training set, fitted closely: over-confident on others
        eval_dataset=ToySentences(300, seed=1),
        callbacks=[weights, callback],
    )
    trainer.train()
    trainer.save_model()  # the model beside the callback's calibrator/ and conformal/
    return trainer, callback, weights, out


def test_plain_trainer_text_model_calibrated_and_sets_on_calibrated_scores(bert_run):
    trainer, callback, weights, out = bert_run
    assert callback.trainer is trainer and callback.calibrator.kind == "temperature_scaling"
    after = trainer.model.state_dict()
    assert weights.weights.keys() == after.keys()
    assert all(torch.equal(weights.weights[k], after[k]) for k in after)  # the callback changed no weight
    _check_folder(out, trainer.model, ToySentences(300, seed=1), "text-classification")


def test_push_to_hub_uploads_calibrator_conformal_and_a_text_card(bert_run, monkeypatch, tmp_path):
    import transformers.trainer
    from huggingface_hub import ModelCard

    trainer, _, _, _ = bert_run
    uploads = []

    class Api:
        def create_repo(self, repo_id, **kwargs):
            import huggingface_hub

            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            folder = Path(folder_path)
            files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            uploads.append(
                (files, (folder / "README.md").read_text(), (folder / "conformal" / "README.md").read_text())
            )
            return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: Api())
    trainer.push_to_hub()
    files, readme, sets_card = uploads[-1]
    assert {"model.safetensors", "calibrator/model.safetensors", "calibrator/README.md"} <= set(files)
    assert {"conformal/model.safetensors", "conformal/config.json", "conformal/README.md"} <= set(files)
    assert "conformal/calibrator/config.json" in files
    assert "- text-classification" in sets_card and "image" not in sets_card  # the sets' card: a text model's
    (tmp_path / "README.md").write_text(readme)
    card = ModelCard.load(tmp_path / "README.md")
    assert card.text.count("## Calibration") == 1
    assert 'hf_calibration.pipeline("text-classification", model="me/bert-toy")' in card.text
    assert {r.task_type for r in card.data.eval_results} == {"text-classification"}


# -------------------------------------------------------------------- the plain Trainer, an audio model


class Tones(torch.utils.data.Dataset):
    """A toy audio task: 0.1 s of a noisy tone at 4 kHz, whose pitch (200, 300, 450 or 650 Hz, +-15 %) is the class."""

    def __init__(self, n: int, seed: int):
        g = np.random.default_rng(seed)
        self.labels = torch.as_tensor(g.integers(0, 4, n))
        t = np.arange(400) / 4000
        pitch = np.array([200, 300, 450, 650])[self.labels.numpy()] * (1 + 0.15 * g.standard_normal(n))
        x = np.sin(2 * np.pi * pitch[:, None] * t + g.uniform(0, 6.3, (n, 1))) + 0.8 * g.standard_normal((n, 400))
        self.input_values = torch.as_tensor(x, dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_values": self.input_values[i], "labels": self.labels[i]}


def tiny_wav2vec2(seed: int = 0):
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    torch.manual_seed(seed)
    no_dropout = dict.fromkeys(
        ("hidden_dropout", "attention_dropout", "activation_dropout", "feat_proj_dropout", "final_dropout"), 0.0
    )
    config = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(16, 16),
        conv_kernel=(10, 3),
        conv_stride=(5, 2),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=16,
        num_labels=4,
        layerdrop=0.0,
        mask_time_prob=0.0,
        **no_dropout,
    )
    return Wav2Vec2ForSequenceClassification(config)


def test_plain_trainer_audio_model(tmp_path):
    weights, callback = WeightsAtTrainEnd(), CalibrationCallback(conformal="thr", alpha=ALPHA)
    trainer = Trainer(
        model=tiny_wav2vec2(),
        args=_args(tmp_path, max_steps=300, learning_rate=3e-3),
        train_dataset=Tones(200, seed=0),  # fitted closely: over-confident on new tones
        eval_dataset=Tones(800, seed=1),
        callbacks=[weights, callback],
    )
    trainer.train()
    trainer.save_model()
    after = trainer.model.state_dict()
    assert all(torch.equal(weights.weights[k], after[k]) for k in after)
    _check_folder(tmp_path, trainer.model, Tones(800, seed=1), "audio-classification")


# -------------------------------------------------------------------- a user's subclass and CalibrationTrainer, images


@pytest.mark.parametrize("trainer_class", [MyTrainer, CalibrationTrainer], ids=["own-subclass", "CalibrationTrainer"])
def test_any_trainer_subclass_image_model(trainer_class, tmp_path):
    weights = WeightsAtTrainEnd()
    callback = CalibrationCallback(conformal=ConformalPredictor("thr"), alpha=ALPHA)
    trainer = trainer_class(
        model=make_model("vit", seed=0),
        args=_args(tmp_path),
        train_dataset=digits_dataset(TRAIN),
        eval_dataset=digits_dataset(EVAL),
        callbacks=[weights, callback],
    )
    trainer.train()
    trainer.save_model()
    assert callback.trainer is trainer
    after = trainer.model.state_dict()
    assert all(torch.equal(weights.weights[k], after[k]) for k in after)
    _check_folder(tmp_path, trainer.model, digits_dataset(EVAL), "image-classification")


def test_calibration_trainer_calibrate_on_eval_is_the_callback(tmp_path):
    trainer = CalibrationTrainer(
        model=make_model("vit", seed=0),
        args=_args(tmp_path, max_steps=20),
        train_dataset=digits_dataset(TRAIN),
        eval_dataset=digits_dataset(EVAL),
        calibrate_on_eval=True,
    )
    assert [type(c) for c in trainer.callback_handler.callbacks].count(CalibrationCallback) == 1
    trainer.train()
    assert trainer.calibrator is trainer.calibration_callback.calibrator is not None
    z, y = _logits_by_hand(trainer.model, digits_dataset(EVAL))
    got = float(trainer.calibrator.log_temperature.detach().exp())
    assert got == pytest.approx(_scipy_temperature(z, y), rel=1e-4) or trainer.calibrator.is_identity


# -------------------------------------------------------------------- logging at each evaluation


def test_on_evaluate_logs_ece_before_and_after_through_the_trainer(tmp_path):
    from torchmetrics.classification import MulticlassCalibrationError

    logged = []

    class Recorder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(dict(logs))

    trainer = Trainer(
        model=make_model("vit", seed=0),
        args=_args(tmp_path, max_steps=30, eval_strategy="steps", eval_steps=30),
        train_dataset=digits_dataset(TRAIN),
        eval_dataset=digits_dataset(EVAL),
        callbacks=[CalibrationCallback(on_evaluate=True, save=False), Recorder()],
    )
    trainer.train()
    record = next(r for r in logged if "eval_ece_uncalibrated" in r)
    assert {"eval_ece_calibrated", "eval_nll_uncalibrated", "eval_nll_calibrated"} <= record.keys()
    z, y = _logits_by_hand(trainer.model, digits_dataset(EVAL))  # the only evaluation is at the last step
    probs = torch.softmax(torch.from_numpy(z), dim=1)
    ece = MulticlassCalibrationError(num_classes=10, n_bins=15, norm="l1")(probs, torch.from_numpy(y)).item()
    assert record["eval_ece_uncalibrated"] == pytest.approx(ece, abs=2e-6)
    assert record["eval_nll_uncalibrated"] == pytest.approx(_nll(z, y), abs=2e-6)
    assert not (tmp_path / "calibrator").exists()  # save=False


# -------------------------------------------------------------------- without a Trainer: model + eval dataloader


def test_without_a_trainer_the_model_is_run_over_the_eval_dataloader(bert_run, tmp_path):
    """A trainer of another family calls the callback with the model and its eval dataloader only: the model is run
    over it (eval mode, no gradient) and the same calibrator and sets come out as through the Trainer."""
    trainer, through_trainer, _, _ = bert_run
    model = trainer.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loader = torch.utils.data.DataLoader(ToySentences(300, seed=1), batch_size=64)
    callback = CalibrationCallback(conformal="thr", alpha=ALPHA)
    callback.on_train_end(_args(tmp_path), None, None, model=model.train(), eval_dataloader=loader)
    assert callback.trainer is None and model.training  # its mode restored
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    t = float(through_trainer.calibrator.log_temperature.detach().exp())
    assert float(callback.calibrator.log_temperature.detach().exp()) == pytest.approx(t, rel=1e-5)
    model.save_pretrained(tmp_path)
    _check_folder(tmp_path, model, ToySentences(300, seed=1), "text-classification")


# -------------------------------------------------------------------- bad input


def test_bad_input_is_refused_naming_the_argument(tmp_path):
    with pytest.raises(ValueError, match="`calibrator`.*'no_such_method'"):
        CalibrationCallback("no_such_method")
    with pytest.raises(ValueError, match="`conformal`"):
        CalibrationCallback(conformal="lac")
    with pytest.raises(TypeError, match="`on_evaluate`"):
        CalibrationCallback(on_evaluate="yes")
    with pytest.raises(
        ValueError, match="`eval_dataset`.*got None"
    ):  # at the trainer's construction, not after training
        Trainer(
            model=make_model("vit", seed=0),
            args=_args(tmp_path),
            train_dataset=digits_dataset(TRAIN),
            callbacks=[CalibrationCallback()],
        )
    with pytest.raises(ValueError, match="`calibrator`.*sigmoid"):  # a softmax calibrator's kind on a multi-label head
        Trainer(
            model=make_model("vit", seed=0, problem_type="multi_label_classification"),
            args=_args(tmp_path),
            eval_dataset=digits_dataset(EVAL),
            callbacks=[CalibrationCallback("vector_scaling")],
        )


def test_exported_at_the_top_level():
    import hf_calibration.training

    assert hf_calibration.CalibrationCallback is hf_calibration.training.CalibrationCallback is CalibrationCallback
    assert "CalibrationCallback" in hf_calibration.__all__
    assert "transformers" in sys.modules


def test_auto_keeps_the_method_autocalibrator_picks():
    from hf_calibration import AutoCalibrator
    from hf_calibration.training import fit_eval_calibration

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (600,), generator=g)
    z = 3 * torch.randn(600, 5, generator=g) + 4 * F.one_hot(y, 5)  # over-confident: T = 1 is far from the best
    auto = AutoCalibrator(methods=["temperature_scaling", "vector_scaling"], seed=0)  # two candidates: fast
    result = fit_eval_calibration(z, y, calibrator=auto, seed=0)
    assert auto.comparison_ is None  # the instance given is copied, not fitted
    picked = AutoCalibrator(methods=["temperature_scaling", "vector_scaling"], seed=0).fit(z, y, progress_bar=False)
    assert result.reason is None and result.calibrator.kind == picked.method_
    with torch.no_grad():
        torch.testing.assert_close(result.calibrator(z), picked(z))  # refitted on all the rows, as AutoCalibrator does
    assert CalibrationCallback("auto").spec == "auto"
