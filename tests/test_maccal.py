"""MaC-Cal second stage: masks, mask-aware SGD, adaptive retention, frozen backbone, persistence."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from hf_calibration.features import find_classifier_head
from hf_calibration.maccal import MaCCalConfig, cache_features, clip_bound, maccal_stage, update_retention
from hf_calibration.masked_head import MaskedBottleneckHead, MaskedSGD, load_maccal_model

from _models import HEAD_PATHS, digits, digits_dataset, head_input, make_model

torch.set_num_threads(1)
FAST = dict(epochs=3, batch_size=64, progress=False)


def _train_briefly(model, x, y, steps=30, seed=0):
    """A few Adam steps so the backbone is no longer at its random init."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for i in range(steps):
        idx = torch.arange(i * 32, i * 32 + 32) % len(y)
        loss = F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def trained_vit():
    x, y = digits(slice(0, 256))
    return _train_briefly(make_model("vit", seed=0), x, y)


def _clone(model):
    import copy

    return copy.deepcopy(model)


# ----------------------------------------------------------------------------- the mask


def test_masked_forward_uses_w_times_m_and_gradient_is_masked():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(6, 5, 3).train()
    m1, m2 = head.draw_masks(0.5, torch.Generator().manual_seed(1))
    assert 0 < m1.sum() < m1.numel() and 0 < m2.sum() < m2.numel()
    x = torch.randn(4, 6)
    w1, b1, w2, b2 = (p.detach().clone() for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias))
    expected = torch.relu(x @ (w1 * m1).T + b1) @ (w2 * m2).T + b2  # by hand
    out = head(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    for weight, mask in ((head.fc1.weight, m1), (head.fc2.weight, m2)):
        assert torch.all(weight.grad[mask == 0] == 0)
        assert torch.count_nonzero(weight.grad[mask == 1]) > 0
    # inference: full weights, no mask, deterministic
    head.eval()
    torch.testing.assert_close(head(x), torch.relu(x @ w1.T + b1) @ w2.T + b2)
    head.train()
    head.clear_masks()
    torch.testing.assert_close(head(x), torch.relu(x @ w1.T + b1) @ w2.T + b2)


def test_masks_follow_the_retention_probability():
    head = MaskedBottleneckHead(64, 64, 10)
    m1, _ = head.draw_masks(0.3, torch.Generator().manual_seed(0))
    # 4096 Bernoulli(0.3) draws: mean within 4 standard deviations
    assert abs(m1.mean().item() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / m1.numel())


def test_masked_sgd_equals_torch_sgd_without_masks():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(5, 4), torch.nn.Linear(5, 4)
    b.load_state_dict(a.state_dict())
    ours = MaskedSGD(a.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for step in range(4):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_masked_entries_do_not_move_even_with_momentum_and_weight_decay():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(6, 5, 3).train()
    opt = MaskedSGD(head.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    # first epoch: everything kept, so every momentum buffer is non-zero
    head.draw_masks(1.0)
    opt.set_masks(dict(zip(head.masked_weights, head.masks)))
    opt.zero_grad()
    F.cross_entropy(head(x), y).backward()
    opt.step()
    # next epoch: a real mask; masked entries must keep their value and their momentum buffer
    masks = head.draw_masks(0.5, torch.Generator().manual_seed(3))
    opt.set_masks(dict(zip(head.masked_weights, masks)))
    before = [w.detach().clone() for w in head.masked_weights]
    bufs = [opt.state[w]["momentum_buffer"].clone() for w in head.masked_weights]
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(head(x), y).backward()
        opt.step()
    for w, w0, buf0, m in zip(head.masked_weights, before, bufs, masks):
        keep = m.bool()
        assert torch.equal(w.detach()[~keep], w0[~keep])
        assert torch.equal(opt.state[w]["momentum_buffer"][~keep], buf0[~keep])
        assert torch.all(w.detach()[keep] != w0[keep])


def test_masked_sgd_rejects_bad_hyperparameters():
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="lr"):
        MaskedSGD(params, lr=0.0)
    with pytest.raises(ValueError, match="momentum"):
        MaskedSGD(params, lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        MaskedSGD(params, lr=0.1, weight_decay=-1.0)


# ----------------------------------------------------------------------------- the adaptive rule


def test_clip_bound_decays_exponentially():
    cfg = MaCCalConfig(epochs=40, clip_bound=0.1, clip_decay=3.0)
    assert clip_bound(0, cfg) == pytest.approx(0.1)
    assert clip_bound(20, cfg) == pytest.approx(0.1 * math.exp(-1.5))  # 0.022313...
    assert clip_bound(40, cfg) == pytest.approx(0.1 * math.exp(-3.0))
    values = [clip_bound(t, cfg) for t in range(40)]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert MaCCalConfig(clip_decay=0.0).clip_bound == clip_bound(39, MaCCalConfig(clip_decay=0.0))


def test_rule_raises_retention_when_over_confident_and_lowers_it_when_under_confident():
    cfg = MaCCalConfig(kappa=1.0, step=1.0, clip_bound=0.1, rho_min=0.05, rho_max=1.0)
    # over-confident: conf 0.95 > acc 0.90 → ρ goes up by the gap 0.05 (inside the clip 0.1)
    assert update_retention(0.8, 0.90, 0.95, 0, cfg) == pytest.approx(0.85)
    # under-confident: conf 0.70 < acc 0.90 → ρ goes down by 0.1, the clip bound at epoch 0
    assert update_retention(0.8, 0.90, 0.70, 0, cfg) == pytest.approx(0.7)
    # later epochs clip harder: epoch 20 of 40 with γ = 3 → τ = 0.1·e^{-1.5} = 0.0223130
    assert update_retention(0.8, 0.90, 0.70, 20, cfg) == pytest.approx(0.8 - 0.1 * math.exp(-1.5))
    # κ discounts the accuracy: acc 1.0, conf 0.95, κ 0.9 → conf − κ·acc = +0.05
    assert update_retention(0.8, 1.0, 0.95, 0, MaCCalConfig(kappa=0.9, rho_min=0.05)) == pytest.approx(0.85)
    # a calibrated input (κ·acc == conf) leaves ρ unchanged; the bounds hold
    assert update_retention(0.6, 0.5, 0.5, 3, cfg) == pytest.approx(0.6)
    assert update_retention(0.98, 0.5, 1.0, 0, cfg) == 1.0
    assert update_retention(0.06, 1.0, 0.2, 0, cfg) == 0.05


@settings(max_examples=200, deadline=None)
@given(
    rho=st.floats(0.05, 1.0),
    acc=st.floats(0.0, 1.0),
    conf=st.floats(0.0, 1.0),
    epoch=st.integers(0, 39),
    step=st.floats(0.1, 10.0),
)
def test_rule_stays_within_bounds_and_clip(rho, acc, conf, epoch, step):
    cfg = MaCCalConfig(rho_min=0.05, rho_max=1.0, step=step, rho0=0.5)  # rho may start anywhere in the bounds
    new = update_retention(rho, acc, conf, epoch, cfg)
    assert 0.05 <= new <= 1.0
    assert abs(new - rho) <= clip_bound(epoch, cfg) + 1e-12
    gap = conf - cfg.kappa * acc  # over-confidence
    if gap > 0:
        assert new >= rho
    elif gap < 0:
        assert new <= rho


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"rho0": 0.0}, ValueError, "rho0"),
        ({"rho0": 1.5}, ValueError, "rho0"),
        ({"rho0": -0.2}, ValueError, "rho0"),
        ({"hidden": 0}, ValueError, "hidden"),
        ({"hidden": -3}, ValueError, "hidden"),
        ({"epochs": 0}, ValueError, "epochs"),
        ({"epochs": 2.5}, TypeError, "epochs"),
        ({"lr": 0.0}, ValueError, "lr"),
        ({"lr": -0.1}, ValueError, "lr"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"kappa": 0.0}, ValueError, "kappa"),
        ({"step": -1.0}, ValueError, "step"),
        ({"clip_bound": 0.0}, ValueError, "clip_bound"),
        ({"clip_decay": -1.0}, ValueError, "clip_decay"),
        ({"rho_min": 0.6, "rho_max": 0.5, "rho0": 0.55}, ValueError, "rho_min"),
        ({"rho_min": 0.5, "rho0": 0.3}, ValueError, "rho0"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"adaptive": "yes"}, TypeError, "adaptive"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_bad_config_is_rejected(kwargs, error, name):
    with pytest.raises(error, match=f"`{name}`"):
        MaCCalConfig(**kwargs)


def test_rho0_of_one_is_allowed():
    assert MaCCalConfig(rho0=1.0).rho0 == 1.0


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
    assert model.config.maccal_head == {"path": "classifier", "in_features": 16, "hidden": 20, "num_labels": 10}
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
    result = maccal_stage(_clone(trained_vit), digits_dataset(slice(0, 128)), MaCCalConfig(**FAST, adaptive=False, rho0=0.7))
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
    result = maccal_stage(_clone(trained_vit), digits_dataset(slice(0, 96)), MaCCalConfig(epochs=2, batch_size=32, progress=False), loss=loss)
    assert all(math.isfinite(h["loss"]) for h in result.history)


def test_stage_rejects_bad_arguments(trained_vit):
    with pytest.raises(ValueError, match="`dataset`"):
        maccal_stage(_clone(trained_vit), None, MaCCalConfig(**FAST))
    with pytest.raises(TypeError, match="`config`"):
        maccal_stage(_clone(trained_vit), digits_dataset(slice(0, 8)), {"epochs": 1})
    with pytest.raises(ValueError, match="features"):
        maccal_stage(_clone(trained_vit), features=(torch.zeros(8, 5), torch.zeros(8, dtype=torch.long)), config=MaCCalConfig(**FAST))
    with pytest.raises(TypeError, match="`loss`"):
        maccal_stage(_clone(trained_vit), digits_dataset(slice(0, 8)), MaCCalConfig(**FAST), loss=3)


# ----------------------------------------------------------------------------- persistence


@pytest.mark.parametrize("name", ["vit", "resnet", "timm"])
def test_save_and_load_give_identical_logits(name, tmp_path):
    x, y = digits(slice(0, 128))
    model = _train_briefly(make_model(name, seed=0), x, y, steps=10)
    maccal_stage(model, digits_dataset(slice(0, 128)), MaCCalConfig(**FAST))
    model.save_pretrained(tmp_path)
    loaded = load_maccal_model(tmp_path)
    assert type(loaded.get_submodule(HEAD_PATHS[name])) is MaskedBottleneckHead
    with torch.no_grad():
        assert torch.equal(model.eval()(pixel_values=x).logits, loaded(pixel_values=x).logits)


def test_loader_rejects_a_plain_checkpoint(tmp_path):
    make_model("vit", seed=0).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="maccal_head"):
        load_maccal_model(tmp_path)
    with pytest.raises(ValueError, match="`path`"):
        load_maccal_model(tmp_path / "missing")


def test_loaded_model_works_in_an_image_classification_pipeline(tmp_path):
    from PIL import Image
    from transformers import ViTImageProcessor, pipeline

    x, y = digits(slice(0, 128), num_channels=3)
    model = _train_briefly(make_model("vit", seed=0, num_channels=3), x, y, steps=10)
    maccal_stage(model, digits_dataset(slice(0, 128), num_channels=3), MaCCalConfig(**FAST))
    processor = ViTImageProcessor(size={"height": 8, "width": 8}, do_normalize=False)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)

    loaded = load_maccal_model(tmp_path)
    clf = pipeline("image-classification", model=loaded, image_processor=ViTImageProcessor.from_pretrained(tmp_path))
    image = Image.fromarray((x[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    top = clf(image, top_k=3)
    # by hand: processor output → frozen features → bottleneck → softmax
    pixels = processor(image, return_tensors="pt")["pixel_values"]
    f = head_input("vit", loaded, pixels)
    h = loaded.classifier
    with torch.no_grad():
        probs = torch.softmax(torch.relu(f @ h.fc1.weight.T + h.fc1.bias) @ h.fc2.weight.T + h.fc2.bias, -1)[0]
    best = torch.topk(probs, 3)
    assert [d["label"] for d in top] == [loaded.config.id2label[int(i)] for i in best.indices]
    np.testing.assert_allclose([d["score"] for d in top], best.values.numpy(), rtol=1e-5)


# ----------------------------------------------------------------------------- inside CalibrationTrainer


@pytest.mark.parametrize("loss_name", ["ce", "fedlas_ls"])
def test_calibration_trainer_runs_the_real_stage_and_logs_it(tmp_path, loss_name):
    from transformers import TrainingArguments

    from hf_calibration.losses import get_loss
    from hf_calibration.trainer import CalibrationTrainer

    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, max_steps=3, learning_rate=1e-2,
        report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    loss = get_loss(loss_name, num_classes=10) if loss_name.startswith("fedlas") else get_loss(loss_name)
    ds = digits_dataset(slice(0, 96))
    model = make_model("vit", seed=0)
    trainer = CalibrationTrainer(model=model, args=args, train_dataset=ds, eval_dataset=digits_dataset(slice(96, 128)),
                                 compute_loss_func=loss, maccal=MaCCalConfig(epochs=2, batch_size=32, progress=False))
    trainer.train()
    assert isinstance(trainer.model.classifier, MaskedBottleneckHead)
    # Trainer.log received one record per stage-2 epoch: that is what TensorBoard / W&B callbacks see
    records = [r for r in trainer.state.log_history if "maccal/retention" in r]
    assert [r["maccal/epoch"] for r in records] == [0.0, 1.0]
    assert all(0 < r["maccal/mean_confidence"] <= 1 for r in records)
    # the trained model still evaluates, saves and loads back with its bottleneck
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    trainer.save_model(str(tmp_path / "final"))
    loaded = load_maccal_model(tmp_path / "final")
    x = ds.pixel_values[:16]
    with torch.no_grad():
        assert torch.equal(trainer.model.eval()(pixel_values=x).logits, loaded(pixel_values=x).logits)


def test_rescaled_masks_multiply_kept_weights_by_one_over_rho():
    torch.manual_seed(0)
    head = MaskedBottleneckHead(6, 5, 3).train()
    m1, m2 = head.draw_masks(0.25, torch.Generator().manual_seed(2), rescale=True)
    x = torch.randn(4, 6)
    w1, b1, w2, b2 = (p.detach() for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias))
    expected = torch.relu(x @ (w1 * m1 * 4.0).T + b1) @ (w2 * m2 * 4.0).T + b2
    torch.testing.assert_close(head(x), expected)


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
@pytest.mark.parametrize("momentum, weight_decay, rescale, adaptive", [(0.9, 0.01, True, True), (0.0, 0.0, False, False)])
def test_fast_training_equals_autograd_with_reference_masked_sgd(loss_name, momentum, weight_decay, rescale, adaptive):
    import copy

    from hf_calibration.maccal import train_masked_head

    x_all, y_all = digits(slice(0, 150))
    x_all = x_all.flatten(1).double()
    x_all = (x_all - x_all.mean(0)) / (x_all.std(0) + 0.1)  # centred, like backbone features: ReLU units stay alive
    order = [torch.randperm(150, generator=torch.Generator().manual_seed(e)) for e in range(4)]
    epochs_batches = [[(x_all[o[s : s + 40]], y_all[o[s : s + 40]]) for s in range(0, 150, 40)] for o in order]  # 40, 40, 40, 30

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
    config = MaCCalConfig(epochs=4, lr=0.1, momentum=momentum, weight_decay=weight_decay, rho0=0.6, rho_min=0.5,
                          rescale=rescale, adaptive=adaptive, progress=False)
    snapshot = lambda record: snapshots.append([p.detach().clone() for p in (head.fc1.weight, head.fc2.weight)])  # noqa: E731
    history = train_masked_head(head, lambda epoch, g: iter(epochs_batches[epoch]), config, loss=loss, log_fn=snapshot)

    assert all(0 < m1.mean().item() < 1 for m1, _, _ in draws)  # real masks
    # (the FeDLaS gate's parameters are trained in both: if the fast path skipped them, its weights would drift)
    loss_params = [p for p in ref_loss.parameters()] if ref_loss is not None else []
    expected, epoch_losses = _reference_training(params0, loss_params, draws, epochs_batches, 0.1, momentum, weight_decay, ref_loss)
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
    from hf_calibration.maccal import train_masked_head

    x, y = digits(slice(0, 96))
    x = x.flatten(1)
    heads = []
    for autocast in (False, True):
        torch.manual_seed(0)
        head = MaskedBottleneckHead(64, 16, 10)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            train_masked_head(head, lambda e, g: iter([(x[:64], y[:64]), (x[64:], y[64:])]), MaCCalConfig(epochs=2, progress=False))
        heads.append(head)
    assert heads[1].fc1.weight.dtype == torch.float32
    for p, q in zip(heads[0].parameters(), heads[1].parameters()):
        assert torch.equal(p, q)


def test_flat_trainer_forward_and_gradients_equal_autograd_through_the_module():
    from hf_calibration.masked_head import FlatHeadTrainer

    torch.manual_seed(0)
    head = MaskedBottleneckHead(7, 6, 4).double().train()
    masks = head.draw_masks(0.5, torch.Generator().manual_seed(4), rescale=True)
    trainer = FlatHeadTrainer(head, lr=0.1)
    trainer.set_masks(masks, head.mask_scale)
    x, y = torch.randn(9, 7, dtype=torch.float64), torch.randint(0, 4, (9,))
    with torch.no_grad():
        logits, saved = trainer.forward(x)
    out = head(x)  # autograd through W ⊙ M / ρ
    torch.testing.assert_close(logits, out.detach(), rtol=0, atol=1e-12)
    loss = F.cross_entropy(out, y)
    expected = torch.autograd.grad(loss, [head.fc1.weight, head.fc2.weight, head.fc1.bias, head.fc2.bias])
    # ∂(mean CE)/∂logits = (softmax − onehot) / n, passed as its numerator with grad_scale = 1/n
    numerator = torch.softmax(logits, 1) - F.one_hot(y, 4).double()
    with torch.no_grad():
        grad = trainer.backward(saved, numerator, grad_scale=1 / 9)
    for got, want in zip(trainer.grad_views, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert torch.all(grad[: masks[0].numel()][masks[0].flatten() == 0] == 0)


def test_flat_trainer_rejects_bad_arguments():
    from hf_calibration.masked_head import FlatHeadTrainer

    head = MaskedBottleneckHead(4, 3, 2)
    with pytest.raises(TypeError, match="`head`"):
        FlatHeadTrainer(torch.nn.Linear(4, 2), lr=0.1)
    with pytest.raises(ValueError, match="`lr`"):
        FlatHeadTrainer(head, lr=0.0)
    with pytest.raises(ValueError, match="`momentum`"):
        FlatHeadTrainer(head, lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="`weight_decay`"):
        FlatHeadTrainer(head, lr=0.1, weight_decay=-0.1)


def test_stage_loss_is_a_copy_with_local_statistics():
    from hf_calibration.losses import FeDLaSLoss
    from hf_calibration.maccal import _resolve_loss

    loss = FeDLaSLoss(10)
    staged = _resolve_loss(loss, 10)
    assert staged is not loss and staged.sync_statistics is False  # every process sees the whole stage-2 data
    assert loss.sync_statistics is True  # the trainer's own loss keeps summing across processes
    assert torch.equal(staged.gate.fc_in.weight, loss.gate.fc_in.weight)
