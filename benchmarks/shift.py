"""Calibration under shift on CIFAR-10: does a calibrator fitted on clean data keep its advantage?

Steps (each caches its output under ``--cache``, default ``.data/shift``, git-ignored):

1. ``prepare``: decode the shared CIFAR-10 JPEGs (``cifar10_jpeg.npz``) once; 45,000 training images are
   split 40,000 train / 5,000 validation (calibration), seeded; the 10,000 test images are kept.
2. ``train --loss ce|fedlas_ls``: an airbench-style ResNet (Jordan 2024, "94% on CIFAR-10 in 3.29 seconds"):
   a frozen 2×2 patch-whitening stem, three conv-pool-BN-GELU blocks (widths 32/128/128, half of airbench94's), SGD with
   Nesterov momentum, a one-cycle (linear warm-up, linear decay) learning rate, random flips and 2-px
   translations, channels_last, 10 epochs, float32 on the CPU. Cross-entropy without label smoothing, or
   ``hf_calibration.FeDLaSLoss`` (FeDLaS-LS, paper defaults α = 0.05, β = 4, θ = 0.95) called directly in this
   loop with the pooled feature the classifier sees, its gate trained by the same optimizer.
3. ``evaluate``: logits on the clean validation and test sets, on ``--n-corrupt`` test images under each of the
   15 Hendrycks & Dietterich corruptions at severities 1-5 (``hf_calibration.shift``, CIFAR-10-C
   parameters), and on OOD sets (upscaled scikit-learn digits, Gaussian-noise images); then
   ``hf_calibration.shift.shift_report`` with TS and SMART (and any other calibrator registered) fitted on
   the clean validation logits; writes ``benchmarks/results/shift.md``.

    python benchmarks/shift.py prepare --npz ../shared/data/cifar10_jpeg.npz
    nice -n 10 python benchmarks/shift.py train --loss ce
    nice -n 10 python benchmarks/shift.py train --loss fedlas_ls
    nice -n 10 python benchmarks/shift.py evaluate
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


# ----------------------------------------------------------------------------- data


def _decode(args):
    from PIL import Image

    blob, offsets, idx = args
    return np.stack(
        [np.asarray(Image.open(io.BytesIO(bytes(blob[offsets[i] : offsets[i + 1]]))).convert("RGB")) for i in idx]
    )


def prepare(npz: str, cache: Path, seed: int = 0, n_val: int = 5000) -> None:
    from multiprocessing import Pool

    if not Path(npz).is_file():
        raise SystemExit(
            f"no CIFAR-10 file at {npz}: pass --npz (an npz with blob / offsets / labels / split, as described in this script)"
        )
    data = np.load(npz)
    blob, offsets, labels, split = data["blob"], data["offsets"], data["labels"], data["split"]
    chunks = np.array_split(np.arange(len(labels)), 32)
    with Pool(2) as pool:
        images = np.concatenate(pool.map(_decode, [(blob, offsets, c) for c in chunks]))
    train = np.flatnonzero(split == 0)
    rng = np.random.default_rng(seed)
    val = np.sort(rng.choice(train, n_val, replace=False))
    train = np.setdiff1d(train, val)
    test = np.flatnonzero(split == 1)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(
        cache / "cifar10_u8.npz",
        x_train=images[train], y_train=labels[train], x_val=images[val], y_val=labels[val],
        x_test=images[test], y_test=labels[test],
    )  # fmt: skip
    print(f"train {len(train)}, val {len(val)}, test {len(test)} -> {cache / 'cifar10_u8.npz'}")


def load_split(cache: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    data = np.load(cache / "cifar10_u8.npz")
    return data[f"x_{name}"], data[f"y_{name}"].astype(np.int64)


def to_tensor(images_u8: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, 3) → normalised float (N, 3, H, W), channels_last."""
    x = torch.from_numpy(np.ascontiguousarray(images_u8)).permute(0, 3, 1, 2).float().div_(255)
    return ((x - MEAN) / STD).contiguous(memory_format=torch.channels_last)


# ----------------------------------------------------------------------------- model


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(c_out), nn.GELU(),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.GELU(),
    )  # fmt: skip


class AirNet(nn.Module):
    """airbench94's layout: whitening stem, three blocks, global max-pool, linear head (``self.head``)."""

    def __init__(self, widths=(64, 256, 256), num_classes: int = 10):
        super().__init__()
        self.whiten = nn.Conv2d(3, 24, 2, bias=True)
        self.body = nn.Sequential(
            nn.GELU(), _block(24, widths[0]), _block(widths[0], widths[1]), _block(widths[1], widths[2])
        )
        self.pool = nn.Sequential(nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.head = nn.Linear(widths[2], num_classes, bias=False)

    def init_whitening(self, x: torch.Tensor, eps: float = 5e-4) -> None:
        """Stem weights = ± eigenvectors of the 2×2 patch covariance scaled by 1/sqrt(eigenvalue); frozen."""
        patches = x.unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 12).double()
        patches = patches - patches.mean(0)
        eigval, eigvec = torch.linalg.eigh(patches.T @ patches / len(patches))
        w = (eigvec.T / torch.sqrt(eigval + eps)[:, None]).reshape(12, 3, 2, 2).float()
        self.whiten.weight.data = torch.cat([w, -w])
        self.whiten.weight.requires_grad_(False)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.body(self.whiten(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random horizontal flip and a random translation of up to 2 px (reflect padding), per image."""
    n = x.shape[0]
    flip = torch.rand(n, generator=g) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    dx, dy = torch.randint(0, 5, (2, n), generator=g)
    out = torch.empty_like(x)
    for sx in range(5):  # 25 (dx, dy) groups: slicing, no per-image Python loop
        for sy in range(5):
            sel = (dx == sx) & (dy == sy)
            if sel.any():
                out[sel] = padded[sel, :, sy : sy + 32, sx : sx + 32]
    return out.contiguous(memory_format=torch.channels_last)


def train(
    cache: Path, loss_name: str, epochs: int, batch_size: int, lr: float, seed: int, widths: tuple[int, int, int]
) -> None:
    from hf_calibration import FeDLaSLoss

    torch.manual_seed(seed)
    x_u8, y_np = load_split(cache, "train")
    x, y = to_tensor(x_u8), torch.from_numpy(y_np)
    model = AirNet(widths).to(memory_format=torch.channels_last)
    model.init_whitening(x[:5000])
    loss_fn = FeDLaSLoss(num_classes=10, variant="ls") if loss_name == "fedlas_ls" else None
    params = [p for p in model.parameters() if p.requires_grad] + (list(loss_fn.parameters()) if loss_fn else [])
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps_per_epoch = len(y) // batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.2, anneal_strategy="linear",
        div_factor=10.0, final_div_factor=100.0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    x_val_u8, y_val = load_split(cache, "val")
    log = []
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        if loss_fn is not None:
            loss_fn.train()
        t = time.perf_counter()
        perm = torch.randperm(len(y), generator=g)
        for step in range(steps_per_epoch):
            idx = perm[step * batch_size : (step + 1) * batch_size]
            xb, yb = augment(x[idx], g), y[idx]
            feats = model.features(xb)
            logits = model.head(feats)
            loss = F.cross_entropy(logits, yb) if loss_fn is None else loss_fn(logits, yb, features=feats)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        val_acc = float((predict(model, x_val_u8).argmax(1) == y_val).mean())
        log.append({"epoch": epoch + 1, "seconds": time.perf_counter() - t, "loss": loss.item(), "val_acc": val_acc})
        print(f"[{loss_name}] epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}, val acc {val_acc:.4f} "
              f"({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
    total = time.perf_counter() - start
    path = model_path(cache, loss_name, seed)
    torch.save({"model": model.state_dict(), "log": log, "seconds": total, "epochs": epochs, "widths": widths,
                "seed": seed}, path)  # fmt: skip
    print(f"[{loss_name}] trained in {total / 60:.1f} min -> {path}")


@torch.no_grad()
def predict(model: nn.Module, images_u8: np.ndarray, batch_size: int = 1000) -> np.ndarray:
    model.eval()
    out = [model(to_tensor(images_u8[i : i + batch_size])) for i in range(0, len(images_u8), batch_size)]
    return torch.cat(out).double().numpy()


def model_path(cache: Path, loss_name: str, seed: int) -> Path:
    """Seed 0's model keeps the name of the first runs; other training seeds carry theirs."""
    return cache / (f"model_{loss_name}.pt" if seed == 0 else f"model_{loss_name}_seed{seed}.pt")


def load_model(cache: Path, loss_name: str, seed: int = 0) -> tuple[nn.Module, dict]:
    ckpt = torch.load(model_path(cache, loss_name, seed), weights_only=False)
    model = AirNet(ckpt["widths"])
    model.whiten.weight.requires_grad_(False)
    model.load_state_dict(ckpt["model"])
    return model.to(memory_format=torch.channels_last).eval(), ckpt


# ----------------------------------------------------------------------------- evaluation


def corrupted_test_set(
    cache: Path, n: int, seed: int
) -> tuple[dict[tuple[str, int], np.ndarray], np.ndarray, np.ndarray]:
    """``n`` seeded test images under each benchmark corruption × severity (cached), image i seeded with i."""
    from tqdm import tqdm

    from hf_calibration.shift import BENCHMARK_CORRUPTIONS, corrupt

    x, y = load_split(cache, "test")
    idx = np.sort(np.random.default_rng(seed).choice(len(y), n, replace=False))
    x, y = x[idx], y[idx]
    path = cache / f"cifar10_c_{n}_{seed}.npz"
    if path.exists():
        data = np.load(path)
        return {(c, s): data[f"{c}_{s}"] for c in BENCHMARK_CORRUPTIONS for s in range(1, 6)}, x, y
    out, t = {}, time.perf_counter()
    for c in tqdm(BENCHMARK_CORRUPTIONS, desc="corrupting"):
        for s in range(1, 6):
            out[(c, s)] = np.stack(
                [np.asarray(corrupt(img, c, s, seed=int(i), preset="cifar")) for img, i in zip(x, idx)]
            )
    np.savez(path, **{f"{c}_{s}": v for (c, s), v in out.items()})
    print(f"corrupted {n} images x 75 in {time.perf_counter() - t:.0f} s -> {path}")
    return out, x, y


def ood_images(n: int, seed: int) -> dict[str, np.ndarray]:
    """OOD sets at hand: scikit-learn's digits upscaled 8 → 32 px (white on black, grey → RGB), and
    Gaussian-noise images N(0.5, 0.25²) per pixel, clipped to [0, 1]."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits().images[:n]  # (n, 8, 8) in 0..16
    up = np.stack(
        [np.asarray(Image.fromarray(np.uint8(d * 255 / 16)).resize((32, 32), Image.BILINEAR)) for d in digits]
    )
    rng = np.random.default_rng(seed)
    noise = np.uint8(np.clip(rng.normal(0.5, 0.25, (n, 32, 32, 3)), 0, 1) * 255)
    return {"digits": np.repeat(up[..., None], 3, axis=-1), "gaussian_noise": noise}


def evaluate(cache: Path, losses: list[str], n_corrupt: int, seed: int, out: Path) -> None:
    from hf_calibration.calibrators import list_calibrators
    from hf_calibration.shift import shift_report

    shifted_x, _, y_sub = corrupted_test_set(cache, n_corrupt, seed)
    x_val, y_val = load_split(cache, "val")
    x_test, y_test = load_split(cache, "test")
    ood = ood_images(1797, seed)
    calibrators = ["ts", "smart"] + [k for k in list_calibrators() if k not in ("temperature_scaling", "smart")]
    results = {}
    for loss in losses:
        model, ckpt = load_model(cache, loss)
        logits_path = cache / f"logits_{loss}_{n_corrupt}_{seed}.npz"
        if logits_path.exists():
            z = dict(np.load(logits_path))
        else:
            t = time.perf_counter()
            z = {
                "val": predict(model, x_val),
                "test": predict(model, x_test),
                **{f"ood_{k}": predict(model, v) for k, v in ood.items()},
            }
            z.update({f"{c}_{s}": predict(model, v) for (c, s), v in shifted_x.items()})
            np.savez(logits_path, **z)
            print(f"[{loss}] logits in {time.perf_counter() - t:.0f} s -> {logits_path}")
        t = time.perf_counter()
        report = shift_report(
            (z["val"], y_val), (z["test"], y_test), {key: (z[f"{key[0]}_{key[1]}"], y_sub) for key in shifted_x},
            calibrators=calibrators, ood_logits={k: z[f"ood_{k}"] for k in ood}, ood_scores=("msp", "energy"),
        )  # fmt: skip
        print(f"[{loss}] shift_report in {time.perf_counter() - t:.0f} s")
        print(report)
        report.to_json(str(cache / f"report_{loss}.json"))
        report.plot("ece").savefig(cache / f"ece_vs_severity_{loss}.png", dpi=120)
        from hf_calibration.calibrators import TemperatureScaling

        ckpt["temperature"] = float(
            TemperatureScaling().fit(z["val"], y_val, progress_bar=False).temperature(z["val"][:1])[0]
        )
        results[loss] = (report, ckpt)
    out.write_text(markdown(results, n_corrupt, calibrators))
    print(out.read_text())


def markdown(results: dict, n_corrupt: int, calibrators: list[str]) -> str:
    lines = [
        "## `shift.py`: calibration under corruption and OOD inputs (CIFAR-10)",
        "",
        f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores shared with other engineers' jobs (loaded: "
        "timings are indicative only), torch "
        f"{torch.__version__}. Commands: `python benchmarks/shift.py prepare`, `nice -n 10 python benchmarks/shift.py train "
        "--loss ce` (and `--loss fedlas_ls`), `nice -n 10 python benchmarks/shift.py evaluate`.",
        "",
        "Data: the shared CIFAR-10 JPEG re-encoding; 40,000 training images, 5,000 held out (seeded) as the clean "
        f"calibration set, the 10,000 test images as the clean test set, and {n_corrupt:,} seeded test images under each "
        "of the 15 benchmark corruptions at severities 1-5 (`hf_calibration.shift.corrupt`, CIFAR-10-C parameters, "
        "image i seeded with its index). Calibrators (" + ", ".join(calibrators) + ") are fitted once, on the clean "
        "calibration logits, and applied unchanged to every shifted set"
        + ("" if "ets" in calibrators else " (ensemble temperature scaling, ETS, was not registered when this ran)")
        + ". ECE: 15 equal-width bins. OOD sets: scikit-learn's 1,797 digits upscaled to 32 px, and 1,797 "
        "Gaussian-noise images.",
        "",
    ]
    for loss, (report, ckpt) in results.items():
        log = ckpt["log"]
        name = {"ce": "cross-entropy", "fedlas_ls": "FeDLaS-LS (α = 0.05, β = 4, θ = 0.95)"}[loss]
        clean = {r["method"]: r for r in report.rows if r["corruption"] == "clean"}
        lines += [
            f"### {name}",
            "",
            f"airbench-style ResNet (widths {'/'.join(map(str, ckpt['widths']))}), {ckpt['epochs']} epochs in {ckpt['seconds'] / 60:.1f} min on this CPU "
            f"(epochs took {min(e['seconds'] for e in log):.0f}-{max(e['seconds'] for e in log):.0f} s under load); "
            f"clean test accuracy {100 * clean['uncalibrated']['accuracy']:.2f} %. Temperature scaling's T on the clean "
            f"calibration set: {ckpt['temperature']:.3f} ({'softens' if ckpt['temperature'] > 1 else 'sharpens'} the model's "
            "confidences).",
            "",
            "ECE (%) by severity, mean over the 15 corruptions (severity 0 = clean test set); accuracy in the last row:",
            "",
            "| method | " + " | ".join(str(s) for s in report.severities) + " |",
            "|---|" + "---|" * len(report.severities),
        ]
        ece_means = report.severity_means("ece")
        for method, values in ece_means.items():
            lines.append(f"| {method} | " + " | ".join(f"{100 * v:.2f}" for v in values) + " |")
        acc = report.severity_means("accuracy")["uncalibrated"]
        lines.append("| accuracy | " + " | ".join(f"{100 * v:.2f}" for v in acc) + " |")
        lines += ["", "AdaECE / smCE / NLL at severity 0 (clean) and 5, mean over corruptions:", ""]
        lines += ["| method | AdaECE 0 | AdaECE 5 | smCE 0 | smCE 5 | NLL 0 | NLL 5 |", "|---|---|---|---|---|---|---|"]
        for method in report.methods:
            cells = []
            for metric in ("adaece", "smce", "nll"):
                v = report.severity_means(metric)[method]
                cells += (
                    [f"{100 * v[0]:.2f}", f"{100 * v[-1]:.2f}"] if metric != "nll" else [f"{v[0]:.3f}", f"{v[-1]:.3f}"]
                )
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines += [
            "",
            'OOD detection against the clean test set (in-distribution positive), AUROC / FPR95 (%); "-": energy is not '
            "scored for calibrators that do not keep each row's logit level (only a temperature does: the others "
            "return log-probabilities or map z - max z / log p, see `shift_report`):",
            "",
        ]
        sets = sorted({o["ood"] for o in report.ood})
        lines += [
            "| method | " + " | ".join(f"{s} {sc}" for s in sets for sc in ("MSP", "energy")) + " |",
            "|---|" + "---|" * (2 * len(sets)),
        ]
        for method in report.methods:
            cells = []
            for s in sets:
                for sc in ("msp", "energy"):
                    o = next(o for o in report.ood if o["method"] == method and o["ood"] == s and o["score"] == sc)
                    cells.append("-" if o["auroc"] is None else f"{100 * o['auroc']:.2f} / {100 * o['fpr95']:.2f}")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines += [""] + _per_corruption(report, report.severities[-1])
        lines += ["", _answer(report), ""]
    return "\n".join(lines) + "\n"


def _answer(report) -> str:
    """Where each calibrator still beats the uncalibrated model, and SMART vs TS, cell by cell (measured)."""
    ece = {(r["method"], r["corruption"], r["severity"]): r["ece"] for r in report.rows}
    cells = [(c, s) for (m, c, s) in ece if m == "uncalibrated" and s > 0]
    means = report.severity_means("ece")
    base = means["uncalibrated"]
    parts = []
    for method in report.methods[1:]:
        wins = sum(ece[(method, c, s)] < ece[("uncalibrated", c, s)] for c, s in cells)
        change0 = means[method][0] / base[0] - 1
        change5 = means[method][-1] / base[-1] - 1
        parts.append(f"{method} lowers ECE in {wins} of {len(cells)} corrupted cells (mean ECE {100 * change0:+.0f} % "
                     f"clean, {100 * change5:+.0f} % at severity {report.severities[-1]}, relative to uncalibrated)")  # fmt: skip
    if "smart" in means and "ts" in means:
        smart_wins = sum(ece[("smart", c, s)] < ece[("ts", c, s)] for c, s in cells)
        parts.append(f"SMART is below TS in {smart_wins} of {len(cells)} corrupted cells")
    return "Measured: " + "; ".join(parts) + "."


def _per_corruption(report, severity: int) -> list[str]:
    methods = [m for m in ("uncalibrated", "ts", "smart") if m in report.methods]
    lines = [f"ECE (%) per corruption at severity {severity} (accuracy in %):", "",
             "| corruption | accuracy | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]  # fmt: skip
    cell = {(r["method"], r["corruption"]): r for r in report.rows if r["severity"] == severity}
    for c in report.corruptions:
        lines.append(f"| {c} | {100 * cell[('uncalibrated', c)]['accuracy']:.1f} | "
                     + " | ".join(f"{100 * cell[(m, c)]['ece']:.2f}" for m in methods) + " |")  # fmt: skip
    return lines


# ----------------------------------------------------------------------------- calibration that holds under shift

STUDY_METHODS = ("temperature_scaling", "ets", "smart")
STUDY_NAMES = {"temperature_scaling": "TS", "ets": "ETS", "smart": "SMART"}
STUDY_METRICS = ("ece", "adaece", "nll", "accuracy")


def _score(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from hf_calibration.metrics import adaece, ece, nll

    return {"ece": ece(logits, labels, from_logits=True), "adaece": adaece(logits, labels, from_logits=True),
            "nll": nll(logits, labels, from_logits=True), "accuracy": float((logits.argmax(1) == labels).mean())}  # fmt: skip


def study_logits(
    cache: Path, loss: str, seed: int, n_corrupt: int, corrupt_seed: int, levels: int
) -> dict[str, np.ndarray]:
    """Every logit array the study needs for one model (cached): the clean validation and test sets, each shifted cell
    (``n_corrupt`` test images), and the validation set under the Gaussian-noise schedule of ``fit_for_shift``."""
    from hf_calibration.shift.perturbation import perturb, strength_schedule

    path = cache / f"study_logits_{loss}_seed{seed}_{n_corrupt}_{corrupt_seed}_{levels}.npz"
    if path.exists():
        return dict(np.load(path))
    model, _ = load_model(cache, loss, seed)
    shifted_x, _, _ = corrupted_test_set(cache, n_corrupt, corrupt_seed)
    x_val, y_val = load_split(cache, "val")
    x_test, _ = load_split(cache, "test")
    t = time.perf_counter()
    z = {"val": predict(model, x_val), "test": predict(model, x_test)}
    z.update({f"{c}_{s}": predict(model, v) for (c, s), v in shifted_x.items()})
    seen: dict[float, np.ndarray] = {}

    def accuracy_of(strength: float) -> float:
        if strength not in seen:
            seen[strength] = z["val"] if strength == 0 else predict(model, perturb(x_val, strength, seed=seed))
        return float((seen[strength].argmax(1) == y_val).mean())

    strengths, accuracies = strength_schedule(accuracy_of, levels=levels, num_classes=10)
    for i, strength in enumerate(strengths):
        accuracy_of(strength)
        z[f"perturbed_{i}"] = seen[strength]
    z["strengths"], z["strength_accuracies"] = np.array(strengths), np.array(accuracies)
    np.savez(path, **z)
    print(f"[{loss} seed {seed}] study logits in {time.perf_counter() - t:.0f} s -> {path}", flush=True)
    return z


def study_one(z: dict[str, np.ndarray], y_val, y_test, y_sub, cells) -> dict:
    """Rows of one model: for each method, each cell's metrics on the scored half of that cell (clean test: the second
    half of the 10,000; each corrupted cell: the second half of its images). Adapted calibrators see the other half's
    logits without labels; the ceiling ("oracle") is fitted on the other half with its labels."""
    import warnings

    from hf_calibration.calibrators import create_calibrator
    from hf_calibration.shift.perturbation import fit_on_perturbed

    levels = sorted(int(k.split("_")[1]) for k in z if k.startswith("perturbed_"))
    recipe = {"perturbation": "gaussian_noise", "strengths": z["strengths"].tolist(),
              "accuracies": z["strength_accuracies"].tolist(), "levels": len(levels), "seed": 0}  # fmt: skip
    fitted = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in STUDY_METHODS:
            fitted[method] = create_calibrator(method).fit(z["val"], y_val, from_logits=True, progress_bar=False)
            fitted[method + "+perturbed"] = fit_on_perturbed([z[f"perturbed_{i}"] for i in levels], y_val, method,
                                                             recipe=recipe)  # fmt: skip
    rows = {}
    for cell in [("clean", 0)] + cells:
        key = "test" if cell[0] == "clean" else f"{cell[0]}_{cell[1]}"
        logits = z[key]
        labels = y_test if cell[0] == "clean" else y_sub
        half = logits.shape[0] // 2
        unlabeled, scored, y_fit, y_scored = logits[:half], logits[half:], labels[:half], labels[half:]
        out = {"uncalibrated": _score(scored, y_scored)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for method in STUDY_METHODS:
                name = STUDY_NAMES[method]
                clean_fit = fitted[method]
                out[name] = _score(clean_fit(scored).double().numpy(), y_scored)
                out[name + " perturbed"] = _score(fitted[method + "+perturbed"](scored).double().numpy(), y_scored)
                out[name + " adapted"] = _score(
                    clean_fit.adapt(unlabeled, from_logits=True)(scored).double().numpy(), y_scored
                )
                out[name + " perturbed+adapted"] = _score(
                    fitted[method + "+perturbed"].adapt(unlabeled, from_logits=True)(scored).double().numpy(), y_scored
                )
                oracle = create_calibrator(method).fit(unlabeled, y_fit, from_logits=True, progress_bar=False)
                out[name + " oracle"] = _score(oracle(scored).double().numpy(), y_scored)
        rows[f"{cell[0]}|{cell[1]}"] = out
    return {"rows": rows, "schedule": recipe}


def study(
    cache: Path,
    losses: list[str],
    seeds: list[int],
    n_corrupt: int,
    corrupt_seed: int,
    levels: int,
    out_json: Path,
    out_md: Path,
) -> None:
    """Issue-41 study: every (loss, seed) model, resumable (each model's results are kept in ``out_json`` as they come)."""
    import json

    from hf_calibration.shift import BENCHMARK_CORRUPTIONS

    results = json.loads(out_json.read_text()) if out_json.exists() else {}
    _, _, y_sub = corrupted_test_set(cache, n_corrupt, corrupt_seed)
    _, y_val = load_split(cache, "val")
    _, y_test = load_split(cache, "test")
    cells = [(c, s) for c in BENCHMARK_CORRUPTIONS for s in range(1, 6)]
    for loss in losses:
        for seed in seeds:
            key = f"{loss}|{seed}"
            if key in results:
                continue
            if not model_path(cache, loss, seed).exists():
                print(f"[{key}] no model yet: train it with `train --loss {loss} --train-seed {seed}`", flush=True)
                continue
            z = study_logits(cache, loss, seed, n_corrupt, corrupt_seed, levels)
            t = time.perf_counter()
            results[key] = study_one(z, y_val, y_test, y_sub, cells)
            results[key]["seconds"] = time.perf_counter() - t
            out_json.parent.mkdir(parents=True, exist_ok=True)
            out_json.write_text(json.dumps(results))
            print(f"[{key}] studied in {results[key]['seconds']:.0f} s", flush=True)
    out_md.write_text(study_markdown(results, n_corrupt))
    first = next((k for k in results if k.startswith("ce|")), None)
    if first is not None:
        loss, seed = first.split("|")
        figure = study_figure(
            study_logits(cache, loss, int(seed), n_corrupt, corrupt_seed, levels), y_val, y_test, y_sub
        )
        figure.savefig(ROOT / "docs" / "img" / "shift_reliability_by_severity.png", dpi=110, bbox_inches="tight")
    print(out_md.read_text())


def study_figure(z: dict[str, np.ndarray], y_val, y_test, y_sub):
    """Reliability diagrams at severities 0, 1, 3 and 5 (the corruptions pooled): TS fitted on clean data against ETS
    fitted on the perturbed union and TS adapted without labels; each scored on the second half of each set."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_calibration.calibrators import create_calibrator
    from hf_calibration.metrics import reliability_diagram
    from hf_calibration.shift import BENCHMARK_CORRUPTIONS
    from hf_calibration.shift.perturbation import fit_on_perturbed

    levels = sorted(int(k.split("_")[1]) for k in z if k.startswith("perturbed_"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts = create_calibrator("temperature_scaling").fit(z["val"], y_val, from_logits=True, progress_bar=False)
        ets = fit_on_perturbed([z[f"perturbed_{i}"] for i in levels], y_val, "ets", recipe={})
    fig, axes = plt.subplots(3, 4, figsize=(16, 11.5), sharex=True, sharey=True)
    for col, severity in enumerate((0, 1, 3, 5)):
        keys = ["test"] if severity == 0 else [f"{c}_{severity}" for c in BENCHMARK_CORRUPTIONS]
        labels = y_test if severity == 0 else y_sub
        half = (z[keys[0]].shape[0]) // 2
        scored = np.concatenate([z[k][half:] for k in keys])
        target = np.concatenate([labels[half:]] * len(keys))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adapted = [ts.adapt(z[k][:half], from_logits=True)(z[k][half:]).double().numpy() for k in keys]
        for row, (name, calibrated) in enumerate(
            (
                ("TS (clean fit)", ts(scored).double().numpy()),
                ("ETS (perturbed fit)", ets(scored).double().numpy()),
                ("TS adapted (ATC)", np.concatenate(adapted)),
            )
        ):
            reliability_diagram(calibrated, target, from_logits=True, ax=axes[row, col], counts=False, ci=None,
                                title=f"{name}, severity {severity}")  # fmt: skip
    fig.suptitle("CIFAR-10 under corruption (cross-entropy model): the 15 corruptions pooled at each severity")
    return fig


def _severity_table(results: dict, loss: str, metric: str, methods: list[str], scale: float = 100.0) -> list[str]:
    runs = [r for k, r in results.items() if k.split("|")[0] == loss]
    lines = ["| method | " + " | ".join(str(s) for s in range(6)) + " |", "|---|" + "---|" * 6]
    for method in methods:
        cells = []
        for severity in range(6):
            per_seed = [np.mean([row[method][metric] for cell, row in run["rows"].items() if int(cell.split("|")[1]) == severity])
                        for run in runs]  # fmt: skip
            cells.append(f"{scale * np.mean(per_seed):.2f} ± {scale * np.std(per_seed):.2f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def study_markdown(results: dict, n_corrupt: int) -> str:
    methods = ["uncalibrated"] + [f"{STUDY_NAMES[m]}{suffix}" for m in STUDY_METHODS
                                  for suffix in ("", " perturbed", " adapted", " perturbed+adapted", " oracle")]  # fmt: skip
    lines = [
        "## Calibration that holds under shift: fitted on perturbed images, adapted without labels (`shift.py study`)",
        "",
        f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores. Commands: `python benchmarks/shift.py train --loss ce "
        "--train-seed S` (and `fedlas_ls`), for S = 1, 2; `python benchmarks/shift.py study --seeds 1 2`. Models: the "
        "airbench-style ResNet of the section below, one per loss and training seed. Calibrators fitted on the clean "
        "calibration set (5,000 images): TS, ETS, SMART as they are; **perturbed**: the same fitted on the union of "
        "that set under Gaussian pixel noise at 10 strengths from 0 to where the model's accuracy is within a tenth of "
        "chance (Tomani et al., CVPR 2021; `hf_calibration.shift.fit_for_shift`'s schedule); **adapted**: the clean fit "
        "adapted without labels by ATC (Garg et al., ICLR 2022; `calibrator.adapt`) on the unlabeled first half of each "
        "scored set; **oracle**: refitted on the labelled first half of each shifted set (the SMART paper's setting, a "
        "ceiling). Every method is scored on the second half of each set: 5,000 clean test images; "
        f"{n_corrupt // 2:,} images of each of the 15 corruptions × 5 severities. Mean ± std over the training seeds.",
        "",
    ]
    for loss in sorted({k.split("|")[0] for k in results}):
        seeds = sorted(int(k.split("|")[1]) for k in results if k.split("|")[0] == loss)
        name = {"ce": "cross-entropy", "fedlas_ls": "FeDLaS-LS"}[loss]
        lines += [f"### {name} (training seeds {', '.join(map(str, seeds))})", ""]
        for metric, scale, unit in (("ece", 100, "%"), ("adaece", 100, "%"), ("nll", 1, ""), ("accuracy", 100, "%")):
            lines += [f"{metric.upper() if metric != 'accuracy' else 'Accuracy'}{f' ({unit})' if unit else ''} by severity "
                      "(0 = clean), mean over the 15 corruptions:", ""]  # fmt: skip
            lines += _severity_table(
                results, loss, metric, methods if metric != "accuracy" else ["uncalibrated"], scale
            )
            lines.append("")
        lines += _per_corruption_table(
            results, loss, 5, ["uncalibrated", "TS", "ETS perturbed", "TS adapted", "ETS oracle"]
        )
        for metric, scale, unit in (("ece", 100, " (%)"), ("adaece", 100, " (%)"), ("nll", 1, "")):
            lines += [""] + _per_corruption_means(results, loss, methods, metric, scale, unit)
        lines += ["", _targets(results, loss), ""]
    return "\n".join(lines) + "\n"


def _per_corruption_means(
    results: dict, loss: str, methods: list[str], metric: str, scale: float, unit: str
) -> list[str]:
    """Every method by corruption: ``metric`` averaged over severities 1-5 and the seeds."""
    from hf_calibration.shift import BENCHMARK_CORRUPTIONS

    runs = [r for k, r in results.items() if k.split("|")[0] == loss]
    label = metric.upper() if metric != "nll" else "NLL"
    lines = [f"{label}{unit} per corruption, mean over severities 1-5 and seeds:", "",
             "| method | " + " | ".join(BENCHMARK_CORRUPTIONS) + " |", "|---|" + "---|" * len(BENCHMARK_CORRUPTIONS)]  # fmt: skip
    for m in methods:
        cells = [
            f"{scale * np.mean([run['rows'][f'{c}|{s}'][m][metric] for run in runs for s in range(1, 6)]):.2f}"
            for c in BENCHMARK_CORRUPTIONS
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def _per_corruption_table(results: dict, loss: str, severity: int, methods: list[str]) -> list[str]:
    from hf_calibration.shift import BENCHMARK_CORRUPTIONS

    runs = [r for k, r in results.items() if k.split("|")[0] == loss]
    lines = [f"ECE (%) per corruption at severity {severity}, mean over seeds:", "",
             "| corruption | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]  # fmt: skip
    for c in BENCHMARK_CORRUPTIONS:
        cells = [f"{100 * np.mean([run['rows'][f'{c}|{severity}'][m]['ece'] for run in runs]):.2f}" for m in methods]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _targets(results: dict, loss: str) -> str:
    """The issue's targets for the routes that see no shifted label, as measured (mean over seeds)."""
    runs = [r for k, r in results.items() if k.split("|")[0] == loss]

    def mean(method, predicate, metric="ece"):
        return float(np.mean([np.mean([row[method][metric] for cell, row in run["rows"].items() if predicate(cell)])
                              for run in runs]))  # fmt: skip

    sev = lambda s: lambda cell: int(cell.split("|")[1]) == s  # noqa: E731
    parts = []
    for method in (
        "TS perturbed",
        "ETS perturbed",
        "SMART perturbed",
        "TS adapted",
        "ETS adapted",
        "ETS perturbed+adapted",
    ):
        at5, ts5 = mean(method, sev(5)), mean("TS", sev(5))
        wins = np.mean([sum(run["rows"][cell][method]["ece"] < run["rows"][cell]["TS"]["ece"]
                            for cell in run["rows"] if 1 <= int(cell.split("|")[1]) <= 4) for run in runs])  # fmt: skip
        clean, ts_clean = mean(method, sev(0)), mean("TS", sev(0))
        acc = mean(method, lambda cell: True, "accuracy") - mean("TS", lambda cell: True, "accuracy")
        parts.append(f"{method}: severity-5 ECE {100 * at5:.2f} % against TS's {100 * ts5:.2f} % (target <= {50 * ts5:.2f} %: "
                     f"{'met' if at5 <= ts5 / 2 else 'missed'}); below TS in {wins:.1f} of 60 cells of severities 1-4 (target >= 54: "
                     f"{'met' if wins >= 54 else 'missed'}); clean ECE {100 * clean:.2f} % against {100 * ts_clean:.2f} % (target "
                     f"within 0.5 points: {'met' if abs(clean - ts_clean) <= 0.005 else 'missed'}); accuracy change {100 * acc:+.2f} "
                     "points")  # fmt: skip
    return "Targets (routes that see no shifted label): " + "; ".join(parts) + "."


# ----------------------------------------------------------------------------- main


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--npz", default=str(ROOT.parent / "shared" / "data" / "cifar10_jpeg.npz"))
    t = sub.add_parser("train")
    t.add_argument("--loss", choices=["ce", "fedlas_ls"], required=True)
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--batch-size", type=int, default=500)
    t.add_argument("--lr", type=float, default=0.2)
    t.add_argument(
        "--widths",
        type=int,
        nargs=3,
        default=(32, 128, 128),
        help="block widths (airbench94: 64 256 256; half by default: this shared 2-core CPU ran 4-10 min per full-width epoch)",
    )
    t.add_argument("--train-seed", type=int, default=0, help="the model's initialisation and batch order")
    e = sub.add_parser("evaluate")
    e.add_argument("--losses", nargs="+", default=["ce", "fedlas_ls"])
    e.add_argument("--n-corrupt", type=int, default=2000, help="test images per corruption x severity")
    e.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "shift.md"))
    st = sub.add_parser("study", help="issue 41: perturbation-fitted and label-free adapted calibrators under shift")
    st.add_argument("--losses", nargs="+", default=["ce", "fedlas_ls"])
    st.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="training seeds of the models")
    st.add_argument("--n-corrupt", type=int, default=2000)
    st.add_argument("--levels", type=int, default=10, help="perturbation strengths of the perturbed fit")
    st.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "shift_calibration.json"))
    st.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "shift_calibration.md"))
    for q in (p, t, e, st):
        q.add_argument("--cache", default=str(ROOT / ".data" / "shift"))
        q.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    cache = Path(args.cache)
    if args.step == "prepare":
        prepare(args.npz, cache, args.seed)
    elif args.step == "train":
        train(cache, args.loss, args.epochs, args.batch_size, args.lr, args.train_seed, tuple(args.widths))
    elif args.step == "study":
        study(cache, args.losses, args.seeds, args.n_corrupt, args.seed, args.levels, Path(args.json), Path(args.out))
    else:
        evaluate(cache, args.losses, args.n_corrupt, args.seed, Path(args.out))


if __name__ == "__main__":
    main()
