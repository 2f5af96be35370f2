"""MaC-Cal's second stage on real models: frozen backbone, cached features, the head's fast training, the trainer."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from _models import digits, digits_dataset, head_input, make_model
from torch.nn import functional as F
from transformers import TrainerCallback

from hf_calibration._core.features import find_classifier_head
from hf_calibration.maccal import MaCCalConfig, MaskedBottleneckHead, load_maccal_model, maccal_stage
from hf_calibration.maccal.stage import cache_features

torch.set_num_threads(1)
FAST = dict(epochs=3, batch_size=64, progress=False)


def _clone(model):
    return copy.deepcopy(model)


# ----------------------------------------------------------------------------- the stage on real models


@pytest.mark.parametrize("name", ["vit", "resnet", "timm"])
def test_cached_features_are_the_heads_input(name):
    model = make_model(name, seed=0).eval()
    ds = digits_dataset(slice(0, 40))
    feats, labels = cache_features(model, ds, batch_size=16, progress=False)
    torch.testing.assert_close(feats, head_input(name, model, ds.pixel_values).flatten(1))
    assert torch.equal(labels, ds.labels)


def test_stage_freezes_backbone_installs_head_and_logs(trained_vit):
    model = _clone(trained_vit)
    ds = digits_dataset(slice(0, 256))
    backbone = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("classifier")}
    logs = []
    result = maccal_stage(model, ds, MaCCalConfig(**FAST), log_fn=logs.append)
    # backbone bit-identical
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in backbone.items())
    # head replaced and recorded
    assert isinstance(model.classifier, MaskedBottleneckHead) and model.classifier is result.head
    assert model.config.maccal_head == {
        "path": "classifier",
        "in_features": 16,
        "hidden": 20,
        "num_labels": 10,
        "base_model_type": "vit",
    }
    assert find_classifier_head(model)[2] is model.classifier
    # one log record per epoch, with the documented keys
    assert len(logs) == 3 and len(result.history) == 3
    for record in logs:
        assert {"maccal/retention", "maccal/train_accuracy", "maccal/mean_confidence", "maccal/loss"} <= set(record)
        assert all(isinstance(v, float) for v in record.values())
        assert 0 < record["maccal/mean_confidence"] <= 1 and 0 <= record["maccal/train_accuracy"] <= 1
    # inference is deterministic, in eval and train mode alike (no masks left)
    x = ds.pixel_values[:32]
    with torch.no_grad():
        a = model(pixel_values=x).logits
        model.train()
        b = model(pixel_values=x).logits
        model.eval()
    assert torch.equal(a, b)
    # the logits are the bottleneck applied by hand to the frozen features
    f = head_input("vit", model, x)
    h = model.classifier
    by_hand = torch.relu(f @ h.fc1.weight.T + h.fc1.bias) @ h.fc2.weight.T + h.fc2.bias
    torch.testing.assert_close(a, by_hand)


def test_stage_is_reproducible_and_seeded(trained_vit):
    ds = digits_dataset(slice(0, 128))
    runs = [maccal_stage(_clone(trained_vit), ds, MaCCalConfig(**FAST, seed=s)).head for s in (0, 0, 1)]
    assert torch.equal(runs[0].fc1.weight, runs[1].fc1.weight)
    assert not torch.equal(runs[0].fc1.weight, runs[2].fc1.weight)


def test_fixed_retention_stays_fixed(trained_vit):
    result = maccal_stage(
        _clone(trained_vit), digits_dataset(slice(0, 128)), MaCCalConfig(**FAST, adaptive=False, rho0=0.7)
    )
    assert result.retention == [0.7, 0.7, 0.7]


def test_without_cache_the_backbone_reruns_and_stays_frozen(trained_vit):
    model = _clone(trained_vit)
    backbone = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("classifier")}
    result = maccal_stage(model, digits_dataset(slice(0, 128)), MaCCalConfig(**FAST, cache_features=False))
    assert len(result.history) == 3 and result.history[-1]["train_accuracy"] > 0.1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in backbone.items())


def test_base_loss_receives_the_cached_features(trained_vit):
    ds = digits_dataset(slice(0, 96))
    expected = head_input("vit", trained_vit, ds.pixel_values)

    class SpyLoss(torch.nn.Module):
        requires_features = True

        def __init__(self):
            super().__init__()
            self.seen = []

        def forward(self, logits, labels, features=None, num_items_in_batch=None):
            self.seen.append(features.detach().clone())
            return F.cross_entropy(logits, labels)

    spy = SpyLoss()
    maccal_stage(_clone(trained_vit), ds, MaCCalConfig(epochs=1, batch_size=32, progress=False), loss=spy)
    assert spy.seen == []  # a loss module is deep-copied: the caller's state is untouched

    seen = []

    def loss_fn(logits, labels, features=None):
        seen.append(features.detach().clone())
        return F.cross_entropy(logits, labels)

    loss_fn.requires_features = True
    maccal_stage(_clone(trained_vit), ds, MaCCalConfig(epochs=1, batch_size=32, progress=False), loss=loss_fn)
    feats = torch.cat(seen)
    assert feats.shape == expected.shape
    # one epoch sees every training row once, shuffled: compare as sorted multisets of rows
    key = lambda t: t[torch.argsort(t[:, 0] * 1e3 + t[:, 1])]  # noqa: E731
    torch.testing.assert_close(key(feats), key(expected))


@pytest.mark.parametrize("loss", ["ls", "focal", "fedlas_ls"])
def test_project_losses_work_as_base_loss(trained_vit, loss):
    pytest.importorskip("hf_calibration.losses")
    result = maccal_stage(
        _clone(trained_vit),
        digits_dataset(slice(0, 96)),
        MaCCalConfig(epochs=2, batch_size=32, progress=False),
        loss=loss,
    )
    assert all(math.isfinite(h["loss"]) for h in result.history)


def test_stage_rejects_bad_arguments(trained_vit):
    with pytest.raises(ValueError, match="`dataset`"):
        maccal_stage(_clone(trained_vit), None, MaCCalConfig(**FAST))
    with pytest.raises(TypeError, match="`config`"):
        maccal_stage(_clone(trained_vit), digits_dataset(slice(0, 8)), {"epochs": 1})
    with pytest.raises(ValueError, match="features"):
        maccal_stage(
            _clone(trained_vit),
            features=(torch.zeros(8, 5), torch.zeros(8, dtype=torch.long)),
            config=MaCCalConfig(**FAST),
        )
    with pytest.raises(TypeError, match="`loss`"):
        maccal_stage(_clone(trained_vit), digits_dataset(slice(0, 8)), MaCCalConfig(**FAST), loss=3)


def _features_and_labels(n=32, d=16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g), torch.randint(0, 10, (n,), generator=g)


def _with(x, y, **edits):
    x, y = x.clone(), y.clone()
    if "x_value" in edits:
        x[3, 5] = edits["x_value"]
    if "y_value" in edits:
        y[4] = edits["y_value"]
    return x, y


_X, _Y = _features_and_labels()
BAD_FEATURES = {
    "nan feature": (_with(_X, _Y, x_value=float("nan")), ValueError, r"`features\[0\]` to be finite.*row 3"),
    "inf feature": (_with(_X, _Y, x_value=float("inf")), ValueError, r"`features\[0\]` to be finite"),
    "label = K": (_with(_X, _Y, y_value=10), ValueError, r"`features\[1\]`.*\[0, 10\).*found 10"),
    "label -1": (_with(_X, _Y, y_value=-1), ValueError, r"`features\[1\]`.*found -1"),
    "N mismatch": ((_X, _Y[:-1]), ValueError, r"same number of samples N, but got 32 and 31"),
    "float labels": ((_X, _Y.float() + 0.5), TypeError, r"`features\[1\]`.*integer class indices.*float32"),
    "numpy float labels": ((_X.numpy(), _Y.numpy().astype(np.float64)), TypeError, r"`features\[1\]`.*float64"),
    "not a pair": ((_X, _Y, _Y), TypeError, r"`features` to be a pair.*length 3"),
    "labels 2-d": ((_X, _Y[:, None]), ValueError, r"`features\[1\]`.*shape \(N,\)"),
    "list features": (([[0.0] * 16] * 32, _Y), TypeError, r"`features\[0\]` to be a torch.Tensor or numpy array"),
}


@pytest.mark.parametrize("case", list(BAD_FEATURES))
def test_stage_checks_given_features_before_training(trained_vit, case):
    """Bad ``features=(X, Y)`` is refused with the argument's name before any epoch runs or the head is replaced."""
    features, error, message = BAD_FEATURES[case]
    model = _clone(trained_vit)
    head_before = model.classifier
    epochs = []
    with pytest.raises(error, match=message):
        maccal_stage(model, features=features, config=MaCCalConfig(**FAST), log_fn=epochs.append)
    assert epochs == []  # nothing trained
    assert model.classifier is head_before  # nothing installed


def test_stage_accepts_ignored_labels_and_numpy_features(trained_vit):
    x, y = _with(_X, _Y, y_value=-100)
    result = maccal_stage(_clone(trained_vit), features=(x.numpy(), y.numpy()), config=MaCCalConfig(**FAST))
    assert len(result.history) == FAST["epochs"]
    assert all(math.isfinite(h["loss"]) for h in result.history)


def test_stage_checks_dataset_labels_before_training(trained_vit):
    x, y = digits(slice(0, 16))
    rows = [{"pixel_values": x[i], "labels": torch.tensor(12 if i == 5 else int(y[i]))} for i in range(16)]
    epochs = []
    with pytest.raises(ValueError, match=r"`dataset`.*\[0, 10\).*found 12"):
        maccal_stage(_clone(trained_vit), rows, MaCCalConfig(**FAST), log_fn=epochs.append)
    assert epochs == []


def _stage1_logits(model, x):
    with torch.no_grad():
        return model.classifier(x)


def test_linear_init_starts_from_the_trained_head(trained_vit):
    """init="linear": with a learning rate too small to move the weights, stage 2 gives back stage 1's logits."""
    x, y = _features_and_labels(64)
    model = _clone(trained_vit)
    expected = _stage1_logits(model, x)
    maccal_stage(model, features=(x, y), config=MaCCalConfig(**FAST, init="linear", lr=1e-12, momentum=0.0))
    torch.testing.assert_close(_stage1_logits(model, x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("feedback", ["full", "masked"])
def test_feedback_measures_the_unmasked_or_the_masked_head(trained_vit, feedback):
    """The first epoch's accuracy and confidence, from the unmasked head (= stage 1's, weights frozen by a tiny lr)
    or from the masked passes (ρ = 0.5: different)."""
    x, y = _features_and_labels(64)
    model = _clone(trained_vit)
    p = torch.softmax(_stage1_logits(model, x), 1)
    config = MaCCalConfig(**FAST, init="linear", lr=1e-12, momentum=0.0, rho0=0.5, adaptive=False, feedback=feedback)
    first = maccal_stage(model, features=(x, y), config=config).history[0]
    confidence, accuracy = p.max(1).values.mean().item(), (p.argmax(1) == y).float().mean().item()
    if feedback == "full":
        assert first["mean_confidence"] == pytest.approx(confidence, abs=1e-5)
        assert first["train_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    else:
        assert first["mean_confidence"] != pytest.approx(confidence, abs=1e-3)


# ----------------------------------------------------------------------------- inside CalibrationTrainer


class _LogSteps(TrainerCallback):
    """Records the step each log record reaches the callbacks at (what TensorBoard plots against)."""

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kw):
        self.seen.append((state.global_step, dict(logs)))


@pytest.mark.parametrize("loss_name", ["ce", "fedlas_ls"])
def test_calibration_trainer_runs_the_real_stage_and_logs_it(tmp_path, loss_name):
    from transformers import TrainingArguments

    from hf_calibration.losses import get_loss
    from hf_calibration.training.trainer import CalibrationTrainer

    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=16,
        max_steps=3,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    loss = get_loss(loss_name, num_classes=10) if loss_name.startswith("fedlas") else get_loss(loss_name)
    ds = digits_dataset(slice(0, 96))
    model = make_model("vit", seed=0)
    recorder = _LogSteps()
    trainer = CalibrationTrainer(
        model=model,
        args=args,
        train_dataset=ds,
        eval_dataset=digits_dataset(slice(96, 128)),
        compute_loss_func=loss,
        maccal=MaCCalConfig(epochs=2, batch_size=32, progress=False),
        callbacks=[recorder],
    )
    trainer.train()
    assert isinstance(trainer.model.classifier, MaskedBottleneckHead)
    # Trainer.log received one record per stage-2 epoch: that is what TensorBoard / W&B callbacks see
    records = [r for r in trainer.state.log_history if "maccal/retention" in r]
    assert [r["maccal/epoch"] for r in records] == [0.0, 1.0]
    assert all(0 < r["maccal/mean_confidence"] <= 1 for r in records)
    # each epoch on its own step (the stage's epoch), not all at the last training step; the trainer's step is kept
    assert [step for step, logs in recorder.seen if "maccal/retention" in logs] == [0, 1]
    assert trainer.state.global_step == 3 and all(r["step"] == 3 for r in records)
    # the trained model still evaluates, saves and loads back with its bottleneck
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    trainer.save_model(str(tmp_path / "final"))
    loaded = load_maccal_model(tmp_path / "final")
    x = ds.pixel_values[:16]
    with torch.no_grad():
        assert torch.equal(trainer.model.eval()(pixel_values=x).logits, loaded(pixel_values=x).logits)


def test_bare_timm_model_with_tuple_batches():
    from torch.utils.data import TensorDataset

    model = make_model("timm", seed=0).timm_model.eval()  # a plain timm model, no transformers wrapper
    x, y = digits(slice(0, 64))
    before = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("head.")}
    result = maccal_stage(model, TensorDataset(x, y), MaCCalConfig(**FAST))
    assert result.head_path == "head" and isinstance(model.head, MaskedBottleneckHead)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    with torch.no_grad():
        f = model.forward_head(model.forward_features(x), pre_logits=True)
        h = model.head
        torch.testing.assert_close(model(x), torch.relu(f @ h.fc1.weight.T + h.fc1.bias) @ h.fc2.weight.T + h.fc2.bias)


# ----------------------------------------------------------------------------- the fast training path
#
# train_masked_head trains without autograd (hand-written forward/backward on one flat vector). The
# reference below is the textbook definition instead: autograd through relu(x (W1⊙M1·s)ᵀ + b1)(W2⊙M2·s)ᵀ + b2
# and an SGD step written entry by entry with torch.where (masked: no gradient, decay or momentum).


def _reference_training(params, loss_params, draws, epochs_batches, lr, momentum, weight_decay, loss_fn):
    """Plain autograd + masked SGD, float64; returns the head's parameters and per-epoch mean losses."""
    w1, b1, w2, b2 = (p.detach().clone().requires_grad_() for p in params)
    loss_params = list(loss_params)
    bufs = {}
    epoch_losses = []
    for (m1, m2, scale), batches in zip(draws, epochs_batches):
        keeps = {0: m1.bool(), 2: m2.bool()}  # index in [w1, b1, w2, b2]; biases are never masked
        total, count = 0.0, 0
        for x, y in batches:
            logits = torch.relu(x @ (w1 * m1 * scale).T + b1) @ (w2 * m2 * scale).T + b2
            loss = F.cross_entropy(logits, y) if loss_fn is None else loss_fn(logits, y, features=x)
            tensors = [w1, b1, w2, b2, *loss_params]
            grads = torch.autograd.grad(loss, tensors)
            with torch.no_grad():
                for i, (p, g) in enumerate(zip(tensors, grads)):
                    keep = keeps.get(i, torch.ones_like(p, dtype=torch.bool))
                    d = g + weight_decay * p if i in (0, 2) else g  # decay on the head's weight matrices only
                    if momentum:
                        if i not in bufs:
                            bufs[i] = torch.where(keep, d, torch.zeros_like(d))  # torch.optim.SGD: b = d at first
                        else:
                            bufs[i] = torch.where(keep, momentum * bufs[i] + d, bufs[i])
                        d = bufs[i]
                    p.copy_(torch.where(keep, p - lr * d, p))
            total += loss.item() * len(y)
            count += len(y)
        epoch_losses.append(total / count)
    return [w1.detach(), b1.detach(), w2.detach(), b2.detach()], epoch_losses


@pytest.mark.parametrize("loss_name", [None, "fedlas_ls"])
@pytest.mark.parametrize(
    "momentum, weight_decay, rescale, adaptive", [(0.9, 0.01, True, True), (0.0, 0.0, False, False)]
)
def test_fast_training_equals_autograd_with_reference_masked_sgd(loss_name, momentum, weight_decay, rescale, adaptive):
    from hf_calibration.maccal.stage import train_masked_head

    x_all, y_all = digits(slice(0, 150))
    x_all = x_all.flatten(1).double()
    x_all = (x_all - x_all.mean(0)) / (x_all.std(0) + 0.1)  # centred, like backbone features: ReLU units stay alive
    order = [torch.randperm(150, generator=torch.Generator().manual_seed(e)) for e in range(4)]
    epochs_batches = [
        [(x_all[o[s : s + 40]], y_all[o[s : s + 40]]) for s in range(0, 150, 40)] for o in order
    ]  # 40, 40, 40, 30

    torch.manual_seed(0)
    head = MaskedBottleneckHead(64, 12, 10).double()
    params0 = [p.detach().clone() for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias)]
    loss = None
    if loss_name is not None:
        from hf_calibration.losses import FeDLaSLoss

        loss = FeDLaSLoss(10, beta=4.0).double()
    ref_loss = copy.deepcopy(loss)  # train_masked_head deep-copies its loss: the same starting state

    draws, snapshots = [], []
    draw = head.draw_masks

    def spy_draw(retention, generator=None, rescale=False):
        masks = draw(retention, generator, rescale=rescale)
        draws.append((masks[0].clone(), masks[1].clone(), 1.0 / retention if rescale else 1.0))
        return masks

    head.draw_masks = spy_draw
    config = MaCCalConfig(
        epochs=4,
        lr=0.1,
        momentum=momentum,
        weight_decay=weight_decay,
        rho0=0.6,
        rho_min=0.5,
        rescale=rescale,
        adaptive=adaptive,
        progress=False,
    )
    snapshot = lambda record: snapshots.append([p.detach().clone() for p in (head.fc1.weight, head.fc2.weight)])  # noqa: E731
    history = train_masked_head(head, lambda epoch, g: iter(epochs_batches[epoch]), config, loss=loss, log_fn=snapshot)

    assert all(0 < m1.mean().item() < 1 for m1, _, _ in draws)  # real masks
    # (the FeDLaS gate's parameters are trained in both: if the fast path skipped them, its weights would drift)
    loss_params = [p for p in ref_loss.parameters()] if ref_loss is not None else []
    expected, epoch_losses = _reference_training(
        params0, loss_params, draws, epochs_batches, 0.1, momentum, weight_decay, ref_loss
    )
    for got, want in zip((head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias), expected):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose([h["loss"] for h in history], epoch_losses, rtol=1e-9)
    # masked entries are bit-unchanged over the epoch they were masked in (head is current at each epoch's end)
    before = [params0[0], params0[2]]
    for (m1, m2, _), after in zip(draws, snapshots):
        for w0, w, m in zip(before, after, (m1, m2)):
            assert torch.equal(w[m == 0], w0[m == 0])
            # kept entries move, except those whose input is always 0 (blank digit pixels) or whose unit is dead
            assert (w[m == 1] != w0[m == 1]).double().mean() > 0.5
        before = after


def test_fast_training_ignores_an_outer_autocast():
    from hf_calibration.maccal.stage import train_masked_head

    x, y = digits(slice(0, 96))
    x = x.flatten(1)
    heads = []
    for autocast in (False, True):
        torch.manual_seed(0)
        head = MaskedBottleneckHead(64, 16, 10)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            train_masked_head(
                head, lambda e, g: iter([(x[:64], y[:64]), (x[64:], y[64:])]), MaCCalConfig(epochs=2, progress=False)
            )
        heads.append(head)
    assert heads[1].fc1.weight.dtype == torch.float32
    for p, q in zip(heads[0].parameters(), heads[1].parameters()):
        assert torch.equal(p, q)


def test_stage_loss_is_a_copy_with_local_statistics():
    from hf_calibration.losses import FeDLaSLoss
    from hf_calibration.maccal.stage import _resolve_loss

    loss = FeDLaSLoss(10)
    staged = _resolve_loss(loss, 10)
    assert staged is not loss and staged.sync_statistics is False  # every process sees the whole stage-2 data
    assert loss.sync_statistics is True  # the trainer's own loss keeps summing across processes
    assert torch.equal(staged.gate.fc_in.weight, loss.gate.fc_in.weight)


def test_a_short_stage_prints_no_progress(capfd, monkeypatch, trained_vit):
    # the epoch bar's postfix once refreshed it before its delay: one 0 % frame per epoch on a non-interactive stderr
    from hf_calibration._core import progress as _progress

    monkeypatch.setattr(_progress, "DELAY_S", 3600.0)
    maccal_stage(
        _clone(trained_vit), digits_dataset(slice(0, 96)), MaCCalConfig(epochs=3, batch_size=32, progress=True)
    )
    assert "MaC-Cal" not in capfd.readouterr().err


def test_a_sigmoid_head_is_refused_by_name_not_an_index_error():
    """maccal_stage on a multi-label ViT failed with an IndexError (issue 40); CalibrationTrainer refused the same
    setup clearly: both now say why, from one check."""
    model = make_model("vit", seed=0, num_labels=3, problem_type="multi_label_classification")
    with pytest.raises(ValueError, match=r"softmax head for maccal_stage.*multi_label_classification.*sigmoid head"):
        maccal_stage(model, digits_dataset(slice(0, 32)), MaCCalConfig(epochs=1))
