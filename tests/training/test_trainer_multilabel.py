"""CalibrationTrainer with a multi-label (sigmoid) head: BCE and the sigmoid losses train it, the softmax-only methods
(MbLS, FeDLaS, MaC-Cal) are refused naming problem_type, calibrate_on_eval fits a sigmoid calibrator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models import DictDataset, digits, make_model
from transformers import TrainingArguments

from hf_calibration import CalibrationTrainer, load_calibrated_model
from hf_calibration.losses import (
    AsymmetricLoss,
    BinaryCrossEntropyLoss,
    FeDLaSLoss,
    FocalLoss,
    MbLSLoss,
    SigmoidFocalLoss,
)

torch.set_num_threads(1)
LABELS = 3


def _dataset(index: slice) -> DictDataset:
    x, digit = digits(index)
    d = digit.numpy()
    y = np.stack([d < 5, d % 2 == 0, np.isin(d, [0, 6, 8, 9])], axis=1).astype(np.float32)  # three tags a digit
    return DictDataset(x, torch.from_numpy(y))


def _model():
    return make_model("vit", seed=0, num_labels=LABELS, problem_type="multi_label_classification")


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=32,
        per_device_eval_batch_size=100,
        max_steps=3,
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


@pytest.mark.parametrize("loss", [BinaryCrossEntropyLoss(), SigmoidFocalLoss(), AsymmetricLoss()])
def test_trains_with_sigmoid_losses(loss, tmp_path):
    model = _model()
    data = _dataset(slice(0, 96))
    trainer = CalibrationTrainer(model=model, args=_args(tmp_path), train_dataset=data, compute_loss=loss)
    batch = {"pixel_values": data.pixel_values[:32], "labels": data.labels[:32]}
    model.eval()
    with torch.no_grad():
        expected = loss(model(pixel_values=batch["pixel_values"]).logits, batch["labels"])
        got = trainer.compute_loss(model, dict(batch))
    assert float(got) == pytest.approx(float(expected), rel=1e-6)
    before = model.classifier.weight.detach().clone()
    trainer.train()
    assert not torch.equal(before, model.classifier.weight.detach())


def test_mixup_without_a_loss_uses_bce(tmp_path):
    trainer = CalibrationTrainer(
        model=_model(), args=_args(tmp_path), train_dataset=_dataset(slice(0, 64)), mixup_alpha=0.4
    )
    assert isinstance(trainer.calibration_loss, BinaryCrossEntropyLoss)
    trainer.train()


@pytest.mark.parametrize(
    "loss, match",
    [
        (FocalLoss(), "use SigmoidFocalLoss"),
        (MbLSLoss(), "defined by its paper for a softmax head"),
        (FeDLaSLoss, "defined by its paper for a softmax head"),
    ],
)
def test_softmax_losses_are_refused(loss, match, tmp_path):
    with pytest.raises(ValueError, match=rf"problem_type='multi_label_classification'.*{match}"):
        CalibrationTrainer(
            model=_model(), args=_args(tmp_path), train_dataset=_dataset(slice(0, 32)), compute_loss=loss
        )


def test_sigmoid_loss_refused_on_a_softmax_head(tmp_path):
    with pytest.raises(ValueError, match="multi-class head.*treats every logit as its own sigmoid"):
        CalibrationTrainer(
            model=make_model("vit", seed=0),
            args=_args(tmp_path),
            train_dataset=_dataset(slice(0, 32)),
            compute_loss=AsymmetricLoss(),
        )


def test_maccal_refused(tmp_path):
    from hf_calibration.maccal import MaCCalConfig

    with pytest.raises(ValueError, match="MaC-Cal.*problem_type is 'multi_label_classification'"):
        CalibrationTrainer(
            model=_model(), args=_args(tmp_path), train_dataset=_dataset(slice(0, 32)), maccal=MaCCalConfig()
        )


def test_calibrate_on_eval_fits_a_sigmoid_calibrator(tmp_path):
    from hf_calibration.calibrators import SigmoidTemperatureScaling
    from hf_calibration.calibrators.attach import attached_calibrator
    from hf_calibration.metrics import nll

    trainer = CalibrationTrainer(
        model=_model(),
        args=_args(tmp_path / "out", max_steps=30),
        train_dataset=_dataset(slice(0, 1000)),
        eval_dataset=_dataset(slice(1000, 1400)),
        compute_loss=BinaryCrossEntropyLoss(),
        calibrate_on_eval=True,
    )
    trainer.train()
    calibrator = trainer.calibrator
    assert isinstance(calibrator, SigmoidTemperatureScaling) and calibrator.fit_info_["task"] == "multilabel"
    out = trainer.predict(trainer.eval_dataset)
    z, y = out.predictions.astype(np.float64), out.label_ids.astype(np.int64)
    assert trainer.eval_calibration.before["nll"].value == pytest.approx(nll(z, y), rel=1e-9)  # macro BCE
    assert "macro averages over its labels" in trainer.eval_calibration.card_section()
    trainer.save_model(str(tmp_path / "saved"))
    loaded = load_calibrated_model(tmp_path / "saved")
    assert isinstance(attached_calibrator(loaded), SigmoidTemperatureScaling)
    with pytest.raises(ValueError, match="calibrates a softmax head"):
        CalibrationTrainer(
            model=_model(),
            args=_args(tmp_path),
            train_dataset=_dataset(slice(0, 32)),
            eval_dataset=_dataset(slice(32, 64)),
            calibrate_on_eval="temperature_scaling",
        )
