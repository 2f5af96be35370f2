"""Post-hoc calibrators: fit/apply speed against torch-uncertainty and netcal, and calibration on real logits.

Run from the repository root:  python benchmarks/calibrators.py   (writes benchmarks/results/calibrators.md)

1. Fit time on 10,000 x 1,000 synthetic logits with an ImageNet-like confidence profile and on every real file:
   ours TemperatureScaling (NLL, LBFGS) and SMARTCalibrator (Charbonnier-SoftECE, Adam, early stopping) side by
   side with torch-uncertainty's ``TemperatureScaler`` (LBFGS) and netcal's ``TemperatureScaling`` (float64
   probabilities: its float32 path silently skips the fit). Apply throughput in rows/s.
2. On every file in ../shared/data/logits: uncalibrated / TS / SMART test ECE, AdaECE, smCE (15 bins), accuracy.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "data" / "logits"
OUT = ROOT / "benchmarks" / "results" / "calibrators.md"
sys.path.insert(0, str(ROOT))

from hf_calibration.calibrators import SMARTCalibrator, TemperatureScaling  # noqa: E402
from hf_calibration.metrics.adaptive import adaece  # noqa: E402
from hf_calibration.metrics.ece import ece  # noqa: E402

try:
    from hf_calibration.metrics.smooth import smce
except ImportError:  # pragma: no cover
    smce = None

logging.getLogger("torch_uncertainty").setLevel(logging.ERROR)
logging.getLogger().setLevel(logging.ERROR)


def synthetic(n=10_000, k=1_000, seed=0):
    """ImageNet-like logits: ~70-75% top-1, over-confident (true-class boost of varying strength, sharp logits)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)).astype(np.float32) * 1.2
    z[np.arange(n), y] += rng.gamma(3.0, 2.0, n).astype(np.float32)
    return (2.0 * z).astype(np.float32), y


def timed(fn, repeat=1):
    best, out = np.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def fit_ours_ts(z, y):
    return TemperatureScaling().fit(z, y, progress_bar=False)


def fit_ours_smart(z, y):
    return SMARTCalibrator().fit(z, y, progress_bar=False)


def fit_tu(z, y):
    from torch.utils.data import DataLoader, TensorDataset
    from torch_uncertainty.post_processing import TemperatureScaler

    scaler = TemperatureScaler(device="cpu")
    scaler.fit(DataLoader(TensorDataset(torch.from_numpy(z), torch.from_numpy(y)), batch_size=len(y)), progress=False)
    return scaler


def fit_netcal(z, y):
    from netcal.scaling import TemperatureScaling as NetcalTS

    p = torch.softmax(torch.from_numpy(z).double(), 1).numpy()
    ts = NetcalTS()
    ts.fit(p, y)
    return ts


PEERS = {"ours TS (LBFGS, NLL)": fit_ours_ts, "ours SMART": fit_ours_smart, "torch-uncertainty TemperatureScaler": fit_tu, "netcal TemperatureScaling": fit_netcal}
REPEATS = {"torch-uncertainty TemperatureScaler": 1}  # best of 3 for the others; torch-uncertainty takes ~15 s a fit
TARGET_FIT_S, TARGET_ROWS_PER_S = 1.0, 1e6


def speed_section(lines):
    z, y = synthetic()
    acc = float((z.argmax(1) == y).mean())
    # warm-up (numba compilation is cached on disk, but the first call in a process loads it)
    SMARTCalibrator(max_steps=2).fit(z[:100, :20], y[:100] % 20, progress_bar=False)
    rows = [("synthetic 10,000 x 1,000", z, y)]
    for path in sorted(SHARED.glob("*.npz")) if SHARED.is_dir() else []:
        d = np.load(path)
        rows.append((path.stem, d["logits_val"], d["labels_val"]))
    lines += [
        "### Fit time (s), best of 3 runs (torch-uncertainty: one run), same process",
        "",
        f"Synthetic: top-1 {100 * acc:.1f}%, ECE {100 * ece(z, y):.2f}% uncalibrated.",
        "",
        "| data | " + " | ".join(PEERS) + " | SMART steps | SMART / tu-TS |",
        "|---" * (len(PEERS) + 3) + "|",
    ]
    smart_fit, smart_times, apply_rates = None, [], []
    for name, zz, yy in rows:
        times, steps = [], ""
        for label, fn in PEERS.items():
            try:
                t, cal = timed(lambda: fn(zz, yy), REPEATS.get(label, 3))
                times.append(t)
                if label == "ours SMART":
                    steps = f"{cal.fit_info_['steps']} (best {cal.fit_info_['best_step']})"
                    if smart_fit is None:
                        smart_fit = cal
            except Exception as err:  # a peer that fails is reported, not fatal
                print(f"{label} failed on {name}: {err}", file=sys.stderr)
                times.append(float("nan"))
        lines.append(f"| {name} | " + " | ".join(f"{t:.3f}" for t in times) + f" | {steps} | {times[1] / times[2]:.2f} |")
        print(lines[-1], flush=True)
        smart_times.append((name, times[1]))
    # apply throughput
    ts = fit_ours_ts(z, y)
    lines += ["", "### Apply throughput (rows/s, float32 logits, best of 5)", "", "| K | ours TS | ours SMART | torch-uncertainty TS | plain `z / T` |", "|---|---|---|---|---|"]
    tu = fit_tu(z, y)
    for n, k in ((10_000, 1_000), (200_000, 10)):
        zz = torch.from_numpy(z) if k == 1_000 else torch.randn(n, k) * 4
        with torch.no_grad():
            t_ts, _ = timed(lambda: ts(zz), 5)
            t_sm, _ = timed(lambda: smart_fit(zz), 5)
            t_tu, _ = timed(lambda: tu(zz), 5)
            t_div, _ = timed(lambda: zz / 2.5, 5)
        lines.append(f"| {k} | {n / t_ts:,.0f} | {n / t_sm:,.0f} | {n / t_tu:,.0f} | {n / t_div:,.0f} |")
        print(lines[-1], flush=True)
        apply_rates.append((k, n / t_ts, n / t_sm, n / t_div))
    worst = max(smart_times, key=lambda r: r[1])
    lines += [
        "",
        "Targets:",
        f"- SMART fit <= {TARGET_FIT_S:.0f} s: synthetic 10,000 x 1,000 {smart_times[0][1]:.2f} s; slowest file {worst[0]} {worst[1]:.2f} s"
        f" -> {'met' if max(t for _, t in smart_times) <= TARGET_FIT_S else 'NOT met'}",
    ] + [
        f"- apply >= 1e6 rows/s at K = {k}: TS {r_ts / 1e6:.2f}M, SMART {r_sm / 1e6:.2f}M (bare `z / T`: {r_div / 1e6:.2f}M)"
        f" -> {'met' if min(r_ts, r_sm) >= TARGET_ROWS_PER_S else 'NOT met'}"
        for k, r_ts, r_sm, r_div in apply_rates
    ]


def quality_section(lines):
    cols = ["ECE", "AdaECE"] + (["smCE"] if smce is not None else []) + ["acc"]
    lines += [
        "",
        "### Test-set calibration (%, 15 bins; fitted on the val part)",
        "",
        "| file | " + " | ".join(f"{m} {c}" for c in ("uncal", "TS", "SMART") for m in cols[:-1]) + " | accuracy | T (TS) |",
        "|---" * (3 * (len(cols) - 1) + 3) + "|",
    ]
    metrics = cols[:-1]
    losses = []  # (file, metric, SMART, TS) where SMART is worse than TS
    for path in sorted(SHARED.glob("*.npz")) if SHARED.is_dir() else []:
        d = np.load(path)
        zv, yv, zt, yt = d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]
        ts = fit_ours_ts(zv, yv)
        smart = fit_ours_smart(zv, yv)
        cells = []
        for logits in (zt, ts(torch.from_numpy(zt)).numpy(), smart(torch.from_numpy(zt)).numpy()):
            cells += [100 * ece(logits, yt), 100 * adaece(logits, yt)] + ([100 * smce(logits, yt)] if smce is not None else [])
            assert (logits.argmax(1) == zt.argmax(1)).all()
        acc = 100 * float((zt.argmax(1) == yt).mean())
        lines.append(f"| {path.stem} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {acc:.2f} | {ts.fitted_temperature:.3f} |")
        print(lines[-1], flush=True)
        m = len(metrics)
        losses += [(path.stem, name, cells[2 * m + j], cells[m + j]) for j, name in enumerate(metrics) if cells[2 * m + j] > cells[m + j]]
    if losses:
        lines += ["", "SMART worse than TS (test %, SMART vs TS): " + "; ".join(f"{f} {n} {a:.2f} vs {b:.2f}" for f, n, a, b in losses) + "."]


NOTES = """Reading the tables:

- SMART fit = one tabulation pass over the (N, K) logits (each row's log-partition function on a grid of
  temperatures, compiled, all cores) + up to 2000 full-batch Adam steps (the paper's recipe), each one fused
  O(N) step (compiled, all cores, fixed 256-row chunks so the result does not depend on the thread count;
  each chunk goes stage by stage over arrays so every loop is SIMD-vectorised, ~70 ns a row on one core).
  It grows with N and barely with K. Timings are the best of 3 on a 2-core machine that other jobs may share:
  the same code has measured up to ~1.5x slower in other runs (the machine's speed varies over the day).
- Apply: on CPU one compiled pass reads each row once (finiteness, top-2 margin, SMART's T, the division, the
  argmax guard), against a bare `z / T`, which checks nothing (nor does torch-uncertainty's scaler). Both are
  bound by memory at K = 1000, and this machine's memory throughput varies several-fold between runs (a bare
  `z / T` measured 0.65M to 3.5M rows/s): compare the columns of one run, not runs.
- Where SMART loses to TS (listed under the table): the weak LeNet-5 CIFAR-10 model (54% top-1), and AdaECE / smCE
  on DenseNet CIFAR-100 and WideResNet CIFAR-10. SMART's objective is the 15-equal-width-bin soft ECE of the fit
  set: a 49-parameter margin->T map fitted to it follows those bins more closely than one temperature does, and
  on test data it wins the hard version of that metric (ECE) on 6 of 7 files, but the equal-mass bins of AdaECE
  and the bin-free smCE show where it fitted the fit set's bins rather than the calibration curve; TS's single
  parameter generalises better there. With half or more of the predictions wrong (LeNet-5) the top-2 margin says
  little about correctness. On both ResNet-50 files and WideResNet CIFAR-100 SMART beats TS on every metric.
"""


def main():
    torch.manual_seed(0)
    lines = [
        "## Post-hoc calibrators (`benchmarks/calibrators.py`)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}. Command: `python benchmarks/calibrators.py`.",
        "",
    ]
    speed_section(lines)
    quality_section(lines)
    lines += ["", NOTES]
    text = "\n".join(lines) + "\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
