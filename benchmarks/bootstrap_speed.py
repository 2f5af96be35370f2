"""Speed of the bootstrap intervals (``ci=``) against a naive numpy bootstrap and scipy.stats.bootstrap.

Run from the repository root (about 5-10 minutes on 2 busy CPU cores):

    python benchmarks/bootstrap_speed.py            # N = 1e5, K = 10, B = 1000
    python benchmarks/bootstrap_speed.py --quick    # N = 2e4, fewer rounds

Every peer starts from the same top-label (confidence, correct) pairs (per-row Brier / NLL terms for those
two; the float32 logits for classwise ECE and the whole report) and draws B resamples of the N rows:

* ours: ``hf_calibration.metrics.<metric>(..., ci=0.95, n_boot=B)`` minus the same call without ``ci`` (the
  interval's own cost), rows resampled as multinomial counts through compiled weighted forms;
* naive numpy: ``idx = rng.integers(0, N, N)`` per resample, then the metric's own float64 computation on the
  resampled arrays (``_ece_compute``, ``_adaece_compute``, ``smce_from_confidence``, ...): what a user writes;
* scipy.stats.bootstrap (paired, percentile, vectorized where the metric vectorises: ECE, Brier / NLL, in
  batches of 50 resamples), and for smECE the way relplot's band calls it (``relplot.smECE`` per resample).

The slow peers run fewer resamples (``--peer-boot``) and their time is scaled to B (cost is linear in B).
Rounds are interleaved; the table gives the median of the rounds and the ratio peer / ours. Writes
benchmarks/results/bootstrap_speed.md and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "bootstrap_speed.md"


def _data(n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = (1.6 * rng.standard_normal((n, k)) + 2.2 * np.eye(k)[labels]).astype(np.float32) * 1.4
    return logits, labels


def _ours(metric: str, z, y, n_boot: int):
    from hf_calibration import metrics

    f = getattr(metrics, metric)
    return lambda: f(z, y, ci=0.95, n_boot=n_boot), lambda: f(z, y)


def _naive(metric: str, z, y, n_boot: int):
    """A per-resample loop over index arrays, the metric's own float64 code on each resample."""
    from hf_calibration.metrics._format import prepare, top_label
    from hf_calibration.metrics.adaptive import _adaece_compute
    from hf_calibration.metrics.ece import _classwise_ece_compute, _classwise_ece_update, _ece_compute
    from hf_calibration.metrics.scores import _row_scores
    from hf_calibration.metrics.smooth import smce_from_confidence, smece_from_confidence

    inputs = prepare(z, y)
    top = top_label(inputs)
    conf, correct = top.confidence, top.correct
    rows = _row_scores(inputs) if metric in ("brier", "nll") else None
    probs = None
    if metric == "classwise_ece":
        e = np.exp(z.astype(np.float64) - z.max(1, keepdims=True))
        probs = e / e.sum(1, keepdims=True)
    statistic = {
        "ece": lambda i: _ece_compute(conf[i], correct[i], 15),
        "adaece": lambda i: _adaece_compute(conf[i], correct[i], 15),
        "smce": lambda i: smce_from_confidence(conf[i], correct[i]),
        "smece": lambda i: smece_from_confidence(conf[i], correct[i]),
        "brier": lambda i: rows[i, 0].mean(),
        "nll": lambda i: rows[i, 1].mean(),
        "classwise_ece": lambda i: _classwise_ece_compute(_classwise_ece_update(probs[i], y[i], 15), len(i)),
    }[metric]

    def run():
        rng = np.random.default_rng(0)
        n = conf.shape[0]
        values = np.array([statistic(rng.integers(0, n, n)) for _ in range(n_boot)])
        return np.quantile(values, [0.025, 0.975])

    return run


def _scipy(metric: str, z, y, n_boot: int):
    from scipy import stats

    from hf_calibration.metrics._format import prepare, top_label
    from hf_calibration.metrics.scores import _row_scores

    inputs = prepare(z, y)
    top = top_label(inputs)
    conf, correct = top.confidence, top.correct
    if metric == "ece":
        def statistic(c, a, axis=-1):  # vectorised over the batch of resamples: one bincount per batch
            c, a = np.atleast_2d(c), np.atleast_2d(a)
            b = np.searchsorted(np.linspace(0, 1, 16)[1:-1], c, side="left")
            key = (np.arange(c.shape[0])[:, None] * 15 + b).ravel()
            gap = np.bincount(key, (c - a).ravel(), minlength=c.shape[0] * 15).reshape(c.shape[0], 15)
            return np.abs(gap).sum(axis=1) / c.shape[1]
        data, vectorized = (conf, correct), True
    elif metric in ("brier", "nll"):
        rows = _row_scores(inputs)[:, 0 if metric == "brier" else 1]
        data, vectorized = (rows,), True
        statistic = lambda x, axis=-1: x.mean(axis=axis)  # noqa: E731
    elif metric == "smece":  # as relplot's rel_diagram does for its CE interval (there with 100 resamples)
        import relplot

        data, vectorized = (conf, correct), False
        statistic = lambda c, a: relplot.smECE(c, a)  # noqa: E731
    else:
        return None

    def run():
        return stats.bootstrap(data, statistic, paired=True, vectorized=vectorized, n_resamples=n_boot, batch=50,
                               method="percentile", confidence_level=0.95, rng=np.random.default_rng(0)).confidence_interval

    return run


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2e4 and 2 rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--peer-boot", type=int, default=100, help="resamples the slow peers run (time scaled to --n-boot)")
    args = parser.parse_args()
    n, k = (20_000, 10) if args.quick else (100_000, 10)
    rounds = 2 if args.quick else args.rounds
    z, y = _data(n, k)
    load = os.getloadavg()

    from hf_calibration.metrics import calibration_report, debiased_ece

    # warm up the compiled kernels (their first call compiles or loads the on-disk cache)
    calibration_report(z[:2000], y[:2000], ci=0.95, n_boot=20)
    debiased_ece(z[:2000], y[:2000], ci=0.95, n_boot=20)

    metrics = ["ece", "adaece", "smce", "smece", "brier", "nll", "classwise_ece"]
    timings: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for metric in metrics:
            with_ci, without = _ours(metric, z, y, args.n_boot)
            timings.setdefault((metric, "hf_calibration (ci=0.95)"), []).append(max(_time(with_ci) - _time(without), 1e-9))
            naive_boot = args.n_boot if metric in ("ece", "brier", "nll") else args.peer_boot
            timings.setdefault((metric, "naive numpy loop"), []).append(_time(_naive(metric, z, y, naive_boot)) * args.n_boot / naive_boot)
            peer = _scipy(metric, z, y, args.n_boot if metric != "smece" else args.peer_boot)
            if peer is not None:
                scale = args.n_boot / (args.n_boot if metric != "smece" else args.peer_boot)
                timings.setdefault((metric, "scipy.stats.bootstrap" + (" + relplot.smECE" if metric == "smece" else "")), []).append(_time(peer) * scale)
        timings.setdefault(("calibration_report (all 11)", "hf_calibration (ci=0.95)"), []).append(
            _time(lambda: calibration_report(z, y, ci=0.95, n_boot=args.n_boot)) - _time(lambda: calibration_report(z, y)))
        timings.setdefault(("calibration_report (all 11, smCE/smECE 200)", "hf_calibration (ci=0.95)"), []).append(
            _time(lambda: calibration_report(z, y, ci=0.95)) - _time(lambda: calibration_report(z, y)))
        timings.setdefault(("debiased_ece", "hf_calibration (ci=0.95)"), []).append(
            _time(lambda: debiased_ece(z, y, ci=0.95, n_boot=args.n_boot)) - _time(lambda: debiased_ece(z, y)))

    lines = [
        "## Bootstrap intervals (`benchmarks/bootstrap_speed.py`)",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores; load average at start "
        f"{load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}, at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
        "(the host is shared: absolute times move with it, the ratios much less)",
        f"- command: `python benchmarks/bootstrap_speed.py{' --quick' if args.quick else ''}`",
        f"- N = {n:,} rows, K = {k}, B = {args.n_boot} resamples, 95 % percentile intervals; median of {rounds} interleaved "
        f"rounds. Ours: the call with `ci` minus the same call without. Slow peers ran {args.peer_boot} resamples, "
        f"scaled to {args.n_boot}. `ratio` = peer / ours.",
        "",
        "| metric | implementation | time for B resamples (s) | ratio |",
        "|---|---|---:|---:|",
    ]
    for metric in metrics + ["calibration_report (all 11)", "calibration_report (all 11, smCE/smECE 200)", "debiased_ece"]:
        ours = np.median(timings[(metric, "hf_calibration (ci=0.95)")])
        for (m, who), values in timings.items():
            if m == metric:
                t = float(np.median(values))
                lines.append(f"| {metric} | {who} | {t:.3f} | {'' if who.startswith('hf_') else f'{t / ours:.1f}'} |")
    ours = {m: float(np.median(timings[(m, "hf_calibration (ci=0.95)")])) for m in metrics + ["debiased_ece"]}
    within = [m for m, t in ours.items() if t <= 2.0]
    over = [f"{m} ({t:.2f} s)" for m, t in ours.items() if t > 2.0]
    lines += [
        "",
        f"Within the budget (<= 2 s for N = 1e5, B = 1000 on this host, as loaded as it was): {', '.join(within)}."
        + (f" Over it: {', '.join(over)}." if over else "")
        + " smCE (one O(N) sweep a resample) and smECE (a bandwidth search of ~11 kernel smoothings a resample, all "
        "resamples of a block smoothed together) cost more per resample, so their default is 200 resamples "
        "(`n_boot=None`); classwise ECE costs O(N·K) a resample. The report's lines are every metric's interval "
        "from one set of resamples.",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
