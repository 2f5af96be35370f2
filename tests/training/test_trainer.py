"""CalibrationTrainer (and the plain Trainer) training for real with every loss on tiny random-init models."""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _models import HEAD_PATHS, MODEL_NAMES, DictDataset, digits, digits_dataset, head_input, make_model
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_calibration import CalibrationTrainer
from hf_calibration._core.features import find_classifier_head
from hf_calibration.losses import CalibrationLoss, FeDLaSLoss, LabelSmoothingLoss, get_loss
from hf_calibration.training.trainer import LOSS_STATE_NAME

torch.set_num_threads(1)

LOSS_NAMES = ("ce", "ls", "mbls", "focal", "flsd53", "fedlas_ls", "fedlas_mbls")
FEATURE_LOSSES = ("fedlas_ls", "fedlas_mbls")


def _loss(name: str) -> CalibrationLoss:
    return get_loss(name, num_classes=10) if name.startswith("fedlas") else get_loss(name)


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        max_steps=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        train_sampling_strategy="sequential",
        dataloader_num_workers=0,
        seed=0,
    )
    base.update(kw)
    return TrainingArguments(**base)


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_state_equal(a: dict, b: dict, **tol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=lambda m, k=k: f"{k}: {m}", **tol)


def _expected_first_loss(model: nn.Module, arch: str, loss: CalibrationLoss, x: torch.Tensor, y: torch.Tensor):
    """The loss of the first batch computed directly: logits from the model, features from the backbone by hand."""
    loss = copy.deepcopy(loss).train()
    with torch.no_grad():
        logits = model(pixel_values=x).logits
        features = head_input(arch, model, x) if loss.requires_features else None
        return loss(logits, y, features=features).item()


# ----------------------------------------------------------------------------- every loss, two real steps


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_two_steps_every_loss_on_vit(tmp_path, name):
    model = make_model("vit", seed=0)
    loss = _loss(name)
    x, y = digits(slice(0, 16))
    trainer = CalibrationTrainer(
        model=model, args=_args(tmp_path), train_dataset=digits_dataset(slice(0, 32)), compute_loss_func=loss
    )
    expected = _expected_first_loss(model, "vit", loss, x, y)  # the gate as the trainer seeded it
    before, loss_before = _state(model), _state(loss)
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all(np.isfinite(logged))
    # step 1 trains on samples 0..15 (sequential sampler): the Trainer's loss is the loss of that batch
    assert logged[0] == pytest.approx(expected, rel=1e-5)
    if name == "ce":
        with torch.no_grad():
            assert expected == pytest.approx(
                F.cross_entropy(make_model("vit", seed=0)(pixel_values=x).logits, y).item(), rel=1e-6
            )
    after = _state(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    if name in FEATURE_LOSSES:
        after_loss = _state(loss)
        for k in ("nci_mean", "nci_std"):
            assert not torch.equal(loss_before[k], after_loss[k]), k
        gate_keys = [k for k in after_loss if k.startswith("gate.")]
        assert gate_keys and all(not torch.equal(loss_before[k], after_loss[k]) for k in gate_keys)


@pytest.mark.parametrize("arch", MODEL_NAMES)
def test_fedlas_two_steps_on_every_architecture(tmp_path, arch):
    model = make_model(arch, seed=0)
    loss = _loss("fedlas_mbls")
    x, y = digits(slice(0, 16))
    trainer = CalibrationTrainer(
        model=model, args=_args(tmp_path), train_dataset=digits_dataset(slice(0, 32)), compute_loss_func=loss
    )
    expected = _expected_first_loss(model, arch, loss, x, y)
    gate_before = _state(loss.gate)
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged[0] == pytest.approx(expected, rel=1e-5)
    assert all(not torch.equal(gate_before[k], v) for k, v in _state(loss.gate).items())


# ----------------------------------------------------------------------------- features


class _SpyLoss(CalibrationLoss):
    """Cross-entropy that records the features it was given."""

    requires_features = True

    def __init__(self):
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def per_sample_loss(self, logits, labels, mask, features):
        self.seen.append(features.detach().clone())
        return F.cross_entropy(logits, labels, reduction="none")


@pytest.mark.parametrize("arch", MODEL_NAMES)
def test_features_are_what_the_head_sees(tmp_path, arch):
    model = make_model(arch, seed=1)
    x, y = digits(slice(0, 8))
    spy = _SpyLoss()
    trainer = CalibrationTrainer(model=model, args=_args(tmp_path), compute_loss_func=spy)
    assert find_classifier_head(model)[2] is find_classifier_head(model, HEAD_PATHS[arch])[2]
    model.eval()
    trainer.compute_loss(model, {"pixel_values": x, "labels": y})
    torch.testing.assert_close(spy.seen[0], head_input(arch, model, x), rtol=1e-5, atol=1e-6)


class _OddModel(nn.Module):
    """A model whose head has a name no auto-detection knows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.Tanh())
        self.readout = nn.Linear(12, 10)

    def forward(self, pixel_values, labels=None):
        return {"logits": self.readout(self.body(pixel_values))}


def test_user_named_head(tmp_path):
    model = _OddModel()
    x, y = digits(slice(0, 8))
    with pytest.raises(ValueError, match="head"):
        CalibrationTrainer(model=_OddModel(), args=_args(tmp_path), compute_loss_func=_SpyLoss())
    spy = _SpyLoss()
    trainer = CalibrationTrainer(model=model, args=_args(tmp_path), compute_loss_func=spy, head="readout")
    trainer.compute_loss(model, {"pixel_values": x, "labels": y})
    with torch.no_grad():
        torch.testing.assert_close(spy.seen[0], model.body(x))
    # and it trains
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 32)),
        compute_loss_func=_loss("fedlas_ls"),
        head="readout",
    )
    trainer.train()


def test_no_features_captured_is_a_clear_error(tmp_path):
    model = _OddModel()
    model.spare = nn.Linear(12, 10)  # a Linear that the forward pass never calls: the hook never fires
    trainer = CalibrationTrainer(model=model, args=_args(tmp_path), compute_loss_func=_SpyLoss(), head="spare")
    x, y = digits(slice(0, 4))
    with pytest.raises(ValueError, match="not called"):
        trainer.compute_loss(model, {"pixel_values": x, "labels": y})


# ----------------------------------------------------------------------------- optimizer and gate gradients


class _GradProbe(TrainerCallback):
    def __init__(self, loss):
        self.loss, self.at_begin, self.at_pre_step = loss, [], []

    def on_step_begin(self, args, state, control, **kw):
        self.at_begin.append([p.grad for p in self.loss.parameters()])

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self.at_pre_step.append([p.grad.clone() for p in self.loss.parameters()])


def test_gate_is_in_the_optimizer_and_its_gradients_do_not_leak_across_steps(tmp_path):
    model, loss = make_model("vit", seed=0), _loss("fedlas_ls")
    probe = _GradProbe(loss)
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path, max_steps=3, optim="sgd", weight_decay=0.1),
        train_dataset=digits_dataset(slice(0, 48)),
        compute_loss_func=loss,
        callbacks=[probe],
    )
    gate = {n: p.detach().clone() for n, p in loss.gate.named_parameters()}
    trainer.train()
    in_optimizer = {id(p): g for g in trainer.optimizer.param_groups for p in g["params"]}
    for n, p in loss.gate.named_parameters():
        assert id(p) in in_optimizer, n
        # same weight-decay policy as the model: decay on weights, none on biases
        assert in_optimizer[id(p)]["weight_decay"] == (0.0 if n.endswith("bias") else 0.1)
        assert not torch.equal(gate[n], p.detach()), n
    # cleared after every optimizer step, present (and non-zero somewhere) before every one
    assert all(g is None for grads in probe.at_begin for g in grads)
    assert len(probe.at_pre_step) == 3
    assert all(any(g.abs().sum() > 0 for g in grads) for grads in probe.at_pre_step)


class _NormProbe(TrainerCallback):
    """Global gradient norm of the model and of the loss right before each optimizer step (after clipping)."""

    def __init__(self, model, loss):
        self.model, self.loss, self.norms = model, loss, []

    def on_pre_optimizer_step(self, args, state, control, **kw):

        def norm(ps):
            return float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in ps if p.grad is not None])))

        self.norms.append(
            (
                norm(self.model.parameters()),
                norm(self.loss.parameters()),
                norm([*self.model.parameters(), *self.loss.parameters()]),
            )
        )


def test_max_grad_norm_clips_model_and_gate_together(tmp_path):
    def first_step_norms(max_norm):
        model, loss = make_model("vit", seed=0), _loss("fedlas_ls")
        probe = _NormProbe(model, loss)
        trainer = CalibrationTrainer(
            model=model,
            args=_args(tmp_path, max_steps=1, optim="sgd", max_grad_norm=max_norm),
            train_dataset=digits_dataset(slice(0, 32)),
            compute_loss_func=loss,
            callbacks=[probe],
        )
        trainer.train()
        return probe.norms[0]

    model_raw, gate_raw, total_raw = first_step_norms(0.0)  # 0: no clipping
    assert total_raw == pytest.approx(float(np.hypot(model_raw, gate_raw)), rel=1e-5)
    bound = gate_raw / 4  # below the gate's own norm: clipping the model alone would leave the gate over it
    model_clipped, gate_clipped, total_clipped = first_step_norms(bound)
    assert total_clipped == pytest.approx(bound, rel=1e-4)  # one global norm, gate included
    scale = total_clipped / total_raw  # the same factor on both: the update's direction is kept
    assert gate_clipped == pytest.approx(gate_raw * scale, rel=1e-4)
    assert model_clipped == pytest.approx(model_raw * scale, rel=1e-4)


@pytest.mark.parametrize("private", CalibrationTrainer._OVERRIDDEN)
def test_a_transformers_without_an_overridden_private_method_is_refused(tmp_path, monkeypatch, private):
    """Issue 50: transformers 5.2 had no ``Trainer._clip_grad_norm``, so the override that clips the gate with the model
    was never called and the gate went unclipped, silently; such a release is refused by name."""
    monkeypatch.delattr(Trainer, private)
    with pytest.raises(ImportError, match=f"Trainer.{private}.*transformers"):
        CalibrationTrainer(model=make_model("vit", seed=0), args=_args(tmp_path), compute_loss_func=_loss("ls"))


def test_user_optimizer_without_loss_parameters_warns(tmp_path, caplog):
    model, loss = make_model("vit", seed=0), _loss("fedlas_ls")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 32)),
        compute_loss_func=loss,
        optimizers=(opt, None),
    )
    with caplog.at_level("WARNING", logger="hf_calibration.training.trainer"):
        trainer.create_optimizer()
    assert "does not hold the loss's parameters" in caplog.text


# ----------------------------------------------------------------------------- checkpoints


@contextlib.contextmanager
def _trainer_warnings():
    """The messages `transformers.trainer` logs at WARNING and above (a handler of its own: transformers' logging
    may not propagate to pytest's)."""
    messages, handler = [], logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    trainer_logger = logging.getLogger("transformers.trainer")
    trainer_logger.addHandler(handler)
    try:
        yield messages
    finally:
        trainer_logger.removeHandler(handler)


class _LossStateRecorder(TrainerCallback):
    def __init__(self, loss):
        self.loss, self.at_save, self.at_train_begin = loss, {}, None

    def on_save(self, args, state, control, **kw):
        self.at_save[state.global_step] = _state(self.loss)

    def on_train_begin(self, args, state, control, **kw):
        self.at_train_begin = _state(self.loss)


@pytest.mark.parametrize("name", FEATURE_LOSSES)
def test_checkpoint_then_resume_restores_the_loss_state(tmp_path, name):
    from safetensors.torch import load_file

    data = digits_dataset(slice(0, 64))
    args = _args(tmp_path / "run", max_steps=4, save_strategy="steps", save_steps=2)
    loss = _loss(name)
    rec = _LossStateRecorder(loss)
    CalibrationTrainer(
        model=make_model("vit", seed=0), args=args, train_dataset=data, compute_loss_func=loss, callbacks=[rec]
    ).train()
    final = _state(loss)
    ckpt = tmp_path / "run" / "checkpoint-2"
    saved = load_file(str(ckpt / LOSS_STATE_NAME))
    _assert_state_equal(saved, rec.at_save[2], rtol=0, atol=0)
    assert not torch.equal(saved["nci_mean"], final["nci_mean"])  # the checkpoint is of step 2, not the end

    # a fresh trainer with a fresh loss resumes from step 2 and ends where the uninterrupted run ended
    loss2 = _loss(name)
    rec2 = _LossStateRecorder(loss2)
    with _trainer_warnings() as warnings:
        CalibrationTrainer(
            model=make_model("vit", seed=5), args=args, train_dataset=data, compute_loss_func=loss2, callbacks=[rec2]
        ).train(resume_from_checkpoint=str(ckpt))
    _assert_state_equal(rec2.at_train_begin, saved, rtol=0, atol=0)
    _assert_state_equal(_state(loss2), final, rtol=1e-6, atol=1e-7)
    # ViT's weights are saved under other names: restored through from_pretrained, without transformers'
    # "missing keys" warning for exactly those keys
    assert not [m for m in warnings if "missing keys" in m]


class _StateAtStep(TrainerCallback):
    """The model's state at the end of every step (before `load_best_model_at_end` replaces it)."""

    def __init__(self, model):
        self.model, self.states = model, {}

    def on_step_end(self, args, state, control, **kw):
        self.states[state.global_step] = _state(self.model)


@pytest.mark.parametrize("arch", MODEL_NAMES)
def test_load_best_model_at_end_restores_every_weight_and_the_loss_state(tmp_path, arch):
    """Before: only the tensors saved under their module names came back (ViT 8 of 40), the rest stayed at the last step.

    ResNet and timm (`TimmWrapperForImageClassification`) save under their module names: `Trainer`'s own load is kept
    for them, and checked here all the same."""
    from safetensors.torch import load_file

    scores = iter([0.9, 0.1, 0.2])  # evaluations after steps 1, 2, 3: step 1 is the best, not the last
    model, loss = make_model(arch, seed=0), _loss("fedlas_ls")
    at_step = _StateAtStep(model)
    args = _args(
        tmp_path / "run",
        max_steps=3,
        optim="sgd",
        learning_rate=0.5,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="score",
    )
    trainer = CalibrationTrainer(
        model=model,
        args=args,
        train_dataset=digits_dataset(slice(0, 48)),
        eval_dataset=digits_dataset(slice(100, 116)),
        compute_loss_func=loss,
        compute_metrics=lambda prediction: {"score": next(scores)},
        callbacks=[at_step],
    )
    with _trainer_warnings() as warnings:
        trainer.train()
    best = tmp_path / "run" / "checkpoint-1"
    assert trainer.state.best_model_checkpoint == str(best)
    reference = type(model).from_pretrained(best).state_dict()  # transformers' own loading, renames applied
    restored = model.state_dict()
    assert restored.keys() == reference.keys()
    assert [k for k in restored if not torch.equal(restored[k], reference[k])] == []
    _assert_state_equal(_state(loss), load_file(str(best / LOSS_STATE_NAME)), rtol=0, atol=0)
    # the run moved after step 1, so a partial restore would show: most tensors differ at the last step
    last = at_step.states[3]
    assert sum(not torch.equal(last[k], reference[k]) for k in reference) > len(reference) // 2
    assert not [m for m in warnings if "missing keys" in m]


def test_save_model_writes_the_loss_state(tmp_path):
    from safetensors.torch import load_file

    loss = _loss("fedlas_ls")
    trainer = CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), compute_loss_func=loss)
    trainer.save_model(str(tmp_path / "final"))
    _assert_state_equal(load_file(str(tmp_path / "final" / LOSS_STATE_NAME)), _state(loss), rtol=0, atol=0)
    assert trainer.load_loss_state(str(tmp_path / "final"))
    # losses without state write nothing
    trainer = CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), compute_loss_func=_loss("ls"))
    trainer.save_model(str(tmp_path / "ls"))
    assert not (tmp_path / "ls" / LOSS_STATE_NAME).exists()


# ----------------------------------------------------------------------------- evaluation


def test_eval_gives_plain_logits_and_leaves_ema_alone(tmp_path):
    model, loss = make_model("vit", seed=0), _loss("fedlas_ls")
    eval_ds = digits_dataset(slice(100, 140))
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 32)),
        eval_dataset=eval_ds,
        compute_loss_func=loss,
    )
    trainer.train()
    ema = _state(loss)
    pred = trainer.predict(eval_ds)
    metrics = trainer.evaluate()
    _assert_state_equal(_state(loss), ema, rtol=0, atol=0)
    assert loss.training is False  # follows model.eval()
    assert isinstance(pred.predictions, np.ndarray) and pred.predictions.shape == (40, 10)
    x, y = digits(slice(100, 140))
    model.eval()
    with torch.no_grad():
        logits = model(pixel_values=x).logits
        expected = copy.deepcopy(loss).eval()(logits, y, features=head_input("vit", model, x)).item()
    np.testing.assert_allclose(pred.predictions, logits.numpy(), rtol=1e-5, atol=1e-6)
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- gradient accumulation


@pytest.mark.parametrize(
    "trainer_cls, name", [(Trainer, "mbls"), (CalibrationTrainer, "ls"), (CalibrationTrainer, "flsd53")]
)
def test_gradient_accumulation_matches_one_big_batch(tmp_path, trainer_cls, name):
    x, y = digits(slice(0, 32))
    y = y.clone()
    y[[0, 1, 2, 5, 6, 17]] = -100  # uneven ignored labels: per-micro-batch means would differ
    data = DictDataset(x, y)
    runs = {}
    for bs, ga in ((16, 2), (32, 1)):
        model = make_model("vit", seed=0)
        args = _args(
            tmp_path / f"{bs}",
            per_device_train_batch_size=bs,
            gradient_accumulation_steps=ga,
            max_steps=2,
            optim="sgd",
            max_grad_norm=0.0,
            learning_rate=0.5,
        )
        trainer = trainer_cls(model=model, args=args, train_dataset=data, compute_loss_func=_loss(name))
        trainer.train()
        runs[ga] = (_state(model), [h["loss"] for h in trainer.state.log_history if "loss" in h])
    _assert_state_equal(runs[1][0], runs[2][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runs[1][1], runs[2][1], rtol=1e-5)


# ----------------------------------------------------------------------------- the plain Trainer


def test_plain_trainer_trains_with_feature_free_losses(tmp_path):
    model, loss = make_model("vit", seed=0), _loss("ls")
    x, y = digits(slice(0, 16))
    expected = _expected_first_loss(model, "vit", loss, x, y)
    trainer = Trainer(
        model=model, args=_args(tmp_path), train_dataset=digits_dataset(slice(0, 32)), compute_loss_func=loss
    )
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, rel=1e-5)


def test_plain_trainer_with_fedlas_says_to_use_calibration_trainer(tmp_path):
    trainer = Trainer(
        model=make_model("vit"),
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 32)),
        compute_loss_func=_loss("fedlas_ls"),
    )
    with pytest.raises(ValueError, match="CalibrationTrainer"):
        trainer.train()


# ----------------------------------------------------------------------------- the card's spelling: a loss class


@pytest.mark.parametrize("spelling", ["compute_loss", "compute_loss_func"])
def test_a_fedlas_class_is_built_with_its_defaults_and_the_models_num_labels(tmp_path, spelling):
    """`CalibrationTrainer(..., compute_loss=FeDLaSLoss)`: the same run as with `FeDLaSLoss(num_classes=10)`."""
    data = digits_dataset(slice(0, 32))
    by_class = CalibrationTrainer(
        model=make_model("vit", seed=0), args=_args(tmp_path / "a"), train_dataset=data, **{spelling: FeDLaSLoss}
    )
    loss = by_class.calibration_loss
    assert type(loss) is FeDLaSLoss and loss.num_classes == 10
    assert (loss.variant, loss.base, loss.beta, loss.theta) == ("ls", 0.05, 4.0, 0.95)  # the paper's defaults
    by_instance = CalibrationTrainer(
        model=make_model("vit", seed=0),
        args=_args(tmp_path / "b"),
        train_dataset=data,
        compute_loss_func=FeDLaSLoss(num_classes=10),
    )
    x, y = digits(slice(0, 16))
    expected = _expected_first_loss(by_class.model, "vit", loss, x, y)
    by_class.train()
    by_instance.train()
    assert by_class.state.log_history[0]["loss"] == pytest.approx(expected, rel=1e-5)
    _assert_state_equal(_state(by_class.model), _state(by_instance.model), rtol=0, atol=0)
    _assert_state_equal(_state(loss), _state(by_instance.calibration_loss), rtol=0, atol=0)


def test_a_feature_free_loss_class_and_an_instance_without_num_classes(tmp_path):
    data = digits_dataset(slice(0, 32))
    trainer = CalibrationTrainer(
        model=make_model("vit", seed=0), args=_args(tmp_path), train_dataset=data, compute_loss_func=LabelSmoothingLoss
    )
    assert type(trainer.calibration_loss) is LabelSmoothingLoss and trainer.calibration_loss.alpha == 0.05
    x, y = digits(slice(0, 16))
    expected = _expected_first_loss(trainer.model, "vit", LabelSmoothingLoss(0.05), x, y)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, rel=1e-5)
    # FeDLaSLoss() without num_classes: the trainer fills it
    loss = FeDLaSLoss(variant="mbls")
    CalibrationTrainer(model=make_model("swin", seed=0), args=_args(tmp_path), compute_loss=loss)
    assert loss.num_classes == 10 and loss.gate.fc_in.in_features == 10


def test_a_loss_that_does_not_fit_the_model_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="`num_classes` \\(5\\).*number of labels \\(10\\)"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), compute_loss_func=FeDLaSLoss(num_classes=5))
    with pytest.raises(TypeError, match="`compute_loss`.*`compute_loss_func`"):
        CalibrationTrainer(
            model=make_model("vit"), args=_args(tmp_path), compute_loss=FeDLaSLoss, compute_loss_func=FeDLaSLoss
        )
    with pytest.raises(TypeError, match="`compute_loss`.*loss class"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), compute_loss=dict)


@pytest.mark.parametrize(
    "cls, message",
    [
        (LabelSmoothingLoss, r"^LabelSmoothingLoss is a loss class.*`compute_loss_func=LabelSmoothingLoss\(\)`\.$"),
        (
            FeDLaSLoss,
            r"^FeDLaSLoss is a loss class that needs.*`hf_calibration\.CalibrationTrainer\(\.\.\., compute_loss=FeDLaSLoss\)`\.$",
        ),
    ],
)
def test_plain_trainer_with_a_loss_class_says_what_to_pass(tmp_path, cls, message):
    trainer = Trainer(
        model=make_model("vit"), args=_args(tmp_path), train_dataset=digits_dataset(slice(0, 32)), compute_loss_func=cls
    )
    with pytest.raises(TypeError, match=message):
        trainer.train()


# ----------------------------------------------------------------------------- one seed, one run


def test_one_seed_gives_one_run_whatever_the_global_rng(tmp_path):
    """The gate was drawn from torch's global RNG when the loss was built: `TrainingArguments(seed=...)` did not reach it."""
    runs = {}
    for global_seed, seed in ((1, 0), (2, 0), (1, 7)):
        model = make_model("vit", seed=0)
        torch.manual_seed(global_seed)  # whatever the script's RNG holds when it builds the loss
        loss = _loss("fedlas_ls")
        CalibrationTrainer(
            model=model,
            args=_args(tmp_path, seed=seed),
            train_dataset=digits_dataset(slice(0, 32)),
            compute_loss_func=loss,
        ).train()
        runs[global_seed, seed] = (_state(model), _state(loss))
    for a, b in zip(runs[1, 0], runs[2, 0]):
        _assert_state_equal(a, b, rtol=0, atol=0)
    assert not torch.equal(
        runs[1, 0][1]["gate.fc_in.weight"], runs[1, 7][1]["gate.fc_in.weight"]
    )  # the seed reaches it


def test_a_gate_with_its_own_seed_or_a_loaded_state_is_kept(tmp_path):
    seeded = FeDLaSLoss(num_classes=10, seed=3)
    before = _state(seeded)
    CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path, seed=0), compute_loss_func=seeded)
    _assert_state_equal(_state(seeded), before, rtol=0, atol=0)
    loaded = FeDLaSLoss(num_classes=10)
    loaded.load_state_dict(before)
    CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path, seed=0), compute_loss_func=loaded)
    _assert_state_equal(_state(loaded), before, rtol=0, atol=0)


# ----------------------------------------------------------------------------- bad input


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="`head`"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), compute_loss_func=_loss("ce"), head=3)
    with pytest.raises(TypeError, match="`compute_loss_func`"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), compute_loss_func="ce")
    with pytest.raises(ValueError, match="`head`"):
        CalibrationTrainer(
            model=make_model("vit"), args=_args(tmp_path), compute_loss_func=_loss("fedlas_ls"), head="vit.embeddings"
        )
    with pytest.raises(ValueError, match="`maccal`"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path)).run_maccal()
    with pytest.raises(TypeError, match="`maccal`"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), maccal={"epochs": 1}).run_maccal()


# ----------------------------------------------------------------------------- MaC-Cal wiring


def _fake_stage(monkeypatch) -> list:
    """Replace the MaC-Cal stage by a recorder of its arguments."""
    from hf_calibration.maccal import MaCCalConfig

    calls = []
    fake = types.ModuleType("hf_calibration.maccal")
    fake.maccal_stage = lambda model, dataset, config, **kw: calls.append((model, dataset, config, kw))
    fake.MaCCalConfig = MaCCalConfig
    monkeypatch.setitem(sys.modules, "hf_calibration.maccal", fake)
    return calls


@pytest.mark.parametrize("name, expected_loss", [("fedlas_ls", "FeDLaSLSLoss"), ("ls", "LabelSmoothingLoss")])
@pytest.mark.parametrize("separate_maccal_data", [False, True])
def test_maccal_runs_after_train_with_the_right_base_loss(
    tmp_path, monkeypatch, caplog, name, expected_loss, separate_maccal_data
):
    from hf_calibration.maccal import MaCCalConfig

    calls = _fake_stage(monkeypatch)
    caplog.set_level(logging.WARNING, logger="hf_calibration.training.trainer")
    model, data, config = make_model("vit"), digits_dataset(slice(0, 32)), MaCCalConfig(progress=False)
    plain = digits_dataset(slice(32, 64)) if separate_maccal_data else None  # e.g. the non-augmented images
    loss = _loss(name)
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=data,
        compute_loss_func=loss,
        maccal=config,
        maccal_dataset=plain,
        head="classifier",
    )
    trainer.train()
    assert len(calls) == 1
    m, d, c, kw = calls[0]
    assert m is model and d is (plain if separate_maccal_data else data) and c is config
    assert type(kw["loss"]).__name__ == expected_loss and kw["loss"] is loss  # the stage copies it itself
    assert kw["head"] == "classifier" and kw["data_collator"] is trainer.data_collator
    assert kw["log_fn"] == trainer._log_maccal_epoch
    # retraining the head on the training set is what made ECE worse: said when no held-out data is given
    warned = [r.getMessage() for r in caplog.records if "maccal_dataset" in r.getMessage()]
    assert len(warned) == (0 if separate_maccal_data else 1)


@pytest.mark.parametrize("disable_tqdm", [True, False])
def test_maccal_progress_bars_follow_disable_tqdm(tmp_path, monkeypatch, disable_tqdm):
    from hf_calibration.maccal import MaCCalConfig

    calls = _fake_stage(monkeypatch)
    trainer = CalibrationTrainer(
        model=make_model("vit"), args=_args(tmp_path, disable_tqdm=disable_tqdm), maccal=MaCCalConfig(epochs=1)
    )
    trainer.run_maccal()
    assert calls[0][2].progress is (not disable_tqdm)
    assert calls[0][2].epochs == 1


def test_real_maccal_after_fedlas_then_evaluate(tmp_path):
    from hf_calibration.maccal import MaCCalConfig

    model, loss = make_model("vit", seed=0), _loss("fedlas_ls")
    old_head = model.classifier
    eval_ds = digits_dataset(slice(100, 140))
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 64)),
        eval_dataset=eval_ds,
        compute_loss_func=loss,
        maccal=MaCCalConfig(epochs=1, batch_size=32),
    )
    trainer.train()
    assert model.classifier is not old_head  # the stage replaced the head
    ema = _state(loss)
    pred = trainer.predict(eval_ds)  # the loss now hooks the new head: its input is the same feature
    _assert_state_equal(_state(loss), ema, rtol=0, atol=0)
    x, _ = digits(slice(100, 140))
    model.eval()
    with torch.no_grad():
        np.testing.assert_allclose(pred.predictions, model(pixel_values=x).logits.numpy(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- Mixup


def _mixup_draw(seed: int, step: int, micro: int, n: int) -> tuple[float, torch.Tensor]:
    """The documented draw: λ ~ Beta(α, α) then π, from numpy's generator seeded with (seed, global step, micro-batch)."""
    rng = np.random.default_rng((seed, step, micro))
    lam = float(rng.beta(0.4, 0.4))
    return lam, torch.from_numpy(rng.permutation(n))


def _record_pixels(model: nn.Module) -> list:
    seen = []
    model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["pixel_values"].detach().clone()), with_kwargs=True
    )
    return seen


@pytest.mark.parametrize("loss_name", [None, "ls"])
def test_mixup_trains_on_mixed_images_with_the_mixed_loss(tmp_path, loss_name):
    """Each step sees λ·x + (1 − λ)·x[π] and its loss is λ·L(z, y) + (1 − λ)·L(z, y[π]), recomputed here by hand."""
    model = make_model("vit", seed=0)
    initial = copy.deepcopy(model).eval()
    seen = _record_pixels(model)
    loss = None if loss_name is None else _loss(loss_name)
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 32)),
        compute_loss_func=loss,
        mixup_alpha=0.4,
    )
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    for step, (lo, hi) in enumerate(((0, 16), (16, 32))):  # sequential sampler: step k trains on samples 16k..16k+15
        x, y = digits(slice(lo, hi))
        lam, perm = _mixup_draw(0, step, 0, 16)
        assert 0.0 < lam < 1.0
        torch.testing.assert_close(seen[step], lam * x + (1 - lam) * x[perm])
    x, y = digits(slice(0, 16))
    lam, perm = _mixup_draw(0, 0, 0, 16)
    with torch.no_grad():
        logits = initial(pixel_values=lam * x + (1 - lam) * x[perm]).logits

    def plain(z, t):  # LS by hand: (1 - α)·CE + α·mean_k(-log p_k), α = 0.05
        ce = F.cross_entropy(z, t)
        return ce if loss_name is None else 0.95 * ce + 0.05 * (-F.log_softmax(z, 1).mean(1)).mean()

    expected = lam * plain(logits, y) + (1 - lam) * plain(logits, y[perm])
    assert logged[0] == pytest.approx(expected.item(), rel=1e-5)


def test_mixup_with_fedlas_moves_the_statistics_once_per_batch(tmp_path):
    model, loss = make_model("vit", seed=0), _loss("fedlas_ls")
    initial = copy.deepcopy(model).eval()
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path, max_steps=1),
        train_dataset=digits_dataset(slice(0, 16)),
        compute_loss_func=loss,
        mixup_alpha=0.4,
    )
    trainer.train()
    x, _ = digits(slice(0, 16))
    lam, perm = _mixup_draw(0, 0, 0, 16)
    with torch.no_grad():
        norms = head_input("vit", initial, lam * x + (1 - lam) * x[perm]).abs().sum(1).double()
    theta = loss.theta  # one EMA step from the initial (20, 100), not two
    assert loss.nci_mean.item() == pytest.approx(theta * norms.mean().item() + (1 - theta) * 20.0, rel=1e-5)
    assert loss.nci_std.item() == pytest.approx(theta * norms.std().item() + (1 - theta) * 100.0, rel=1e-5)


def test_mixup_leaves_evaluation_alone(tmp_path):
    model = make_model("vit", seed=0)
    trainer = CalibrationTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=digits_dataset(slice(0, 32)),
        eval_dataset=digits_dataset(slice(100, 140)),
        mixup_alpha=1.0,
    )
    trainer.train()
    x, y = digits(slice(100, 140))
    model.eval()
    with torch.no_grad():
        expected = F.cross_entropy(model(pixel_values=x).logits, y).item()
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-5)


class _NoPixels(nn.Module):
    def __init__(self):
        super().__init__()
        self.classifier = nn.Linear(64, 10)

    def forward(self, inputs, labels=None):
        return types.SimpleNamespace(logits=self.classifier(inputs.flatten(1)))


class _InputsDataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "labels": self.y[i]}


def test_mixup_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="`mixup_alpha`"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), mixup_alpha=-0.1)
    with pytest.raises(TypeError, match="`mixup_alpha`"):
        CalibrationTrainer(model=make_model("vit"), args=_args(tmp_path), mixup_alpha="0.2")
    x, y = digits(slice(0, 16))
    trainer = CalibrationTrainer(
        model=_NoPixels(),
        args=_args(tmp_path),
        train_dataset=_InputsDataset(x, y),
        compute_loss_func=_loss("ce"),
        mixup_alpha=0.2,
    )
    with pytest.raises(ValueError, match="`pixel_values`.*`mixup_alpha`.*inputs"):
        trainer.train()
