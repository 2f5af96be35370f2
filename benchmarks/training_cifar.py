"""CIFAR-10 on a CPU: every training loss, two regimes, MaC-Cal and Mixup, trained through `CalibrationTrainer`.

What is measured: test-split calibration of a small ResNet (transformers' ``ResNetForImageClassification`` built
from a config, random init) trained here with CE, LS, MbLS, FLSD-53, FeDLaS-LS, FeDLaS-MbLS and Mixup, each over
several seeds, in two regimes:

* ``overconfident``: no augmentation, the model fits its training set (the papers' setting: CE over-confident);
* ``wellfitted``: random crop + flip, the same number of epochs: the model does not fit its training set and CE
  is close to calibrated.

Per run: accuracy, ECE, AdaECE, O-ECE, U-ECE, NLL (15 bins, ``hf_calibration.metrics``) and the ECE after
temperature scaling fitted on the validation split. CE and Mixup models also get the MaC-Cal second stage
(``CalibrationTrainer.run_maccal`` with the default ``MaCCalConfig``), recorded as stage ``"maccal"``.

Data (``../shared/data/cifar10_jpeg.npz``, decoded once into ``--cache``, git-ignored): of the 45,000 training
images, 5,000 are the validation split (temperature scaling, every setting chosen), ``--train-size`` are
trained on, ``--holdout-size`` more are held out for MaC-Cal's stage 2 (``MaCCalConfig``'s docstring says why),
and the 10,000 test images are only ever reported.

Each run's records go to ``--out`` (JSON, written atomically after each run); a run whose records are there is
skipped, so an interrupted run resumes where it stopped. The Markdown section is rebuilt from the JSON at the end
(or alone with ``--report-only``).

    python benchmarks/training_cifar.py                          # the full protocol (~1-2 h on 2 cores)
    python benchmarks/training_cifar.py --seeds 0 --losses CE FeDLaS-LS --regimes overconfident   # a quick look
    python benchmarks/training_cifar.py --report-only            # rebuild the Markdown from the JSON
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _data import TensorDictDataset  # noqa: E402

logger = logging.getLogger("training_cifar")

# name → (get_loss name, kwargs, mixup α); the papers' CIFAR-10 hyper-parameters (DESIGN.md, README)
LOSSES: dict[str, tuple[str, dict, float]] = {
    "CE": ("ce", {}, 0.0),
    "LS": ("ls", {"alpha": 0.05}, 0.0),
    "MbLS": ("mbls", {"margin": 6.0, "lam": 0.1}, 0.0),
    "FLSD-53": ("flsd53", {}, 0.0),
    "FeDLaS-LS": ("fedlas_ls", {"base": 0.05, "beta": 4.0, "theta": 0.95}, 0.0),
    "FeDLaS-MbLS": ("fedlas_mbls", {"base": 0.1, "beta": 0.5, "margin": 6.0, "theta": 0.95}, 0.0),
    "Mixup": ("ce", {}, 1.0),  # Zhang et al. 2018's CIFAR-10 α
    # the official code's gate (it descends the loss), for comparison with the default (FeDLaSLoss's docstring)
    "FeDLaS-LS (descent gate)": (
        "fedlas_ls",
        {"base": 0.05, "beta": 4.0, "theta": 0.95, "gate_update": "descent"},
        0.0,
    ),
    "FeDLaS-MbLS (descent gate)": (
        "fedlas_mbls",
        {"base": 0.1, "beta": 0.5, "margin": 6.0, "theta": 0.95, "gate_update": "descent"},
        0.0,
    ),
    # control: plain LS with FeDLaS-LS's average smoothing (its ascending gate gives r ≈ 1.10-1.18·α on the fitted
    # samples, `--diagnose-fedlas`): does FeDLaS-LS add anything beyond a larger α?
    "LS (matched α)": ("ls", {"alpha": 0.0575}, 0.0),
}
COMPARISONS = (
    "FeDLaS-LS (descent gate)",
    "FeDLaS-MbLS (descent gate)",
    "LS (matched α)",
)  # run last, in the over-confident regime
# (FeDLaS variant, the loss it is compared with) in the claims
CLAIMS = (
    ("FeDLaS-LS", "LS"),
    ("FeDLaS-MbLS", "MbLS"),
    ("FeDLaS-LS (descent gate)", "LS"),
    ("FeDLaS-MbLS (descent gate)", "MbLS"),
    ("FeDLaS-LS", "LS (matched α)"),
)
LOSS_LABELS = {
    "CE": "CE",
    "LS": "LS (α = 0.05)",
    "MbLS": "MbLS (m = 6, λ = 0.1)",
    "FLSD-53": "FLSD-53",
    "FeDLaS-LS": "FeDLaS-LS (α = 0.05, β = 4)",
    "FeDLaS-MbLS": "FeDLaS-MbLS (λ = 0.1, β = 0.5, m = 6)",
    "Mixup": "Mixup (α = 1)",
    "FeDLaS-LS (descent gate)": "FeDLaS-LS, the official code's gate (descent)",
    "FeDLaS-MbLS (descent gate)": "FeDLaS-MbLS, the official code's gate (descent)",
    "LS (matched α)": "LS (α = 0.0575, FeDLaS-LS's mean smoothing)",
}
MACCAL_LOSSES = ("CE", "Mixup")  # stage 2 runs on these stage-1 models
REGIMES = {"overconfident": False, "wellfitted": True}  # regime → augmentation
RECORD_KEYS = ("regime", "loss", "seed", "stage", "accuracy", "ece", "adaece", "o_ece", "u_ece", "nll", "ece_ts")
METRICS = ("accuracy", "ece", "adaece", "o_ece", "u_ece", "nll", "ece_ts")
HEADERS = ("Accuracy (%)", "ECE (%)", "AdaECE (%)", "O-ECE (%)", "U-ECE (%)", "NLL", "ECE after TS (%)")
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


@dataclass
class Settings:
    """What a run depends on; the JSON keeps it, and resuming with other settings is refused."""

    train_size: int = 8000
    holdout_size: int = 5000
    epochs: int = 12
    batch_size: int = 128
    lr: float = 0.05
    weight_decay: float = 5e-4
    widths: tuple = (32, 64, 128)
    split_seed: int = 0
    maccal: dict = field(default_factory=dict)  # MaCCalConfig overrides (empty: the defaults)
    maccal_data: str = "holdout"  # what stage 2 retrains the head on: "holdout" or "train"


# ----------------------------------------------------------------------------- data


def load_splits(npz: Path, cache: Path, settings: Settings) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """uint8 images and labels of the train / holdout / val / test splits (decoded once into ``cache``)."""
    from shift import load_split, prepare  # the shift benchmark's decoder: 40,000 train / 5,000 val / 10,000 test

    if not (cache / "cifar10_u8.npz").is_file():
        logger.info("decoding %s into %s (once)", npz, cache)
        prepare(str(npz), cache, seed=settings.split_seed)
    x, y = load_split(cache, "train")
    order = np.random.default_rng(settings.split_seed).permutation(len(y))
    n, h = settings.train_size, settings.holdout_size
    if n + h > len(y):
        raise SystemExit(f"--train-size + --holdout-size = {n + h} exceeds the {len(y)} images left after validation")
    train, holdout = np.sort(order[:n]), np.sort(order[n : n + h])
    return {
        "train": (x[train], y[train]),
        "holdout": (x[holdout], y[holdout]),
        "val": load_split(cache, "val"),
        "test": load_split(cache, "test"),
    }


def to_tensor(images_u8: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, 3) → normalised float32 (N, 3, H, W)."""
    x = torch.from_numpy(np.ascontiguousarray(images_u8)).permute(0, 3, 1, 2).float().div_(255)
    return ((x - MEAN) / STD).contiguous()


class CropFlipDataset(TensorDictDataset):
    """Random 32×32 crop of the 4-px zero-padded image and a random horizontal flip, drawn per item from torch's
    global RNG (which the Trainer seeds)."""

    def __getitem__(self, i):
        x = self.x[i]
        dx, dy, flip = torch.randint(0, 9, (2,)).tolist() + [bool(torch.rand(()) < 0.5)]
        x = F.pad(x, (4, 4, 4, 4))[:, dy : dy + 32, dx : dx + 32]
        return {"pixel_values": x.flip(2) if flip else x, "labels": self.y[i]}


# ----------------------------------------------------------------------------- model and one run


def make_model(settings: Settings, seed: int):
    """A small ResNet from transformers' config (basic blocks, one per stage), random init from ``seed``."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    w = list(settings.widths)
    config = ResNetConfig(
        num_channels=3, embedding_size=w[0], hidden_sizes=w, depths=[1] * len(w), layer_type="basic",
        downsample_in_first_stage=False, num_labels=10,
    )  # fmt: skip
    return ResNetForImageClassification(config)


def training_args(settings: Settings, seed: int, output_dir: str, progress: bool):
    from transformers import TrainingArguments

    steps = settings.epochs * -(-settings.train_size // settings.batch_size)
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=1000,
        num_train_epochs=settings.epochs,
        learning_rate=settings.lr,
        optim="sgd",
        optim_args="momentum=0.9,nesterov=True",
        weight_decay=settings.weight_decay,
        lr_scheduler_type="linear",
        warmup_steps=max(1, steps // 10),
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="epoch",
        report_to="none",
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        use_cpu=True,
    )


def evaluate_logits(logits: np.ndarray, labels: np.ndarray, val_logits: np.ndarray, val_labels: np.ndarray) -> dict:
    """The record's metrics (fractions; NLL in nats), TS fitted on the validation logits."""
    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.metrics import calibration_report, ece

    report = calibration_report(logits, labels)
    ts = TemperatureScaling().fit(val_logits, val_labels)
    calibrated = ts(torch.from_numpy(logits)).detach().numpy()
    probs = torch.from_numpy(logits).double().softmax(-1)
    return {
        **{k: float(report[k]) for k in ("accuracy", "ece", "adaece", "o_ece", "u_ece", "nll")},
        "ece_ts": float(ece(calibrated, labels, from_logits=True)),
        "temperature": float(ts.temperature(torch.from_numpy(logits[:1])).reshape(-1)[0]),
        "mean_confidence": float(probs.max(-1).values.mean()),
        "val_ece": float(ece(val_logits, val_labels, from_logits=True)),
    }


def predict(trainer, data: dict[str, TensorDictDataset]) -> dict[str, np.ndarray]:
    return {name: trainer.predict(ds).predictions.astype(np.float64) for name, ds in data.items()}


def save_features(trainer, tensors: dict, path: Path) -> None:
    """The stage-1 head's input on every split and the head itself (for exploring MaC-Cal's stage 2 offline)."""
    from hf_calibration._core.features import find_classifier_head
    from hf_calibration.maccal.stage import cache_features

    linear = find_classifier_head(trainer.model)[2]
    out = {"weight": linear.weight.detach().clone(), "bias": linear.bias.detach().clone()}
    for split in ("train", "holdout", "val", "test"):
        out[split] = cache_features(trainer.model, TensorDictDataset(*tensors[split]), batch_size=1000, progress=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)


def choose_threads(settings: Settings, maximum: int) -> int:
    """Time two SGD steps of the model (batch 32) on 1 and on ``maximum`` threads and keep the faster (more threads
    must win by 20 %): on a shared 2-core machine a parallel step can wait for a descheduled worker and take many
    times longer (measured here: 8x under load), while on an idle one two threads are faster."""
    if maximum <= 1:
        return 1
    model = make_model(settings, 0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def timed(threads: int) -> float:
        torch.set_num_threads(threads)
        best = float("inf")
        for _ in range(3):  # the first is a warm-up
            t = time.perf_counter()
            F.cross_entropy(model(pixel_values=x).logits, y).backward()
            opt.step()
            opt.zero_grad()
            best = min(best, time.perf_counter() - t)
        return best

    one, many = timed(1), timed(maximum)
    threads = maximum if many < 0.8 * one else 1
    torch.set_num_threads(threads)
    return threads


def run_one(
    regime: str,
    loss_key: str,
    seed: int,
    tensors: dict,
    settings: Settings,
    progress: bool,
    features_dir: Path | None = None,
) -> list[dict]:
    """Train one model (stage 1) and, for CE / Mixup, run MaC-Cal on it; returns its records."""
    from transformers import PrinterCallback

    from hf_calibration import CalibrationTrainer
    from hf_calibration.losses import get_loss
    from hf_calibration.maccal import MaCCalConfig

    name, kwargs, mixup_alpha = LOSSES[loss_key]
    train_ds = (CropFlipDataset if REGIMES[regime] else TensorDictDataset)(*tensors["train"])
    evals = {k: TensorDictDataset(*tensors[k]) for k in ("val", "test")}
    fit_probe = TensorDictDataset(tensors["train"][0][::2], tensors["train"][1][::2])  # every other image: all classes
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = CalibrationTrainer(
            model=make_model(settings, seed),
            args=training_args(settings, seed, tmp, progress),
            train_dataset=train_ds,
            compute_loss_func=get_loss(name, **kwargs),
            mixup_alpha=mixup_alpha,
        )
        trainer.remove_callback(PrinterCallback)  # one summary line per run (below), not one dict per epoch
        trainer.train()
        train_seconds = time.perf_counter() - t0
        logits = predict(trainer, {**evals, "train": fit_probe})
        labels = {k: tensors[k][1].numpy() for k in ("val", "test")}
        labels["train"] = fit_probe.y.numpy()
        base = {"regime": regime, "loss": loss_key, "seed": seed, "threads": torch.get_num_threads()}
        train_acc = float((logits["train"].argmax(1) == labels["train"]).mean())
        records = [
            {
                **base,
                "stage": "stage1",
                **evaluate_logits(logits["test"], labels["test"], logits["val"], labels["val"]),
                "train_accuracy": train_acc,
                "seconds": round(train_seconds, 1),
            }
        ]
        if features_dir is not None and loss_key in MACCAL_LOSSES:
            save_features(trainer, tensors, features_dir / f"{regime}_{loss_key}_{seed}.pt")
        if loss_key in MACCAL_LOSSES:
            t1 = time.perf_counter()
            trainer.maccal = MaCCalConfig(**settings.maccal, seed=seed, progress=progress)
            trainer.maccal_dataset = TensorDictDataset(*tensors[settings.maccal_data])
            result = trainer.run_maccal()
            logits = predict(trainer, evals)
            records.append(
                {
                    **base,
                    "stage": "maccal",
                    **evaluate_logits(logits["test"], labels["test"], logits["val"], labels["val"]),
                    "final_retention": result.history[-1]["retention"],
                    "seconds": round(time.perf_counter() - t1, 1),
                }
            )
    return records


# ----------------------------------------------------------------------------- bookkeeping


def run_key(record: dict) -> tuple[str, str, int]:
    return (record["regime"], record["loss"], int(record["seed"]))


def expected_stages(loss_key: str) -> set[str]:
    return {"stage1", "maccal"} if loss_key in MACCAL_LOSSES else {"stage1"}


def load_results(path: Path, settings: Settings) -> dict:
    """The JSON at ``path`` (``{"settings", "records"}``), or a fresh one; refuses one written with other settings."""
    fresh = {"settings": _jsonable(asdict(settings)), "records": []}
    if not path.is_file():
        return fresh
    data = json.loads(path.read_text())
    if data.get("settings") != fresh["settings"]:
        raise SystemExit(
            f"{path} holds runs made with other settings ({data.get('settings')}); pass another --out, or the same "
            "settings, to resume"
        )
    return data


def done_runs(data: dict) -> set[tuple[str, str, int]]:
    """The (regime, loss, seed) whose every expected stage has a record."""
    stages: dict[tuple, set] = {}
    for r in data["records"]:
        stages.setdefault(run_key(r), set()).add(r["stage"])
    return {k for k, s in stages.items() if expected_stages(k[1]) <= s}


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temporary file in the same folder, then rename it over ``path`` (never a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def run_all(
    plan: list[tuple[str, str, int]],
    tensors: dict,
    settings: Settings,
    out: Path,
    progress: bool,
    runner=run_one,
    threads: int = 1,
    **run_kwargs,
) -> dict:
    """Run every planned (regime, loss, seed) not yet in ``out``, writing the JSON after each."""
    from hf_calibration._core.progress import progress_iter

    data = load_results(out, settings)
    todo = [p for p in plan if p not in done_runs(data)]
    logger.info("%d of %d runs to do (%d already in %s)", len(todo), len(plan), len(plan) - len(todo), out)
    for i, (regime, loss_key, seed) in enumerate(progress_iter(todo, desc="training runs", enabled=progress)):
        if threads == 0 and i % 3 == 0:  # re-timed every third run: the machine's load changes
            logger.info("%d torch thread(s) for the next runs", choose_threads(settings, os.cpu_count() or 1))
        records = runner(regime, loss_key, seed, tensors, settings, False, **run_kwargs)
        key = (regime, loss_key, seed)
        data["records"] = [r for r in data["records"] if run_key(r) != key] + records
        write_json_atomic(out, data)
        for r in records:
            logger.info(
                "%s %s seed %d %s: acc %.2f%%, ECE %.2f%%, after TS %.2f%% (%.0f s)",
                regime, loss_key, seed, r["stage"], 100 * r["accuracy"], 100 * r["ece"], 100 * r["ece_ts"], r["seconds"],
            )  # fmt: skip
    return data


# ----------------------------------------------------------------------------- report


def _mean_std(values: list[float], scale: float) -> str:
    a = np.asarray(values, dtype=float) * scale
    if len(a) == 1:
        return f"{a[0]:.2f}"
    return f"{a.mean():.2f} ± {a.std(ddof=1):.2f}"


def summary_rows(records: list[dict], regime: str) -> list[tuple[str, str, list[dict]]]:
    """(loss, stage, records) in table order."""
    rows = []
    for loss_key in LOSSES:
        for stage in ("stage1", "maccal"):
            rs = [r for r in records if r["regime"] == regime and r["loss"] == loss_key and r["stage"] == stage]
            if rs:
                rows.append((loss_key, stage, sorted(rs, key=lambda r: r["seed"])))
    return rows


def table(records: list[dict], regime: str) -> str:
    lines = [
        "| loss | stage | seeds | " + " | ".join(HEADERS) + " | mean conf. (%) | train acc. (%) | val ECE (%) |",
        "|---|---|---:|" + "---:|" * (len(HEADERS) + 3),
    ]
    for loss_key, stage, rs in summary_rows(records, regime):
        cells = [_mean_std([r[m] for r in rs], 1.0 if m == "nll" else 100.0) for m in METRICS]
        conf = _mean_std([r["mean_confidence"] for r in rs], 100.0)
        fit = _mean_std([r["train_accuracy"] for r in rs], 100.0) if stage == "stage1" else ""
        label = LOSS_LABELS[loss_key] + (" + MaC-Cal" if stage == "maccal" else "")
        val = _mean_std([r["val_ece"] for r in rs], 100.0)
        lines.append(f"| {label} | {stage} | {len(rs)} | " + " | ".join(cells) + f" | {conf} | {fit} | {val} |")
    return "\n".join(lines)


def _by_seed(records: list[dict], regime: str, loss_key: str, stage: str) -> dict[int, dict]:
    return {r["seed"]: r for r in records if r["regime"] == regime and r["loss"] == loss_key and r["stage"] == stage}


def verdicts(records: list[dict]) -> list[str]:
    """The claims the benchmark checks, on the test split: FeDLaS vs its base loss, MaC-Cal vs its stage 1."""
    lines = []
    for regime in REGIMES:
        for fed, base in CLAIMS:
            a, b = _by_seed(records, regime, fed, "stage1"), _by_seed(records, regime, base, "stage1")
            seeds = sorted(set(a) & set(b))
            if not seeds:
                continue
            fa, fb = np.mean([a[s]["ece"] for s in seeds]) * 100, np.mean([b[s]["ece"] for s in seeds]) * 100
            wins = sum(a[s]["ece"] < b[s]["ece"] for s in seeds)
            lines.append(
                f"- {regime}: {fed} mean ECE {fa:.2f} % vs {base} {fb:.2f} % "
                f"({'lower' if fa < fb else 'NOT lower'}; lower on {wins} of {len(seeds)} seeds)."
            )
        for loss_key in MACCAL_LOSSES:
            s1, s2 = _by_seed(records, regime, loss_key, "stage1"), _by_seed(records, regime, loss_key, "maccal")
            seeds = sorted(set(s1) & set(s2))
            if not seeds:
                continue
            lower = sum(s2[s]["ece"] < s1[s]["ece"] for s in seeds)
            d_acc = [100 * (s2[s]["accuracy"] - s1[s]["accuracy"]) for s in seeds]
            e1, e2 = (np.mean([d[s]["ece"] for s in seeds]) * 100 for d in (s1, s2))
            lines.append(
                f"- {regime}: {loss_key} + MaC-Cal: ECE {e1:.2f} → {e2:.2f} % (lower on {lower} of {len(seeds)} seeds), "
                f"accuracy change {min(d_acc):+.2f} to {max(d_acc):+.2f} points."
            )
    return lines


def markdown(data: dict, command: str, host_note: str | None = None) -> str:
    records, s = data["records"], data["settings"]
    seeds = sorted({r["seed"] for r in records})
    secs = [r["seconds"] for r in records if r["stage"] == "stage1"]
    threads = sorted({r.get("threads") for r in records})
    parts = [
        "## Training losses and MaC-Cal on CIFAR-10, CPU (training_cifar.py)",
        "",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} ({', '.join(map(str, threads))} "
        f"thread(s)); the machine is shared, so wall times are indicative only.",
        f"- Command: `{command}`. Records: `benchmarks/results/training_cifar.json` (one per run and stage).",
        f"- Data: CIFAR-10 (JPEG re-encoding, `../shared/data/cifar10_jpeg.npz`): {s['train_size']:,} training images, "
        f"{s['holdout_size']:,} held out for MaC-Cal's stage 2, 5,000 validation (temperature scaling, every choice), "
        "10,000 test (reported).",
        f"- Model: transformers `ResNetForImageClassification` from a config, widths {'/'.join(map(str, s['widths']))}, "
        f"one basic block per stage, random init; `CalibrationTrainer`, SGD (Nesterov 0.9) lr {s['lr']}, weight decay "
        f"{s['weight_decay']}, linear warm-up and decay, batch {s['batch_size']}, {s['epochs']} epochs. "
        "`overconfident`: no augmentation; `wellfitted`: random crop (4-px padding) + flip.",
        f"- MaC-Cal: `CalibrationTrainer.run_maccal` with `MaCCalConfig({', '.join(f'{k}={v!r}' for k, v in s['maccal'].items())})` "
        f"on the {s['maccal_data']} split.",
        f"- Seeds {', '.join(map(str, seeds))}; mean ± std (ddof 1) over seeds; 15 bins; percent except NLL. "
        f"Stage-1 training {np.median(secs) if secs else 0:.0f} s per run (median), {sum(r['seconds'] for r in records) / 60:.0f} min in all.",
        *([f"- Host: {host_note}"] if host_note else []),
        '- FeDLaS rows use `FeDLaSLoss`\'s default gate, which climbs the loss (`gate_update="ascent"`); the rows '
        '"the official code\'s gate (descent)" train the same losses with the gate descending the loss, as the '
        "official code does, in the over-confident regime. `FeDLaSLoss`'s docstring says why the default changed.",
        "- MaC-Cal rows: stage 2 with `MaCCalConfig()`'s defaults, retraining the head on the held-out split (chosen on "
        "validation: `training_cifar_maccal.md`, next section; retrained on the training images, the same stage "
        "makes ECE about twice stage 1's). Mixup + MaC-Cal is the paper's pairing: a Mixup stage 1, then the head "
        "retrained on clean images.",
        "",
        "### Claims checked (test split)",
        "",
        *verdicts(records),
    ]
    for regime in REGIMES:
        if any(r["regime"] == regime for r in records):
            parts += ["", f"### Regime `{regime}` (test split)", "", table(records, regime)]
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- MaC-Cal variants on saved features


class _LinearOnFeatures(torch.nn.Module):
    """The stage-1 head alone, fed the saved features: what ``maccal_stage`` replaces, without the backbone."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.classifier = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.classifier.weight.copy_(weight)
            self.classifier.bias.copy_(bias)

    def forward(self, x):
        return self.classifier(x)


# the previous defaults, the paper's schedule: every variant below changes these (not today's defaults)
MACCAL_PAPER = {"epochs": 40, "lr": 0.1, "init": "fresh", "rho0": 0.9}
MACCAL_VARIANTS: dict[str, dict] = {  # name → MaCCalConfig overrides of MACCAL_PAPER (+ "data", "direction")
    "paper: train data, 40 epochs, fresh head": {"data": "train"},
    "train data, 5 epochs": {"data": "train", "epochs": 5},
    "train data, 5 epochs, κ = 0.8": {"data": "train", "epochs": 5, "kappa": 0.8},
    "train data, 5 epochs, lower ρ when over-confident": {"data": "train", "epochs": 5, "direction": "lower"},
    "train data, 5 epochs, no 1/ρ rescaling": {"data": "train", "epochs": 5, "rescale": False},
    "train data, 5 epochs, fixed ρ = 0.7": {"data": "train", "epochs": 5, "adaptive": False, "rho0": 0.7},
    "train data, 5 epochs, start from the linear head": {"data": "train", "epochs": 5, "init": "linear"},
    "holdout, 40 epochs": {"data": "holdout"},
    "holdout, 5 epochs": {"data": "holdout", "epochs": 5},
    "holdout, 5 epochs, full-head feedback": {"data": "holdout", "epochs": 5, "feedback": "full"},
    "holdout, 5 epochs, κ = 1": {"data": "holdout", "epochs": 5, "kappa": 1.0},
    "holdout, 5 epochs, lower ρ when over-confident": {"data": "holdout", "epochs": 5, "direction": "lower"},
    "holdout, 5 epochs, no 1/ρ rescaling": {"data": "holdout", "epochs": 5, "rescale": False},
    "holdout, 5 epochs, fixed ρ = 1 (no masks)": {"data": "holdout", "epochs": 5, "adaptive": False, "rho0": 1.0},
    "holdout, 5 epochs, start from the linear head": {"data": "holdout", "epochs": 5, "init": "linear"},
    "holdout, 5 epochs, linear start, lr 0.01": {"data": "holdout", "epochs": 5, "init": "linear", "lr": 0.01},
    "holdout, 5 epochs, linear start, full-head feedback": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "feedback": "full",
    },
    "holdout, 40 epochs, linear start": {"data": "holdout", "init": "linear"},
    "train data, 5 epochs, linear start, lr 0.01": {"data": "train", "epochs": 5, "init": "linear", "lr": 0.01},
    "holdout, 5 epochs, linear start, lr 0.003": {"data": "holdout", "epochs": 5, "init": "linear", "lr": 0.003},
    "holdout, 5 epochs, linear start, lr 0.03": {"data": "holdout", "epochs": 5, "init": "linear", "lr": 0.03},
    "holdout, 10 epochs, linear start, lr 0.01": {"data": "holdout", "epochs": 10, "init": "linear", "lr": 0.01},
    "holdout, 5 epochs, linear start, lr 0.01, fixed ρ = 1 (no masks)": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "adaptive": False,
        "rho0": 1.0,
    },
    "holdout, 5 epochs, linear start, lr 0.01, fixed ρ = 0.9": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "adaptive": False,
    },
    "holdout, 5 epochs, linear start, lr 0.01, full-head feedback": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "feedback": "full",
    },
    "holdout, 5 epochs, linear start, lr 0.01, κ = 1": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "kappa": 1.0,
    },
    "holdout, 5 epochs, linear start, lr 0.01, lower ρ when over-confident": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "direction": "lower",
    },
    "holdout, 5 epochs, linear start, lr 0.01, no 1/ρ rescaling": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "rescale": False,
    },
    "holdout, 5 epochs, fresh head, lr 0.01": {"data": "holdout", "epochs": 5, "lr": 0.01},
    "holdout, 5 epochs, linear start, lr 0.01, adaptive from ρ₀ = 1": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "rho0": 1.0,
    },
    "holdout, 5 epochs, linear start, lr 0.01, adaptive from ρ₀ = 1, full-head feedback": {
        "data": "holdout",
        "epochs": 5,
        "init": "linear",
        "lr": 0.01,
        "rho0": 1.0,
        "feedback": "full",
    },
    "`MaCCalConfig()` (the defaults) on the holdout split": {"data": "holdout", "defaults": True},
    "`MaCCalConfig()` (the defaults) on the training images": {"data": "train", "defaults": True},
}


def _lower_when_overconfident(rho, accuracy, confidence, epoch, config):
    """The opposite rule: ρ ← clamp(ρ − clip(step·(conf − κ·acc), ±τ_t)) (over-confident → mask more)."""
    from hf_calibration.maccal.retention import clip_bound

    tau = clip_bound(epoch, config)
    delta = min(max(config.step * (confidence - config.kappa * accuracy), -tau), tau)
    return min(max(rho - delta, config.rho_min), config.rho_max)


def run_maccal_variant(saved: dict, overrides: dict, seed: int) -> dict[str, np.ndarray]:
    """Stage 2 on the saved features with ``overrides``; the new head's logits on val and test."""
    import hf_calibration.maccal.stage as stage_module
    from hf_calibration.maccal import MaCCalConfig, maccal_stage

    overrides = dict(overrides) if overrides.get("defaults") else {**MACCAL_PAPER, **overrides}
    overrides.pop("defaults", None)
    data, direction = overrides.pop("data"), overrides.pop("direction", "raise")
    model = _LinearOnFeatures(saved["weight"], saved["bias"])
    original = stage_module.update_retention
    if direction == "lower":
        stage_module.update_retention = _lower_when_overconfident
    try:
        maccal_stage(model, features=saved[data], config=MaCCalConfig(**overrides, seed=seed, progress=False))
    finally:
        stage_module.update_retention = original
    with torch.no_grad():
        return {split: model(saved[split][0]).double().numpy() for split in ("val", "test")}


def explore_maccal(
    features_dir: Path, seeds: list[int], md: Path, command: str, regime: str = "overconfident", loss_key: str = "CE"
) -> None:
    """Every variant of ``MACCAL_VARIANTS`` on each seed's saved stage-1 features: validation ECE / accuracy (what
    the choice is made on) and test ECE / accuracy, against stage 1 and stage 1 + TS (fitted on the same data)."""
    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.metrics import ece

    rows: dict[str, list[dict]] = {}
    for seed in seeds:
        saved = torch.load(features_dir / f"{regime}_{loss_key}_{seed}.pt")
        stage1 = _LinearOnFeatures(saved["weight"], saved["bias"])
        with torch.no_grad():
            base = {split: stage1(saved[split][0]).double().numpy() for split in ("holdout", "val", "test")}
        labels = {split: saved[split][1].numpy() for split in ("holdout", "val", "test")}

        def scores(logits):
            return {
                f"{m}_{split}": fn(logits[split], labels[split])
                for split in ("val", "test")
                for m, fn in (
                    ("ece", lambda z, y: ece(z, y, from_logits=True)),
                    ("acc", lambda z, y: float((z.argmax(1) == y).mean())),
                )
            }

        rows.setdefault("stage 1", []).append(scores(base))
        ts = TemperatureScaling().fit(base["holdout"], labels["holdout"])
        calibrated = {split: ts(torch.from_numpy(base[split])).detach().numpy() for split in ("val", "test")}
        rows.setdefault("stage 1 + TS fitted on the holdout split", []).append(scores(calibrated))
        for name, overrides in MACCAL_VARIANTS.items():
            t = time.perf_counter()
            rows.setdefault(name, []).append(
                {**scores(run_maccal_variant(saved, overrides, seed)), "seconds": time.perf_counter() - t}
            )
            logger.info(
                "seed %d %s: val ECE %.2f%% test ECE %.2f%%",
                seed,
                name,
                100 * rows[name][-1]["ece_val"],
                100 * rows[name][-1]["ece_test"],
            )
    lines = [
        f"| stage 2 variant ({loss_key}, `{regime}`) | val ECE (%) | val acc. (%) | test ECE (%) | test acc. (%) | test ECE lower than stage 1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    first = {s: r for s, r in zip(seeds, rows["stage 1"])}
    for name, rs in rows.items():
        lower = sum(r["ece_test"] < first[s]["ece_test"] for s, r in zip(seeds, rs))
        cells = [_mean_std([r[k] for r in rs], 100.0) for k in ("ece_val", "acc_val", "ece_test", "acc_test")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {lower} of {len(rs)} |")
    best = min(
        (n for n in rows if n not in ("stage 1", "stage 1 + TS fitted on the holdout split")),
        key=lambda n: np.mean([r["ece_val"] for r in rows[n]]),
    )
    text = (
        "\n".join(
            [
                "## MaC-Cal stage-2 variants on saved CIFAR-10 features (training_cifar.py --explore-maccal)",
                "",
                f"- Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} thread(s).",
                f"- Command: `{command}` on the features that `training_cifar.py --losses CE --regimes {regime} "
                "--save-features .data/features` saved (the benchmark's default settings: each model's head input on its "
                "training, held-out, validation and test images, and its linear head).",
                "- Each variant runs `maccal_stage(model, features=...)` with `MaCCalConfig(**variant)` on the stage-1 head, "
                "seeds as the stage-1 models; the choice is made on the validation split (5,000 images), the test split "
                '(10,000) is reported. "holdout" is 5,000 training images the model never saw; "train data" is the '
                "images it was trained on (the paper's choice). Percent, mean ± std (ddof 1) over seeds.",
                f"- Lowest validation ECE: **{best}** ({np.mean([r['ece_val'] for r in rows[best]]) * 100:.2f} %). "
                "`MaCCalConfig()`'s defaults (5 epochs from the trained head, lr 0.01, the adaptive rule from ρ₀ = 1, which "
                "never masks an over-confident head) are the rows so named; its docstring gives the reasoning.",
                "",
                *lines,
            ]
        )
        + "\n"
    )
    md.write_text(text)
    print(text)


# ----------------------------------------------------------------------------- FeDLaS's gate, watched


def _gate_watcher(loss):
    """A callback averaging, per epoch, r/α, the share of ψ = +1 and the mean of ψ·sign(γ) over the training steps."""
    from transformers import TrainerCallback

    class GateWatcher(TrainerCallback):
        def __init__(self):
            self.epochs, self.steps = [], []

        def on_step_end(self, args, state, control, **kwargs):
            if loss.last_weights is not None:
                psi, gamma = loss.last_psi, loss.last_nci.float()
                self.steps.append(
                    torch.stack(
                        [
                            loss.last_weights.float().mean() / loss.base,
                            (psi > 0).float().mean(),
                            (psi * torch.sign(gamma)).mean(),
                        ]
                    )
                )

        def on_epoch_end(self, args, state, control, **kwargs):
            self.epochs.append(torch.stack(self.steps).mean(0).tolist())
            self.steps = []

    return GateWatcher()


FEDLAS_DIAGNOSIS = {  # name → (loss key, FeDLaSLoss overrides, clip gradients)
    "LS": ("LS", {}, True),
    "FeDLaS-LS, official gate (descent), gradients clipped with the model's (CalibrationTrainer)": (
        "FeDLaS-LS",
        {"gate_update": "descent"},
        True,
    ),
    "FeDLaS-LS, official gate (descent), no clipping": ("FeDLaS-LS", {"gate_update": "descent"}, False),
    "FeDLaS-LS, default gate (ascent)": ("FeDLaS-LS", {}, True),
}


def diagnose_fedlas(tensors: dict, settings: Settings, seed: int, md: Path, command: str) -> None:
    """Over-confident regime, one seed: LS and FeDLaS-LS with each gate, the gate's behaviour epoch by epoch."""
    from transformers import PrinterCallback

    from hf_calibration import CalibrationTrainer
    from hf_calibration.losses import get_loss

    rows = []
    for name, (loss_key, overrides, clip) in FEDLAS_DIAGNOSIS.items():
        loss_name, kwargs, _ = LOSSES[loss_key]
        loss = get_loss(loss_name, **{**kwargs, **overrides})
        with tempfile.TemporaryDirectory() as tmp:
            args = training_args(settings, seed, tmp, False)
            if not clip:
                args.max_grad_norm = 0.0  # the official code leaves the gate unclipped (it clips the model at 2)
            trainer = CalibrationTrainer(
                model=make_model(settings, seed),
                args=args,
                train_dataset=TensorDictDataset(*tensors["train"]),
                compute_loss_func=loss,
            )
            trainer.remove_callback(PrinterCallback)
            watcher = _gate_watcher(loss) if loss_key != "LS" else None
            if watcher is not None:
                trainer.add_callback(watcher)
            trainer.train()
            logits = predict(trainer, {k: TensorDictDataset(*tensors[k]) for k in ("val", "test")})
        m = evaluate_logits(logits["test"], tensors["test"][1].numpy(), logits["val"], tensors["val"][1].numpy())
        rows.append((name, m, watcher.epochs if watcher is not None else None))
        logger.info("%s: val ECE %.2f%%, test ECE %.2f%%", name, 100 * m["val_ece"], 100 * m["ece"])
    lines = [
        "## FeDLaS's gate, watched (training_cifar.py --diagnose-fedlas)",
        "",
        f"- Command: `{command}`; the benchmark's over-confident regime and settings, seed {seed}, {torch.get_num_threads()} thread(s).",
        "- Per epoch, averaged over its training steps: r/α (the smoothing weight against the base loss's), the share "
        "of samples with ψ = +1, and the mean of ψ·sign(γ) (+1: ψ = sign(γ) everywhere, the gate adds smoothing to "
        "every sample; −1: ψ = −sign(γ), it removes smoothing from every sample). `FeDLaSLoss`'s docstring reads it.",
        "",
        "| run | val ECE (%) | test ECE (%) | mean conf. (%) | r/α, first → last epoch | ψ = +1 share | ψ·sign(γ) |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for name, m, epochs in rows:
        gate = ["", "", ""] if epochs is None else [f"{epochs[0][i]:.2f} → {epochs[-1][i]:.2f}" for i in range(3)]
        lines.append(
            f"| {name} | {100 * m['val_ece']:.2f} | {100 * m['ece']:.2f} | {100 * m['mean_confidence']:.2f} | "
            + " | ".join(gate)
            + " |"
        )
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ----------------------------------------------------------------------------- main


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--npz", default=str(ROOT.parent / "shared" / "data" / "cifar10_jpeg.npz"))
    p.add_argument("--cache", default=str(ROOT / ".data" / "cifar10"))
    p.add_argument("--out", default=str(HERE / "results" / "training_cifar.json"))
    p.add_argument("--md", default=str(HERE / "results" / "training_cifar.md"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument("--train-size", type=int, default=Settings.train_size)
    p.add_argument("--epochs", type=int, default=Settings.epochs)
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads; 0 (default): chosen by timing before each run"
    )
    p.add_argument("--report-only", action="store_true", help="rebuild the Markdown section from the JSON")
    p.add_argument(
        "--save-features", default=None, help="folder: save the CE / Mixup models' head inputs on every split"
    )
    p.add_argument("--explore-maccal", default=None, help="folder of --save-features output: compare stage-2 variants")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--host-note", default=None, help="a line on the host's load, added to the Markdown section")
    p.add_argument(
        "--diagnose-fedlas", action="store_true", help="LS and FeDLaS-LS with each gate, one seed, gate statistics"
    )
    args = p.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings(train_size=args.train_size, epochs=args.epochs)
    out, md = Path(args.out), Path(args.md)
    given = list(sys.argv[1:] if argv is None else argv)
    if args.report_only:  # the records' command: the arguments that change them (not the report's own)
        drop = {"--report-only", "--no-progress"}
        kept, skip = [], False
        for a in given:
            if skip:
                skip = False
            elif a == "--host-note":
                skip = True
            elif a not in drop and not a.startswith("--host-note="):
                kept.append(a)
        given = kept
    command = " ".join(["python benchmarks/training_cifar.py", *given])
    if args.explore_maccal is not None:
        md = md if args.md != p.get_default("md") else HERE / "results" / "training_cifar_maccal.md"
        explore_maccal(Path(args.explore_maccal), args.seeds, md, command)
        return
    if args.diagnose_fedlas:
        tensors = {
            k: (to_tensor(x), torch.from_numpy(y))
            for k, (x, y) in load_splits(Path(args.npz), Path(args.cache), settings).items()
        }
        md = md if args.md != p.get_default("md") else HERE / "results" / "training_cifar_fedlas_gate.md"
        diagnose_fedlas(tensors, settings, args.seeds[0], md, command)
        return
    if not args.report_only:
        tensors = {
            k: (to_tensor(x), torch.from_numpy(y))
            for k, (x, y) in load_splits(Path(args.npz), Path(args.cache), settings).items()
        }
        # every loss in both regimes first, then the official-gate comparison rows, in the regime of the claim
        plan = [
            (r, loss, s) for r in args.regimes for loss in args.losses if loss not in COMPARISONS for s in args.seeds
        ]
        plan += [
            ("overconfident", loss, s)
            for loss in args.losses
            if loss in COMPARISONS and "overconfident" in args.regimes
            for s in args.seeds
        ]
        features_dir = None if args.save_features is None else Path(args.save_features)
        run_all(
            plan, tensors, settings, out, progress=not args.no_progress, threads=args.threads, features_dir=features_dir
        )
    data = load_results(out, settings)
    md.write_text(markdown(data, command, args.host_note))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
