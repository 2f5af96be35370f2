"""Fitting the parametric post-hoc calibrators: speed and held-out quality side by side with torch-uncertainty,
netcal and probmetrics (SMS / SVS, by their authors), the shared real logits, and SMART's fit time under a competing
CPU-bound process.

Run from the repository root:

    python benchmarks/calibrator_fits.py                      # every section (~40-60 min on the shared 2-core box)
    python benchmarks/calibrator_fits.py --sections speed     # or any of: speed files contention
    python benchmarks/calibrator_fits.py --sections files --baseline ../main   # also time another checkout's matrix /
                                                              # Dirichlet fits on the same files, interleaved with ours
    python benchmarks/calibrator_fits.py --sections cv-target --baseline ../main  # only the 5,000 x 100 target (4.)

Writes benchmarks/results/calibrator_fits.md (then ``python benchmarks/assemble_results.py``).

1. speed: fit on 10,000 synthetic ImageNet-like logits (``calibrators.synthetic``) at K = 100 and K = 1,000, held-out
   NLL on 10,000 more from the same generator, median of ``--rounds`` rounds in which ours and the peers alternate;
   every method of ours (one warm-up fit first: numba loads its compiled
   kernels once per process) and the peers' implementations of the same model in the same process.
2. files: the shared real logits (fit on the val part, test part held out): temperature scaling, vector, matrix and
   Dirichlet scaling (ours against torch-uncertainty's), SMS and SVS (ours against probmetrics'), and ETS / PTS / CTS
   (no peer implements them); then one table of test NLL / ECE per file and method, and the matrix / Dirichlet fits
   with their cross-validation at 5,000 x 100 (the three CIFAR-100 files) against the 2 s target, wall and CPU time.
3. contention: SMART's fit on 10,000 x 1,000 logits ten times with the machine as it is, then ten times next to one
   deliberately competing CPU-bound process (a Python busy loop).
4. cv-target (its own file, benchmarks/results/calibrator_fits_cv_target.md, and not part of the default run): matrix /
   Dirichlet scaling with their cross-validation on the three CIFAR-100 files (5,000 x 100), each fit in a fresh
   process after one small warm-up fit (cross-validated too: a process's first CV fit also imports scikit-learn's
   fold splitter, ~1.5 s), ours and the ``--baseline`` checkout's alternating, ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

# the steady state: parallel kernels from the warm-up on (cold_start.py times the first calls)
os.environ.setdefault("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS", "0")
os.environ.setdefault("HF_CALIBRATION_COMPILE_SECONDS", "0")  # the kernels, not their numpy twins: the steady state

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "data" / "logits"
OUT = ROOT / "benchmarks" / "results" / "calibrator_fits.md"
OUT_CV_TARGET = ROOT / "benchmarks" / "results" / "calibrator_fits_cv_target.md"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calibrators import synthetic  # noqa: E402

from hf_calibration.calibrators import create_calibrator  # noqa: E402
from hf_calibration.metrics.ece import ece  # noqa: E402

logging.getLogger().setLevel(logging.ERROR)
for name in ("torch_uncertainty", "hf_calibration", "netcal"):
    logging.getLogger(name).setLevel(logging.ERROR)

OURS = [
    "ets",
    "vector_scaling",
    "matrix_scaling",
    "dirichlet",
    "svs",
    "sms",
    "pts",
    "cts",
    "temperature_scaling",
    "smart",
]
PEERS = {  # our kind -> (label, builder(K) -> fit(z, y) -> predict(z) -> logits or probabilities)
    "vector_scaling": ["tu VectorScaler (K weights, no bias)", "netcal LogisticCalibration (vector scaling)"],
    "matrix_scaling": ["tu MatrixScaler (unregularised)"],
    "dirichlet": ["tu DirichletScaler (unregularised)"],
    "svs": ["probmetrics SVS"],
    "sms": ["probmetrics SMS"],
    "temperature_scaling": ["tu TemperatureScaler"],
}
PEER_TARGET = {"svs": 2.0, "sms": 2.0}  # the issue: SMS / SVS fits >= 2x faster than probmetrics' (5x for the others)
TARGETS = {100: 1.0, 1000: 5.0}
FACTS: dict[str, list] = {"missed": [], "peer": [], "files": [], "odir": []}  # for the summary under the tables


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def _nll(logits_or_log_probs: torch.Tensor, labels: np.ndarray) -> float:
    return float(torch.nn.functional.cross_entropy(logits_or_log_probs.double(), torch.from_numpy(labels)))


def fit_ours(kind: str, z, y, **kw):
    start, cpu = time.perf_counter(), time.process_time()
    cal = create_calibrator(kind, **kw).fit(z, y, progress_bar=False)
    seconds = time.perf_counter() - start
    cal.bench_cpu_ = time.process_time() - cpu  # this process's CPU seconds: less sensitive to other users' load
    return seconds, cal, lambda zz: cal(torch.from_numpy(zz))


def fit_peer(label: str, z, y):
    """(seconds, predict) for a peer implementation; predict returns logits (or log-probabilities)."""
    k = z.shape[1]
    if label.startswith("tu "):
        import torch_uncertainty.post_processing as tu
        from torch.utils.data import DataLoader, TensorDataset

        cls = getattr(tu, label.split()[1])
        scaler = cls(num_classes=k) if cls is not tu.TemperatureScaler else cls()
        start = time.perf_counter()
        scaler.fit(
            DataLoader(TensorDataset(torch.from_numpy(z), torch.from_numpy(y)), batch_size=len(y)), progress=False
        )
        elapsed = time.perf_counter() - start

        def predict(zz):
            with torch.no_grad():
                return scaler(torch.from_numpy(zz))

        return elapsed, predict
    if label.startswith("probmetrics "):
        import warnings

        from probmetrics.calibrators import get_calibrator

        cal = get_calibrator(label.split()[1].lower())
        probs = torch.softmax(torch.from_numpy(z).double(), 1).numpy()  # it takes probabilities
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal.fit(probs, y)
        elapsed = time.perf_counter() - start
        return elapsed, lambda zz: torch.log(
            torch.from_numpy(cal.predict_proba(torch.softmax(torch.from_numpy(zz).double(), 1).numpy())).clamp_min(
                1e-300
            )
        )
    from netcal.scaling import LogisticCalibration

    cal = LogisticCalibration()
    start = time.perf_counter()
    cal.fit(
        torch.softmax(torch.from_numpy(z).double(), 1).numpy(), y
    )  # float64 probabilities (its float32 path skips fits)
    elapsed = time.perf_counter() - start
    return elapsed, lambda zz: torch.log(
        torch.from_numpy(cal.transform(torch.softmax(torch.from_numpy(zz).double(), 1).numpy())).clamp_min(1e-300)
    )


def _interleaved(fits: list, rounds: int) -> list[list[float]]:
    """Seconds of each fit over ``rounds`` rounds, the fits alternating within a round (so a change of the shared
    machine's load falls on all of them alike)."""
    times: list[list[float]] = [[] for _ in fits]
    for _ in range(rounds):
        for i, fit in enumerate(fits):
            times[i].append(fit())
    return times


def speed_section(lines: list[str], rounds: int, ks: tuple[int, ...] = (100, 1000)) -> None:
    lines += [
        f"### Fit time on 10,000 synthetic logits, held-out NLL on 10,000 more (same process, median of {rounds} interleaved rounds)",
        "",
        "Ours after one warm-up fit; peers as their defaults. Each row's fits alternate within a round (ours, then each",
        "peer); `ratio` = the median over rounds of peer time / ours in that round. Matrix and Dirichlet scaling (ours)",
        "include the default 5-fold cross-validation of lambda and mu unless the row says otherwise; the row after each",
        "times one fit at the lambda and mu that cross-validation chose (one fit, as the peer makes).",
        "",
        "| K | method | ours (s) | held-out NLL | peer | peer (s) | peer held-out NLL | ratio | target |",
        "|---|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for k in ks:
        z, y = synthetic(10_000, k, seed=0)
        zt, yt = synthetic(10_000, k, seed=1)
        lines.append(f"| {k} | uncalibrated | | {_nll(torch.from_numpy(zt), yt):.4f} | | | | | |")
        runs = [(kind, {}, "", True) for kind in OURS]  # (kind, arguments, note, against the peers)
        if (
            k == 1000
        ):  # the default cross-validation would repeat a ~60 s fit ~20 times: one capped fit at a fixed lambda
            for kind in ("matrix_scaling", "dirichlet"):
                runs[runs.index((kind, {}, "", True))] = (
                    kind,
                    {"reg_lambda": float(k * (k - 1)), "reg_mu": float(k), "max_iter": 60},
                    " (fixed lambda = K(K-1), mu = K, no CV, 60 LBFGS iterations at most)",
                    False,
                )
        while runs:
            kind, kw, note, with_peers = runs.pop(0)
            before = len(lines)
            if kind == "smart":
                create_calibrator(kind).fit(z[:500, :20], y[:500] % 20, progress_bar=False)
            else:
                create_calibrator(kind, **kw).fit(z[:500], y[:500], progress_bar=False)
            peers = [
                label
                for label in PEERS.get(kind, [])
                if with_peers
                and not (label.startswith("netcal") and k == 1000)
                and not (label == "probmetrics SMS" and k == 1000)
            ]
            last: dict = {}

            def ours():
                seconds, last["cal"], last["predict"] = fit_ours(kind, z, y, **kw)
                return seconds

            def peer(label):
                def run():
                    seconds, last[label] = fit_peer(label, z, y)
                    return seconds

                return run

            slow = "max_iter" in kw  # the capped K = 1,000 fits, ~20 s each: once
            try:
                times = _interleaved([ours] + [peer(label) for label in peers], 1 if slow else rounds)
            except Exception as err:  # a peer that fails is reported, not fatal
                times = _interleaved([ours], 1 if slow else rounds) + [err] * len(peers)
            seconds, cal = float(np.median(times[0])), last["cal"]
            ours_nll = _nll(last["predict"](zt), yt)
            target = 10.0 if kind == "cts" and k == 1000 else TARGETS[k]  # the issue: CTS <= 10 s at K = 1,000
            if kind in ("matrix_scaling", "dirichlet") and not kw and k == 100:
                target = (
                    2.0 * 2
                )  # the issue: <= 2 s with their cross-validation at 5,000 x 100; these fits see 10,000 rows
            verdict = f"<= {target:g} s: {'met' if seconds <= target else 'NOT met'}"
            if seconds > target:
                FACTS["missed"].append(f"{kind}{note} at K = {k}: {seconds:.2f} s")
            info = cal.fit_info_
            extra = f", {info.get('steps', info.get('sweeps'))} {'steps' if 'steps' in info else 'sweeps'}"
            if not peers:
                label, cell = (
                    (PEERS[kind][0], "not run (each step is an N x K x K product)") if kind in PEERS else ("", "")
                )
                if kind == "sms":
                    cell = "not run (its L-BFGS on K^2 = 10^6 parameters, an N x K x K product a step)"
                lines.append(
                    f"| {k} | {kind}{note}{extra} | {seconds:.2f} | {ours_nll:.4f} | {label} | {cell} | | | {verdict} |"
                )
            for label, peer_times in zip(peers, times[1:]):
                if isinstance(peer_times, Exception):
                    lines.append(
                        f"| {k} | {kind}{extra} | {seconds:.2f} | {ours_nll:.4f} | {label} | failed: {type(peer_times).__name__} | | | {verdict} |"
                    )
                    continue
                peer_s = float(np.median(peer_times))
                ratio = float(np.median([p / o for p, o in zip(peer_times, times[0])]))
                peer_nll = _nll(last[label](zt), yt)
                FACTS["peer"].append((k, kind + note, label, ratio, ours_nll, peer_nll))
                lines.append(
                    f"| {k} | {kind}{note}{extra} | {seconds:.2f} | {ours_nll:.4f} | {label} | {peer_s:.2f} | {peer_nll:.4f} | "
                    f"{ratio:.1f} | {verdict} |"
                )
            if (
                kind in ("matrix_scaling", "dirichlet") and not kw
            ):  # then one fit at the chosen lambda, against the same peer
                chosen = {"reg_lambda": info["reg_lambda"], "reg_mu": info["reg_mu"]}
                runs.insert(
                    0,
                    (
                        kind,
                        chosen,
                        f" (one fit at the chosen lambda = {chosen['reg_lambda']:g}, mu = {chosen['reg_mu']:g}, no CV)",
                        True,
                    ),
                )
            print("\n".join(lines[before:]), flush=True)


BASELINE_FIT = """
import json, sys, time
import numpy as np
from hf_calibration.calibrators import create_calibrator
import torch
d = np.load(sys.argv[1])
kind = sys.argv[2]
# warm-up: the default fit (its cross-validation too) on 300 x 10, so the timed fit pays neither numba's kernel loading
# nor the one-time import of scikit-learn's fold splitter (~1.5 s here)
create_calibrator(kind).fit(d["logits_val"][:300, :10], d["labels_val"][:300] % 10, progress_bar=False)
start, cpu = time.perf_counter(), time.process_time()
cal = create_calibrator(kind).fit(d["logits_val"], d["labels_val"], progress_bar=False)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
with torch.no_grad():
    out = cal(torch.from_numpy(d["logits_test"])).double()
nll = float(torch.nn.functional.cross_entropy(out, torch.from_numpy(d["labels_test"])))
import hf_calibration
print(json.dumps({"seconds": seconds, "cpu": cpu, "nll": nll, "package": hf_calibration.__file__}))
"""


def fit_baseline(checkout: Path, path: Path, kind: str) -> dict:
    """Time another checkout's ``kind`` fit on one shared file, in its own process (after one small warm-up fit)."""
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve()), "HF_HUB_OFFLINE": "1"}
    # run from inside the checkout: `python -c` puts the working directory first on sys.path
    done = subprocess.run(
        [sys.executable, "-c", BASELINE_FIT, str(path.resolve()), kind],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=checkout,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"The baseline run imported {result['package']}, not the checkout {checkout}.")
    return result


FILE_METHODS = (
    "temperature_scaling",
    "vector_scaling",
    "matrix_scaling",
    "dirichlet",
    "svs",
    "sms",
    "ets",
    "pts",
    "cts",
)
FILE_PEERS = {
    "vector_scaling": "tu VectorScaler",
    "matrix_scaling": "tu MatrixScaler",
    "dirichlet": "tu DirichletScaler",
    "svs": "probmetrics SVS",
    "sms": "probmetrics SMS",
}
PIVOT = (
    "uncalibrated",
    "temperature_scaling",
    "matrix_scaling",
    "dirichlet",
    "vector_scaling",
    "sms",
    "svs",
    "probmetrics SMS",
    "probmetrics SVS",
)


def files_section(lines: list[str], baseline: Path | None = None) -> None:
    files = sorted(SHARED.glob("*.npz")) if SHARED.is_dir() else []
    if not files:
        lines += ["### Shared real logits", "", "Skipped: ../shared/data/logits is absent.", ""]
        return
    lines += [
        "",
        "### Shared real logits: fit on val, test-set NLL / accuracy (%) / ECE (%, 15 bins), fit seconds (wall; CPU)",
        "",
        "Peers: torch-uncertainty 0.13 (`tu`) for vector / matrix / Dirichlet scaling, probmetrics 1.3 (the SMS / SVS "
        "authors' package, fitted on the softmax probabilities as it expects) for SMS / SVS. Ours fitted first, the peer "
        "right after, on the same arrays.",
        "",
        "| file | method | ours NLL | ours acc | ours ECE | ours (s; CPU) | peer NLL | peer acc | peer ECE | peer (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pivot: dict[str, dict[str, tuple[float, float]]] = {}
    for path in files:
        d = np.load(path)
        zv, yv, zt, yt = d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]
        base = torch.from_numpy(zt)
        cells = pivot.setdefault(path.stem, {})
        cells["uncalibrated"] = (_nll(base, yt), ece(zt, yt))
        lines.append(
            f"| {path.stem} | uncalibrated | {_nll(base, yt):.4f} | {100 * (zt.argmax(1) == yt).mean():.2f} | "
            f"{100 * ece(zt, yt):.2f} | | | | | |"
        )
        for kind in FILE_METHODS:
            seconds, cal, predict = fit_ours(kind, zv, yv)
            out = predict(zt)
            nll, err = _nll(out, yt), ece(out.numpy(), yt)
            cells[kind] = (nll, err)
            row = (
                f"| {path.stem} | {kind} | {nll:.4f} | {100 * (out.argmax(1).numpy() == yt).mean():.2f} | "
                f"{100 * err:.2f} | {seconds:.2f}; {cal.bench_cpu_:.2f} |"
            )
            if kind in ("matrix_scaling", "dirichlet"):
                info = cal.fit_info_
                FACTS["odir"].append(
                    (
                        path.stem,
                        kind,
                        zv.shape,
                        seconds,
                        cal.bench_cpu_,
                        nll,
                        info["reg_lambda"],
                        info["reg_mu"],
                        info["cv_nll"],
                        info["cv_nll_temperature_scaling"],
                        len(info["cv"]),
                    )
                )
                if baseline is not None:
                    FACTS.setdefault("baseline", []).append(
                        (path.stem, kind, seconds, cal.bench_cpu_, nll, fit_baseline(baseline, path, kind))
                    )
            if kind in FILE_PEERS:
                peer_s, peer_predict = fit_peer(FILE_PEERS[kind], zv, yv)
                po = peer_predict(zt)
                peer_nll, peer_ece = _nll(po, yt), ece(po.numpy(), yt)
                if kind in ("svs", "sms"):
                    cells[FILE_PEERS[kind]] = (peer_nll, peer_ece)
                FACTS["files"].append(
                    (
                        path.stem,
                        kind,
                        nll,
                        peer_nll,
                        (out.argmax(1).numpy() == yt).mean(),
                        (po.argmax(1).numpy() == yt).mean(),
                        err,
                        peer_ece,
                    )
                )
                row += f" {peer_nll:.4f} | {100 * (po.argmax(1).numpy() == yt).mean():.2f} | {100 * peer_ece:.2f} | {peer_s:.2f} |"
            else:
                row += " | | | |"
            lines.append(row)
            print(row, flush=True)
    lines += [
        "",
        "### The same runs, one row per file: test NLL (ECE %, 15 bins)",
        "",
        "| file | " + " | ".join(PIVOT) + " |",
        "|---|" + "---:|" * len(PIVOT),
    ]
    for stem, cells in pivot.items():
        lines.append(f"| {stem} | " + " | ".join(f"{cells[m][0]:.4f} ({100 * cells[m][1]:.2f})" for m in PIVOT) + " |")
    lines += _odir_lines()


def _odir_lines() -> list[str]:
    """Matrix / Dirichlet scaling with their cross-validation: the guards (below uncalibrated, within 0.02 of temperature
    scaling), the chosen weights inside the grid, and the 5,000 x 100 time target."""
    out = [
        "",
        "### Matrix / Dirichlet scaling with their cross-validation (the rows above)",
        "",
        "| file | method | N x K | fit (s) | CPU (s) | candidates | lambda / K(K-1) | mu / K | CV NLL | TS CV NLL | test NLL |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stem, kind, shape, seconds, cpu, nll, lam, mu, cv, ts_cv, candidates in FACTS["odir"]:
        k = shape[1]
        out.append(
            f"| {stem} | {kind} | {shape[0]:,} x {k} | {seconds:.2f} | {cpu:.2f} | {candidates} | {lam / (k * (k - 1)):g} | "
            f"{mu / k:g} | {cv:.4f} | {ts_cv:.4f} | {nll:.4f} |"
        )
    for i, (stem, kind, seconds, cpu, nll, before) in enumerate(FACTS.get("baseline", [])):
        if i == 0:
            out += [
                "",
                "The same fits by the `--baseline` checkout, each in its own process right after ours:",
                "",
                "| baseline: file | method | ours (s; CPU) | baseline (s; CPU) | wall ratio | ours test NLL | baseline test NLL |",
                "|---|---|---:|---:|---:|---:|---:|",
            ]
        out.append(
            f"| {stem} | {kind} | {seconds:.2f}; {cpu:.2f} | {before['seconds']:.2f}; {before['cpu']:.2f} | "
            f"{before['seconds'] / seconds:.1f} | {nll:.4f} | {before['nll']:.4f} |"
        )
    return out


CV_TARGET_FILES = ("netcal_densenet-bc-100-cifar-100", "netcal_lenet-5-cifar-100", "netcal_wideresnet-16-4-cifar-100")


def cv_target_section(rounds: int, baseline: Path | None) -> None:
    """The issue's target for matrix / Dirichlet scaling with their cross-validation: <= 2 s at 5,000 x 100. Every fit
    runs in its own process through the same harness (``fit_baseline``), so ours and the baseline's are timed alike."""
    checkouts = [("ours", ROOT)] + ([("baseline", baseline)] if baseline is not None else [])
    times: dict[tuple[str, str, str], list[dict]] = {}
    start_load = _load()
    for _ in range(rounds):
        for stem in CV_TARGET_FILES:
            for kind in ("matrix_scaling", "dirichlet"):
                for name, checkout in checkouts:
                    times.setdefault((stem, kind, name), []).append(
                        fit_baseline(checkout, SHARED / f"{stem}.npz", kind)
                    )
    lines = [
        "### Matrix / Dirichlet scaling with their cross-validation at 5,000 x 100: the <= 2 s target",
        "",
        f"Command: `python benchmarks/calibrator_fits.py --sections cv-target --rounds {rounds}"
        + (" --baseline <a checkout of the previous main>" if baseline is not None else "")
        + f"`. Machine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores; load average at start {start_load}, at the end {_load()}. Each fit in a fresh process after one "
        "warm-up fit at 300 x 10 (with its cross-validation: it loads the kernels and imports scikit-learn's fold splitter, ~1.5 s once per process), then the default fit (Kull et al.'s lambda / mu grid, 5 folds) on the file's 5,000 validation "
        f"logits; median (and worst) of {rounds} rounds, ours and the baseline alternating.",
        "",
        "| file | method | ours wall (s) | ours CPU (s) | test NLL | baseline wall (s) | baseline CPU (s) | baseline test NLL | wall ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ours_medians = []
    for stem in CV_TARGET_FILES:
        for kind in ("matrix_scaling", "dirichlet"):
            ours = times[(stem, kind, "ours")]
            wall, cpu = float(np.median([r["seconds"] for r in ours])), float(np.median([r["cpu"] for r in ours]))
            ours_medians.append(wall)
            row = f"| {stem} | {kind} | {wall:.2f} ({max(r['seconds'] for r in ours):.2f}) | {cpu:.2f} | {ours[0]['nll']:.4f} |"
            if baseline is not None:
                base = times[(stem, kind, "baseline")]
                b_wall = float(np.median([r["seconds"] for r in base]))
                row += (
                    f" {b_wall:.2f} ({max(r['seconds'] for r in base):.2f}) | {np.median([r['cpu'] for r in base]):.2f} | "
                    f"{base[0]['nll']:.4f} | {b_wall / wall:.2f} |"
                )
            else:
                row += " | | | |"
            lines.append(row)
    lines += [
        "",
        f"Median wall time {min(ours_medians):.2f}-{max(ours_medians):.2f} s: the <= 2 s target "
        f"{'met' if max(ours_medians) <= 2.0 else 'NOT met'} on this run's host load.",
    ]
    OUT_CV_TARGET.parent.mkdir(parents=True, exist_ok=True)
    OUT_CV_TARGET.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _smart_times(z, y, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        create_calibrator("smart").fit(z, y, progress_bar=False)
        times.append(time.perf_counter() - start)
    return times


def contention_section(lines: list[str]) -> None:
    z, y = synthetic(10_000, 1000, seed=0)
    create_calibrator("smart", max_steps=2).fit(z[:200, :20], y[:200] % 20, progress_bar=False)
    alone_load = _load()
    alone = _smart_times(z, y, 10)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(2.0)
        busy_load = _load()
        contended = _smart_times(z, y, 10)
    finally:
        busy.kill()
        busy.wait()

    def row(name, times, load):
        return (
            f"| {name} | {load} | {np.median(times):.2f} | {max(times):.2f} | "
            + ", ".join(f"{t:.2f}" for t in times)
            + " |"
        )

    lines += [
        "",
        "### SMART fit, 10,000 x 1,000 logits, ten fits each (seconds)",
        "",
        "| condition | load average at start | median | worst | every fit |",
        "|---|---|---:|---:|---|",
        row("the shared machine as it is", alone, alone_load),
        row("plus one competing CPU-bound process", contended, busy_load),
        "",
        f"Targets with the competing process: median <= 1.5 s ({'met' if np.median(contended) <= 1.5 else 'NOT met'}), "
        f"worst <= 3 s ({'met' if max(contended) <= 3.0 else 'NOT met'}).",
    ]
    print("\n".join(lines[-5:]), flush=True)


def summary() -> list[str]:
    """What the tables say against the targets, computed from this run's rows."""
    out = ["", "### Summary of this run", ""]
    if FACTS["missed"]:
        out.append("- Fit-time targets missed: " + "; ".join(FACTS["missed"]) + ".")
    for k, kind, label, ratio, ours, peer in FACTS["peer"]:
        nll = "equal" if abs(ours - peer) < 5e-5 else ("better" if ours < peer else "worse")
        want = PEER_TARGET.get(kind.split(" ")[0], 5.0)
        out.append(
            f"- K = {k}, {kind} vs {label}: {ratio:.1f}x faster (target >= {want:g}x: {'met' if ratio >= want else 'NOT met'}), "
            f"held-out NLL {nll} ({ours:.4f} vs {peer:.4f})."
        )
    if FACTS["files"]:
        for peer, kinds in (
            ("torch-uncertainty", ("vector_scaling", "matrix_scaling", "dirichlet")),
            ("probmetrics", ("svs", "sms")),
        ):
            rows = [r for r in FACTS["files"] if r[1] in kinds]
            for what, i in (("NLL", (2, 3)), ("ECE", (6, 7))):
                wins = sum(r[i[0]] <= r[i[1]] for r in rows)
                out.append(
                    f"- Shared files, ours vs {peer} ({' / '.join(kinds)}): test {what} lower or equal in {wins} of {len(rows)}"
                    + (f" (within 1e-4: {sum(r[2] <= r[3] + 1e-4 for r in rows)})" if what == "NLL" else "")
                    + "."
                )
        rows = FACTS["files"]
        wins = sum(r[4] >= r[5] for r in rows)
        worst = min(rows, key=lambda r: r[4] - r[5])
        out.append(
            f"- Test accuracy higher or equal in {wins} of {len(rows)}; largest drop {100 * (worst[5] - worst[4]):.2f} points "
            f"({worst[1]}, {worst[0]}); largest gain {100 * max(r[4] - r[5] for r in rows):.2f} points."
        )
    if FACTS["odir"]:
        rows = FACTS["odir"]
        at_100 = [r for r in rows if r[2] == (5000, 100)]
        if at_100:
            out.append(
                f"- Matrix / Dirichlet scaling with their cross-validation at 5,000 x 100 (the three CIFAR-100 files): "
                f"{min(r[3] for r in at_100):.2f}-{max(r[3] for r in at_100):.2f} s wall, {min(r[4] for r in at_100):.2f}-"
                f"{max(r[4] for r in at_100):.2f} s CPU (target <= 2 s: {'met' if max(r[3] for r in at_100) <= 2 else 'NOT met'} on wall time)."
            )
        warned = [f"{r[1]} on {r[0]}" for r in rows if r[8] > r[9]]
        out.append(
            f"- Cross-validated NLL above temperature scaling's (a warning): {', '.join(warned) if warned else 'none'}."
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sections", default="speed,files,contention", help="any of speed, files, contention; or cv-target alone"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per speed row (median reported)")
    parser.add_argument("--ks", default="100,1000", help="numbers of classes for the speed section")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout whose matrix / Dirichlet fits the files section also times",
    )
    args = parser.parse_args()
    sections = args.sections.split(",")
    if sections == ["cv-target"]:
        cv_target_section(args.rounds, args.baseline)
        return
    import numba

    versions = f"torch {torch.__version__}, numba {numba.__version__}, numpy {np.__version__}"
    from importlib.metadata import PackageNotFoundError, version

    for package in ("torch-uncertainty", "netcal", "probmetrics"):
        try:
            versions += f", {package} {version(package)}"
        except PackageNotFoundError:  # a missing peer only loses its columns
            versions += f", {package} not installed"
    lines = [
        "## Calibrator fits: ETS, vector / matrix / Dirichlet scaling, SMS / SVS, PTS, CTS (`benchmarks/calibrator_fits.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other users' jobs, torch threads "
        f"{torch.get_num_threads()}, Python {platform.python_version()}; {versions}. Load average at start: {_load()}.",
        f"Command: `python benchmarks/calibrator_fits.py --sections {args.sections} --rounds {args.rounds} --ks {args.ks}"
        + (" --baseline <a checkout of main>" if args.baseline else "")
        + "`. Times are wall-clock on this shared "
        "machine, so compare them within a table (side by side in one run), not across runs.",
        "",
    ]
    if "speed" in sections:
        speed_section(lines, args.rounds, tuple(int(k) for k in args.ks.split(",")))
    if "files" in sections:
        files_section(lines, args.baseline)
    if "contention" in sections:
        contention_section(lines)
    lines += summary()
    lines += ["", f"Load average at the end: {_load()}."]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
