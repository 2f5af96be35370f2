"""How often the 95 % intervals cover the true value, on synthetic data with a known calibration map.

Run from the repository root (about 10-20 minutes on 2 busy CPU cores):

    python benchmarks/bootstrap_coverage.py              # 500 draws of N = 2,000 per map
    python benchmarks/bootstrap_coverage.py --draws 100  # quicker, noisier

Rows ``[p, (1-p)/2, (1-p)/2]`` with ``p ~ U(1/3, 1)`` (K = 3), right with probability ``f(p)``, else one of the two
other classes. Four maps: over-confident ``f(p) = 0.7 p`` (the gap ``p - f(p) = 0.3 p`` is at least 0.1,
about 2.5 times a bin's noise at N = 2,000: the common case of a deep network), mildly over-confident
``f(p) = 0.75 p + 0.05`` (the gap falls to 0.033 at p = 1/3, about a bin's noise), crossing
``f(p) = 0.3 + 0.5 p`` (under-confident below 0.6, over-confident above: some bins hold almost no gap),
calibrated ``f(p) = p``. The true values are integrals
of the known map (scipy's quad): ECE with the 15 equal-width bins, AdaECE and the debiased estimator's
target with the population's 15 equal-mass bins, smCE by the exact LP on a 200,001-point quadrature grid,
Brier and NLL. Each draw computes every metric's 95 % percentile interval (1,000 resamples; smCE 200) and
counts whether it holds the true value. Writes benchmarks/results/bootstrap_coverage.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from scipy import integrate

RESULTS = Path(__file__).resolve().parent / "results" / "bootstrap_coverage.md"
LO = 1.0 / 3.0
MAPS = {
    "over-confident, f(p) = 0.7 p": lambda p: 0.7 * p,
    "mildly over-confident, f(p) = 0.75 p + 0.05": lambda p: 0.75 * p + 0.05,
    "crossing, f(p) = 0.3 + 0.5 p": lambda p: 0.3 + 0.5 * p,
    "calibrated, f(p) = p": lambda p: p,
}
METRICS = ("ece", "adaece", "smce", "debiased_ece (L2)", "debiased_ece (L1)", "brier", "nll")


def _density(p):
    return 1.0 / (1.0 - LO)


def truth(f) -> dict[str, float]:
    from hf_calibration.metrics.smooth import _smce_sum

    def gap_mass(a, b):  # ∫_a^b (p - f(p)) density dp
        return integrate.quad(lambda p: (p - f(p)) * _density(p), a, b)[0]

    width = np.linspace(0.0, 1.0, 16)
    ece = sum(abs(gap_mass(max(a, LO), b)) for a, b in zip(width[:-1], width[1:]) if b > LO)
    mass = np.linspace(LO, 1.0, 16)  # the population's equal-mass edges (p is uniform)
    gaps = np.array([gap_mass(a, b) for a, b in zip(mass[:-1], mass[1:])])  # each bin holds 1/15 of the mass
    grid = np.linspace(LO, 1.0, 200_001)
    smce = _smce_sum(grid, (f(grid) - grid) * _density(grid) * (grid[1] - grid[0]))
    other = lambda p: (1 - p) / 2  # noqa: E731
    brier_row = lambda p: f(p) * ((1 - p) ** 2 + 2 * other(p) ** 2) + (1 - f(p)) * (p**2 + (1 - other(p)) ** 2 + other(p) ** 2)  # noqa: E731
    nll_row = lambda p: -(f(p) * np.log(p) + (1 - f(p)) * np.log(other(p)))  # noqa: E731
    return {
        "ece": ece, "adaece": float(np.abs(gaps).sum()), "smce": smce,
        # sqrt(sum_b w_b mean_gap_b^2) with w_b = 1/15 and mean_gap_b = 15 * gaps[b]
        "debiased_ece (L2)": float(np.sqrt(15 * np.sum(gaps**2))),
        "debiased_ece (L1)": float(np.abs(gaps).sum()),
        "brier": integrate.quad(lambda p: brier_row(p) * _density(p), LO, 1)[0],
        "nll": integrate.quad(lambda p: nll_row(p) * _density(p), LO, 1)[0],
    }


def draw(rng, n: int, f):
    p = rng.uniform(LO, 1.0, n)
    probs = np.stack([p, (1 - p) / 2, (1 - p) / 2], axis=1)
    return probs, np.where(rng.random(n) < f(p), 0, rng.integers(1, 3, n))


def intervals(probs, labels, seed: int) -> dict:
    from hf_calibration import metrics

    kw = dict(ci=0.95, seed=seed, from_logits=False)
    return {
        "ece": metrics.ece(probs, labels, **kw), "adaece": metrics.adaece(probs, labels, **kw),
        "smce": metrics.smce(probs, labels, **kw),
        "debiased_ece (L2)": metrics.debiased_ece(probs, labels, **kw),
        "debiased_ece (L1)": metrics.debiased_ece(probs, labels, p=1, **kw),
        "brier": metrics.brier(probs, labels, **kw), "nll": metrics.nll(probs, labels, **kw),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    load = os.getloadavg()
    rows = []
    start = time.perf_counter()
    for name, f in MAPS.items():
        true = truth(f)
        hits = dict.fromkeys(METRICS, 0)
        width = dict.fromkeys(METRICS, 0.0)
        rng = np.random.default_rng(0)
        for d in range(args.draws):
            probs, labels = draw(rng, args.n, f)
            for metric, value in intervals(probs, labels, d).items():
                hits[metric] += value.low <= true[metric] <= value.high
                width[metric] += (value.high - value.low) / args.draws
        for metric in METRICS:
            rows.append((name, metric, true[metric], 100 * hits[metric] / args.draws, width[metric]))
        print(name, {m: f"{100 * hits[m] / args.draws:.1f} %" for m in METRICS}, flush=True)
    se = 100 * np.sqrt(0.95 * 0.05 / args.draws)
    lines = [
        "## Bootstrap coverage (`benchmarks/bootstrap_coverage.py`)",
        "",
        f"- command: `python benchmarks/bootstrap_coverage.py{'' if args.draws == 500 else f' --draws {args.draws}'}`; "
        f"{args.draws} draws of N = {args.n:,} per map, a 95 % percentile interval each (1,000 resamples, smCE 200); "
        f"{time.perf_counter() - start:.0f} s, load average at start {load[0]:.1f}",
        f"- a correct 95 % interval covers 95 % of the time, ± {se:.1f} points (one standard error over {args.draws} draws)",
        "",
        "| calibration map | metric | true value | coverage (%) | mean width |",
        "|---|---|---:|---:|---:|",
    ] + [f"| {name} | {metric} | {value:.4f} | {cover:.1f} | {w:.4f} |" for name, metric, value, cover, w in rows] + [
        "",
        "Where the model is clearly miscalibrated in every bin (the first map; deep networks usually are) every "
        "interval covers at its level. Where the gap is about a bin's noise in some bins (the second map), near zero "
        "in some (the crossing map) or everywhere "
        "(the calibrated map), the binned and smooth plug-in estimates are biased upwards by the noise of each bin, "
        "and so are their resamples: the interval sits above the truth, and a calibrated model's ECE interval never "
        "holds 0. The debiased estimator removes that bias for the L2 error; its interval is the one to read when the "
        "question is \"is this model calibrated at all\".",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
