"""MaC-Cal stage 2: feature-cache speed-up and fixed vs adaptive retention, on a model trained here.

Two measurements, one run:

1. Stage-2 wall time with the feature cache (one backbone pass, then head epochs on the cache) vs
   re-running the frozen backbone every epoch (``MaCCalConfig(cache_features=False)``), same epochs.
2. Calibration on the test split of a model trained here (stage 1), then stage 2 with a fixed
   retention ρ = ρ₀ and with the adaptive rule, 3 seeds: ECE / AdaECE / MCE (15 bins) / accuracy.

Data: ``--data digits`` (CPU, default: a small transformers ResNet on scikit-learn's digits) or
``--data cifar10 --npz <cifar10_jpeg.npz>`` (GPU: a CIFAR-style ResNet-18 from timm, wrapped by
transformers' ``TimmWrapperForImageClassification``, trained from scratch in bf16). On a CPU, the
CIFAR-10 run takes random subsets (``--train-subset`` / ``--test-subset``) and few stage-1 epochs:
the backbone then dominates both timings, whose ratio does not depend on the subset's size (both
the backbone pass and a head epoch scale with it); its calibration table is only a smoke test.

    python benchmarks/maccal.py                                   # digits, CPU, ~15 s
    python benchmarks/maccal.py --data cifar10 --npz .data/cifar10_jpeg.npz --stage1-epochs 15
    python benchmarks/maccal.py --data cifar10 --npz .data/cifar10_jpeg.npz --train-subset 256 --test-subset 1000 --stage1-epochs 2   # CPU, ~5 min

Writes benchmarks/results/maccal.md (or ``--out``) and prints it. ``--save`` DIR also writes the
features and test logits (npz) so the tables can be recomputed without the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import TensorDictDataset  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from hf_calibration._core.features import find_classifier_head  # noqa: E402
from hf_calibration.maccal import MaCCalConfig, maccal_stage  # noqa: E402
from hf_calibration.maccal.stage import cache_features  # noqa: E402
from hf_calibration.metrics import adaece, ece, mce  # noqa: E402

N_BINS = 15
FEATURE_BATCH = 512  # backbone batch of the one cached pass (MaCCalConfig.feature_batch_size)


# ----------------------------------------------------------------------------- metrics


def calibration_row(logits: torch.Tensor | np.ndarray, labels) -> dict[str, float]:
    logits = torch.as_tensor(logits).float().cpu().numpy()
    labels = torch.as_tensor(labels).cpu().numpy()
    e, a, m = (
        ece(logits, labels, n_bins=N_BINS),
        adaece(logits, labels, n_bins=N_BINS),
        mce(logits, labels, n_bins=N_BINS),
    )
    return {
        "acc": float((logits.argmax(1) == labels).mean()) * 100,
        "ece": float(e) * 100,
        "adaece": float(a) * 100,
        "mce": float(m) * 100,
    }


# ----------------------------------------------------------------------------- data + stage 1


def _decode(args):
    blob, offsets, idx = args
    from PIL import Image

    return np.stack(
        [np.asarray(Image.open(io.BytesIO(bytes(blob[offsets[i] : offsets[i + 1]]))).convert("RGB")) for i in idx]
    )


def load_cifar10(npz: str, train_subset: int | None = None, test_subset: int | None = None, seed: int = 0):
    """Decode the JPEGs of both splits (or of a seeded random subset of each): uint8 (N, 3, 32, 32), labels."""
    from multiprocessing import Pool

    data = np.load(npz)
    blob, offsets, labels, split = data["blob"], data["offsets"], data["labels"], data["split"]
    rng = np.random.default_rng(seed)
    parts = []
    for which, size in ((0, train_subset), (1, test_subset)):
        idx = np.flatnonzero(split == which)
        parts.append(idx if size is None or size >= len(idx) else np.sort(rng.choice(idx, size, replace=False)))
    chunks = [c for c in np.array_split(np.concatenate(parts), 64) if len(c)]
    with Pool(min(16, os.cpu_count() or 1)) as pool:
        images = np.concatenate(pool.map(_decode, [(blob, offsets, c) for c in chunks]))
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(labels[np.concatenate(parts)].astype(np.int64))
    n = len(parts[0])
    return (x[:n], y[:n]), (x[n:], y[n:])


def cifar_model():
    from transformers import TimmWrapperConfig, TimmWrapperForImageClassification

    model = TimmWrapperForImageClassification(TimmWrapperConfig(architecture="resnet18", num_labels=10))
    tm = model.timm_model  # CIFAR stem: 3x3 conv stride 1, no max-pool
    tm.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    tm.maxpool = nn.Identity()
    return model


def digits_model(seed: int):
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    config = ResNetConfig(
        num_channels=1, embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="basic", num_labels=10
    )
    return ResNetForImageClassification(config)


def train_stage1(model, x, y, *, epochs, batch_size, lr, device, augment, normalize, bf16, seed):
    """Plain cross-entropy training (SGD, momentum 0.9, nesterov, wd 5e-4, one-cycle lr)."""
    g = torch.Generator().manual_seed(seed)
    model.to(device).train()
    steps = epochs * ((len(y) + batch_size - 1) // batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25)
    for epoch in range(epochs):
        perm = torch.randperm(len(y), generator=g).to(device)
        t = time.perf_counter()
        for start in range(0, len(y), batch_size):
            idx = perm[start : start + batch_size]
            xb = normalize(x[idx])
            if augment:
                xb = augment(xb)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.cross_entropy(model(pixel_values=xb).logits.float(), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        print(f"  stage 1 epoch {epoch}: loss {loss.item():.3f} ({time.perf_counter() - t:.1f} s)", flush=True)
    return model.eval()


def crop_flip(xb: torch.Tensor) -> torch.Tensor:
    n = xb.shape[0]
    padded = nn.functional.pad(xb, (4, 4, 4, 4), mode="reflect")
    i, j = torch.randint(0, 9, (2,))
    out = padded[:, :, i : i + 32, j : j + 32]
    flip = torch.rand(n, device=xb.device) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(3), out)


# ----------------------------------------------------------------------------- stage 2


class HeadOnly(nn.Module):
    """Stand-in classifier over cached features: only its head (``fc``) is replaced by stage 2."""

    def __init__(self, d, k):
        super().__init__()
        self.fc = nn.Linear(d, k)

    def forward(self, x):
        return self.fc(x)


def run_stage2(train_f, train_y, test_f, config: MaCCalConfig):
    model = HeadOnly(train_f.shape[1], int(train_y.max()) + 1).to(train_f.device)
    result = maccal_stage(model, features=(train_f, train_y), config=config)
    with torch.no_grad():
        logits = model(test_f.float())
    return logits, result


def compare(train_f, train_y, test_f, test_y, base_logits, seeds, base_config: MaCCalConfig, variants: dict[str, dict]):
    rows = {"before stage 2": [calibration_row(base_logits, test_y)]}
    histories = {}
    for name, overrides in variants.items():
        rows[name] = []
        for seed in seeds:
            cfg = dataclasses.replace(base_config, seed=seed, **overrides)
            logits, result = run_stage2(train_f, train_y, test_f, cfg)
            rows[name].append(calibration_row(logits, test_y))
            histories.setdefault(name, result.retention)
            print(f"  {name} seed {seed}: {rows[name][-1]}  rho_end={result.retention[-1]:.3f}", flush=True)
    return rows, histories


@contextlib.contextmanager
def opposite_direction():
    """Ablation only: flip the sign of the adaptive step (over-confident → ρ up)."""
    from hf_calibration.maccal import stage

    original = stage.update_retention

    def flipped(rho, accuracy, confidence, epoch, config):
        return original(rho, confidence, accuracy, epoch, dataclasses.replace(config, kappa=1.0 / config.kappa))

    stage.update_retention = flipped
    try:
        yield
    finally:
        stage.update_retention = original


def table(rows: dict[str, list[dict]]) -> str:
    out = ["| stage | seeds | accuracy % | ECE % | AdaECE % | MCE % |", "|---|---|---|---|---|---|"]
    for name, rs in rows.items():
        cells = []
        for key in ("acc", "ece", "adaece", "mce"):
            v = np.array([r[key] for r in rs])
            cells.append(f"{v.mean():.2f}" + (f" ± {v.std(ddof=1):.2f}" if len(v) > 1 else ""))
        out.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", choices=["digits", "cifar10"], default="digits")
    p.add_argument("--npz", help="cifar10_jpeg.npz (for --data cifar10)")
    p.add_argument("--stage1-epochs", type=int, default=None)
    p.add_argument("--epochs", type=int, default=40, help="stage-2 epochs for the quality comparison")
    p.add_argument("--timing-epochs", type=int, default=None, help="stage-2 epochs for the speed comparison")
    p.add_argument(
        "--timing-repeats",
        type=int,
        default=None,
        help="timed runs of each variant, best kept (default: 3 on digits, 1 on cifar10)",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--train-subset", type=int, default=None, help="cifar10: random training subset (CPU runs)")
    p.add_argument("--test-subset", type=int, default=None, help="cifar10: random test subset (CPU runs)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "maccal.md"))
    p.add_argument("--save", default=None, help="folder for features / logits npz")
    p.add_argument("--explore", action="store_true", help="also run the one-seed ablations that chose the rule")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(
            1
        )  # tiny ops: extra threads only add contention (measured 40x slower head steps on a loaded box)
    torch.manual_seed(0)
    t_all = time.perf_counter()
    if args.data == "cifar10":
        if not args.npz:
            p.error("--data cifar10 needs --npz")
        (xtr, ytr), (xte, yte) = load_cifar10(args.npz, args.train_subset, args.test_subset)
        mean = torch.tensor([0.4914, 0.4822, 0.4465], device=device)[:, None, None]
        std = torch.tensor([0.2470, 0.2435, 0.2616], device=device)[:, None, None]

        def normalize(xb):
            return (xb.float() / 255 - mean) / std

        model = cifar_model().to(device, memory_format=torch.channels_last)
        xtr, ytr, xte, yte = xtr.to(device), ytr.to(device), xte.to(device), yte.to(device)
        batch = 512 if len(ytr) >= 8192 else 64  # small CPU subsets: enough steps for the one-cycle schedule
        stage1 = dict(
            epochs=args.stage1_epochs or 40, batch_size=batch, lr=0.2, augment=crop_flip, bf16=device.type == "cuda"
        )
        timing_epochs = args.timing_epochs or 40
        subset = " (random subsets)" if args.train_subset or args.test_subset else " JPEG re-encoded"
        precision = "bf16" if stage1["bf16"] else "fp32"
        what = (
            f"CIFAR-10 ({len(ytr):,} train / {len(yte):,} test{subset}), timm resnet18 with CIFAR stem "
            f"(TimmWrapperForImageClassification), {stage1['epochs']} epochs {precision}, batch {batch}"
        )
    else:
        if args.train_subset or args.test_subset:
            p.error("--train-subset / --test-subset are for --data cifar10")
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None]
        y = torch.tensor(d.target, dtype=torch.int64)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        tr, te = perm[:1200], perm[1200:]
        xtr, ytr, xte, yte = x[tr], y[tr], x[te], y[te]

        def normalize(xb):
            return xb

        model = digits_model(0)
        stage1 = dict(epochs=args.stage1_epochs or 20, batch_size=64, lr=0.05, augment=None, bf16=False)
        timing_epochs = args.timing_epochs or 40
        what = f"digits (1,200 train / 597 test), transformers ResNet (16-32-64, 2 basic stages), {stage1['epochs']} epochs fp32"

    repeats = args.timing_repeats or (3 if args.data == "digits" else 1)
    print(f"stage 1: {what}", flush=True)
    t = time.perf_counter()
    model = train_stage1(model, xtr, ytr, device=device, normalize=normalize, seed=0, **stage1)
    stage1_s = time.perf_counter() - t
    train_ds = TensorDictDataset(normalize(xtr), ytr)
    test_ds = TensorDictDataset(normalize(xte), yte)

    # --- 1. speed: cache vs re-running the frozen backbone, same epochs
    # warm-up outside the clock: torch.optim's first optimizer imports torch._dynamo (seconds), and the
    # first head and backbone kernels initialise their libraries (oneDNN / cuDNN pick and cache kernels per
    # shape); whichever variant ran first would pay for both. One cached 1-epoch stage does all of it.
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        maccal_stage(
            copy.deepcopy(model), train_ds, MaCCalConfig(epochs=1, progress=False, feature_batch_size=FEATURE_BATCH)
        )
    timing = {True: [], False: []}
    for _ in range(repeats):  # alternating, best of each: the shared machine's load moves between runs
        for cached in (True, False):
            m = copy.deepcopy(model)
            cfg = MaCCalConfig(
                epochs=timing_epochs, cache_features=cached, progress=False, feature_batch_size=FEATURE_BATCH
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                maccal_stage(m, train_ds, cfg)
            if device.type == "cuda":
                torch.cuda.synchronize()
            timing[cached].append(time.perf_counter() - t)
            print(f"  timing cache={cached}: {timing[cached][-1]:.2f} s", flush=True)
    timing = {k: min(v) for k, v in timing.items()}

    # --- 2. quality: fixed vs adaptive retention on the cached features, 3 seeds
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        train_f, train_y = cache_features(model, train_ds, batch_size=512, progress=False)
        test_f, test_y = cache_features(model, test_ds, batch_size=512, progress=False)
        with torch.no_grad():  # the model's own logits: its Linear head on the features it receives (no second pass)
            base_logits = find_classifier_head(model)[2](test_f).float()
    base = MaCCalConfig(epochs=args.epochs, progress=False)
    variants = {
        f"stage 2, fixed ρ = {base.rho0}": {"adaptive": False},
        "stage 2, adaptive ρ (default)": {},
    }
    rows, histories = compare(train_f, train_y, test_f, test_y, base_logits, list(range(args.seeds)), base, variants)
    if args.explore:  # the measurements that chose the rule's direction and defaults
        with opposite_direction():
            opp, hist3 = compare(
                train_f,
                train_y,
                test_f,
                test_y,
                base_logits,
                list(range(args.seeds)),
                base,
                {"ablation: adaptive, opposite direction": {}},
            )
        explore = {
            "ablation: no mask (ρ = 1)": {"adaptive": False, "rho0": 1.0},
            f"ablation: fixed ρ = {base.rho0}, no 1/ρ rescale": {"adaptive": False, "rescale": False},
            "ablation: fixed ρ = 0.7": {"adaptive": False, "rho0": 0.7},
        }
        more, hist2 = compare(train_f, train_y, test_f, test_y, base_logits, [0], base, explore)
        more.pop("before stage 2"), opp.pop("before stage 2")
        rows.update(opp), rows.update(more), histories.update(hist3), histories.update(hist2)
    if args.save:
        out = Path(args.save)
        out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            out / "test.npz",
            features=test_f.half().cpu().numpy(),
            labels=test_y.cpu().numpy(),
            logits=base_logits.cpu().numpy(),
        )
        for i, chunk in enumerate(torch.chunk(torch.arange(len(train_y)), 4)):
            np.savez_compressed(
                out / f"train{i}.npz",
                features=train_f[chunk.to(train_f.device)].half().cpu().numpy(),
                labels=train_y[chunk.to(train_y.device)].cpu().numpy(),
            )

    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores" + (
        f", {torch.cuda.get_device_name()}" if device.type == "cuda" else ", 1 torch thread"
    )
    cmd = "python benchmarks/maccal.py " + " ".join(argv if argv is not None else sys.argv[1:])
    defaults = MaCCalConfig()
    label = args.data + (", CPU" if args.data != "digits" and device.type == "cpu" else "")  # its own section
    md = (
        [
            f"## MaC-Cal second stage ({label})",
            "",
            f"Machine: {machine}; torch {torch.__version__}. Command: `{cmd}`. Total {time.perf_counter() - t_all:.0f} s (stage 1: {stage1_s:.0f} s).",
            f"Model: {what}.",
            "",
            f"### Stage-2 wall time, {timing_epochs} head epochs, {len(ytr)} training images"
            + (f" (best of {repeats} alternating runs)" if repeats > 1 else ""),
            "",
            "| stage 2 | seconds | ratio |",
            "|---|---|---|",
            f"| re-run frozen backbone every epoch | {timing[False]:.2f} | 1.00 |",
            f"| feature cache (one backbone pass) | {timing[True]:.2f} | {timing[False] / timing[True]:.1f}x faster |",
            "",
            f"Backbone batch size: {FEATURE_BATCH} for the cached variant's one pass (`feature_batch_size`), {MaCCalConfig().batch_size} "
            "(the stage-2 batch size) when the backbone re-runs every epoch.",
            "",
            f"### Test calibration ({N_BINS} bins, percent, mean ± std over {args.seeds} stage-2 seeds; one stage-1 model)",
            "",
            f"Stage 2: {args.epochs} epochs, SGD lr {defaults.lr}, momentum {defaults.momentum}, wd {defaults.weight_decay}, batch {defaults.batch_size}, "
            f"bottleneck h = max(d/2, 2K), rescale 1/ρ = {defaults.rescale}, ρ ∈ [{defaults.rho_min}, {defaults.rho_max}], ρ₀ = {defaults.rho0}, κ = {defaults.kappa}, step {defaults.step}, τ₀ = {defaults.clip_bound}, γ = {defaults.clip_decay}.",
            "",
            table(rows),
            "",
        ]
        + (
            [
                f"Random subsets and {stage1['epochs']} stage-1 epochs: the timing above is the point of this run; the table only "
                "shows that the comparison runs (the stage-1 model is barely trained).",
                "",
            ]
            if args.train_subset or args.test_subset
            else []
        )
        + [
            "Adaptive ρ per epoch (seed 0): "
            + ", ".join(f"{r:.3f}" for r in histories["stage 2, adaptive ρ (default)"]),
            "",
        ]
        + [f"- {name}: ρ {h[0]:.3f} → {h[-1]:.3f}" for name, h in histories.items()]
        + [
            "",
        ]
    )
    text = "\n".join(md)
    print(text)
    write_section(Path(args.out), md[0], text)
    return rows


def write_section(path: Path, title: str, text: str) -> None:
    """Replace this run's ``## ...`` section of ``path`` (keeping the preamble and the other data sets' sections)."""
    old = path.read_text() if path.exists() else "# MaC-Cal second stage (benchmarks/maccal.py)\n\n"
    preamble, *sections = re.split(r"(?m)^(?=## )", old)
    sections = [sec for sec in sections if not sec.startswith(title)] + [text.rstrip() + "\n\n"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(preamble + "".join(sorted(sections)))


if __name__ == "__main__":
    main()
