"""Speed of the bootstrap intervals (``ci=``): the whole report at the size the issue names, and each metric against
a naive numpy bootstrap and scipy.stats.bootstrap.

Run from the repository root (a few minutes on 2 idle CPU cores; run it alone, nothing else heavy on the host):

    python benchmarks/bootstrap_speed.py                                  # both sections
    python benchmarks/bootstrap_speed.py --sections report                # only the report at N = 1e5, K = 10 / 100 / 1000
    python benchmarks/bootstrap_speed.py --sections report --baseline ../old-checkout --baseline-k 10 100

**report** (the target: ``calibration_report(z, y, ci=0.95)`` at N = 1e5, K = 1000 float32 logits within 5 s on this
machine when idle, the first call in the process included): each measurement runs in a fresh Python process, after one
warm-up process has compiled the kernels into numba's on-disk cache (warm, as a user's second session is). The child
imports the package (timed apart), makes the logits, then times its *first* ``calibration_report(..., ci=0.95)`` (1,000
resamples; smCE, smECE and classwise ECE 200), then the report without ``ci``, then the call with ``ci`` again (now warm
in the process). ``--baseline`` times another checkout's package through the same harness, alternating with ours.

**metrics** (N = 1e5, K = 10, B = 1000): ours is ``<metric>(..., ci=0.95, n_boot=B)`` minus the same call without ``ci``;
the naive peer draws ``rng.integers(0, N, N)`` per resample and runs the metric's own float64 code on the resampled
arrays; scipy.stats.bootstrap (paired, vectorised where the metric vectorises) and, for smECE, relplot's band
(``relplot.smECE`` per resample). The slow peers run ``--peer-boot`` resamples, scaled to B.

Writes benchmarks/results/bootstrap_speed.md (and bootstrap_speed.json) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# the steady state: parallel kernels from the warm-up on (cold_start.py times the first calls)
os.environ.setdefault("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS", "0")
os.environ.setdefault("HF_CALIBRATION_COMPILE_SECONDS", "0")  # the kernels, not their numpy twins: the steady state

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "bootstrap_speed.md"
STATE = HERE / "results" / "bootstrap_speed.json"
N = 100_000
TARGET_K, TARGET_SECONDS = 1000, 5.0

# the child: one fresh process, one K; prints a JSON line
CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import numpy as np
import hf_calibration.metrics as metrics
imported = time.perf_counter() - start
n, k = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
labels = rng.integers(0, k, n)
logits = (1.6 * rng.standard_normal((n, k), dtype=np.float32))
logits[np.arange(n), labels] += 2.2
logits *= 1.4
def timed(f):
    w, c = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - w, time.process_time() - c
report, first, first_cpu = timed(lambda: metrics.calibration_report(logits, labels, ci=0.95))
_, plain, _ = timed(lambda: metrics.calibration_report(logits, labels))
_, again, _ = timed(lambda: metrics.calibration_report(logits, labels, ci=0.95))
print(json.dumps({"package": metrics.__file__, "import": imported, "first": first, "first_cpu": first_cpu, "plain": plain,
                  "again": again, "ece": [float(report.ece), report.ece.low, report.ece.high],
                  "classwise": [float(report.classwise_ece), report.classwise_ece.low, report.classwise_ece.high]}))
"""


def _child(checkout: Path, k: int, n: int = N) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(k)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"the child failed for K = {k} in {checkout}:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"the child imported {result['package']}, not the checkout {checkout}")
    return result


def report_section(ks: list[int], rounds: int, baseline: Path | None, baseline_ks: list[int]) -> list[str]:
    load_start = os.getloadavg()
    for checkout in [ROOT] + ([baseline] if baseline else []):
        _child(checkout, 10, 2000)  # warm-up: compiles the kernels into numba's on-disk cache
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(rounds):
        for k in ks:
            runs.setdefault(("ours", k), []).append(_child(ROOT, k))
            if baseline and k in baseline_ks:
                runs.setdefault(("baseline", k), []).append(_child(baseline, k))
    load_end = os.getloadavg()
    med = lambda who, k, key: float(np.median([r[key] for r in runs[(who, k)]]))  # noqa: E731
    worst = lambda who, k, key: float(np.max([r[key] for r in runs[(who, k)]]))  # noqa: E731
    lines = [
        "### `calibration_report(z, y, ci=0.95)` at N = 100,000 float32 logits: the <= 5 s target at K = 1,000",
        "",
        f"- command: `python benchmarks/bootstrap_speed.py --sections report --rounds {rounds}"
        + (f" --baseline <checkout> --baseline-k {' '.join(map(str, baseline_ks))}" if baseline else "")
        + "`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores; load average at start {', '.join(f'{x:.1f}' for x in load_start)}, "
        f"at the end {', '.join(f'{x:.1f}' for x in load_end)}",
        f"- each row: a fresh process (kernels in numba's on-disk cache, warm), median (worst) of {rounds} rounds. "
        "**first call**: the first `calibration_report(..., ci=0.95)` of the process (1,000 resamples; smCE, smECE, "
        "classwise ECE 200), everything included but `import hf_calibration.metrics` (its own column); then the report "
        "without `ci`, and the call with `ci` again in the same process.",
        "",
        "| K | implementation | first call with ci (s) | CPU of it (s) | without ci (s) | with ci, again (s) | import (s) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for k in ks:
        for who in ("ours", "baseline"):
            if (who, k) not in runs:
                continue
            lines.append(
                f"| {k:,} | {'this checkout' if who == 'ours' else 'baseline'} | {med(who, k, 'first'):.2f} ({worst(who, k, 'first'):.2f}) | "
                f"{med(who, k, 'first_cpu'):.2f} | {med(who, k, 'plain'):.2f} | {med(who, k, 'again'):.2f} | {med(who, k, 'import'):.2f} |"
            )
    if TARGET_K in ks:
        t = med("ours", TARGET_K, "first")
        lines += [
            "",
            f"First call with intervals at K = {TARGET_K:,}: median {t:.2f} s, worst {worst('ours', TARGET_K, 'first'):.2f} s: "
            + (
                f"the <= {TARGET_SECONDS:g} s target is met"
                if t <= TARGET_SECONDS
                else f"the <= {TARGET_SECONDS:g} s target is NOT met"
            )
            + f" at this host load ({load_start[0]:.1f} at the start).",
        ]
    return lines, {f"{who}|{k}": r for (who, k), r in runs.items()}


# ------------------------------------------------------------------------------------------------ per metric, K = 10
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
        return stats.bootstrap(
            data,
            statistic,
            paired=True,
            vectorized=vectorized,
            n_resamples=n_boot,
            batch=50,
            method="basic",
            confidence_level=0.95,
            rng=np.random.default_rng(0),
        ).confidence_interval

    return run


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def metrics_section(rounds: int, n_boot: int, peer_boot: int, quick: bool) -> list[str]:
    n, k = (20_000, 10) if quick else (N, 10)
    z, y = _data(n, k)
    load = os.getloadavg()
    from hf_calibration.metrics import calibration_report, debiased_ece

    calibration_report(z[:2000], y[:2000], ci=0.95, n_boot=20)  # load the compiled kernels
    debiased_ece(z[:2000], y[:2000], ci=0.95, n_boot=20)
    metrics = ["ece", "adaece", "smce", "smece", "brier", "nll", "classwise_ece"]
    timings: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for metric in metrics:
            with_ci, without = _ours(metric, z, y, n_boot)
            timings.setdefault((metric, "hf_calibration (ci=0.95)"), []).append(
                max(_time(with_ci) - _time(without), 1e-9)
            )
            naive_boot = n_boot if metric in ("ece", "brier", "nll") else peer_boot
            timings.setdefault((metric, "naive numpy loop"), []).append(
                _time(_naive(metric, z, y, naive_boot)) * n_boot / naive_boot
            )
            peer = _scipy(metric, z, y, n_boot if metric != "smece" else peer_boot)
            if peer is not None:
                scale = n_boot / (n_boot if metric != "smece" else peer_boot)
                timings.setdefault(
                    (metric, "scipy.stats.bootstrap" + (" + relplot.smECE" if metric == "smece" else "")), []
                ).append(_time(peer) * scale)
        timings.setdefault(("debiased_ece", "hf_calibration (ci=0.95)"), []).append(
            _time(lambda: debiased_ece(z, y, ci=0.95, n_boot=n_boot)) - _time(lambda: debiased_ece(z, y))
        )
    lines = [
        "### Each metric's interval against a naive bootstrap and scipy's",
        "",
        f"- command: `python benchmarks/bootstrap_speed.py --sections metrics{' --quick' if quick else ''}`; machine: "
        f"{platform.machine()}, {os.cpu_count()} cores; load average at start {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}, at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        f"- N = {n:,} rows, K = {k}, B = {n_boot} resamples, 95 % intervals; median of {rounds} interleaved rounds. Ours: the "
        f"call with `ci` minus the same call without. Slow peers ran {peer_boot} resamples, scaled to {n_boot}. `ratio` = peer / ours.",
        "",
        "| metric | implementation | time for B resamples (s) | ratio |",
        "|---|---|---:|---:|",
    ]
    for metric in metrics + ["debiased_ece"]:
        ours = np.median(timings[(metric, "hf_calibration (ci=0.95)")])
        for (m, who), values in timings.items():
            if m == metric:
                t = float(np.median(values))
                lines.append(f"| {metric} | {who} | {t:.3f} | {'' if who.startswith('hf_') else f'{t / ours:.1f}'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=["report", "metrics"], default=["report", "metrics"])
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 100, 1000], help="K of the report section")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to time through the same harness")
    parser.add_argument("--baseline-k", type=int, nargs="+", default=[10, 100], help="the K the baseline runs")
    parser.add_argument("--quick", action="store_true", help="metrics section at N = 2e4")
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument(
        "--peer-boot", type=int, default=100, help="resamples the slow peers run (time scaled to --n-boot)"
    )
    args = parser.parse_args()
    # each section is kept in the JSON, so re-running one section keeps the other's last table
    state = json.loads(STATE.read_text()) if STATE.exists() else {}
    if "report" in args.sections:
        state["report"], state["report_runs"] = report_section(args.ks, args.rounds, args.baseline, args.baseline_k)
    if "metrics" in args.sections:
        state["metrics"] = metrics_section(args.rounds, args.n_boot, args.peer_boot, args.quick)
    STATE.write_text(json.dumps(state, indent=1))
    lines = ["## Bootstrap intervals (`benchmarks/bootstrap_speed.py`)", ""]
    for section in ("report", "metrics"):
        lines += state.get(
            section,
            [f"### {section}", "", f"Not run yet: `python benchmarks/bootstrap_speed.py --sections {section}`."],
        ) + [""]
    text = "\n".join(lines)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
