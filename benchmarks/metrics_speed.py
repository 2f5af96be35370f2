"""Speed and peak memory of hf_calibration.metrics against torchmetrics, netcal, relplot and scipy's LP.

Run from the repository root (about 3-4 minutes on 2 CPU cores, ~13 GB of RAM at the full size):

    python benchmarks/metrics_speed.py            # N = 1e6 x K = 1000 and N = 1e5 x K = 10
    python benchmarks/metrics_speed.py --quick    # N = 2e5 x K = 1000 instead of 1e6 (less memory)
    python benchmarks/metrics_speed.py --baseline ../other-checkout --cases 1e6x100,1e5x10   # before / after

``--baseline DIR`` times this checkout's metrics against the ``hf_calibration`` of another checkout (the same
float32 logits and their softmax, children alternating ``--rounds`` times) and writes
benchmarks/results/metrics_speed_baseline.md instead.

Every measurement runs in its own child process on the same float32 logits (saved once to a
temporary .npy), so peak memory is that process's own high-water mark (``ru_maxrss``) above
the loaded input. Each library starts from logits: netcal (which takes probabilities) is
timed with the numpy softmax that feeds it. Writes benchmarks/results/metrics_speed.md and
prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# the steady state: parallel kernels from the warm-up on (cold_start.py times the first calls)
os.environ.setdefault("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS", "0")
os.environ.setdefault("HF_CALIBRATION_COMPILE_SECONDS", "0")  # the kernels, not their numpy twins: the steady state

RESULTS = Path(__file__).resolve().parent / "results" / "metrics_speed.md"
N_BINS = 15


# ---------------------------------------------------------------------------------------------
# the implementations, each from (float32 logits, int64 labels)
# ---------------------------------------------------------------------------------------------


def _ours(metric):
    from hf_calibration import metrics

    fn = getattr(metrics, metric)
    if metric == "calibration_report":  # every metric of the report; its ECE is the value shown
        return lambda z, y: fn(z, y, N_BINS).ece
    return lambda z, y: fn(z, y, N_BINS)


def _bare_numpy():
    # the plain numpy max-softmax pass: what any metric must at least do
    return lambda z, y: 1.0 / np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)


def _torchmetrics(norm):
    import torch
    from torchmetrics.functional.classification import multiclass_calibration_error

    def run(z, y):
        zt, yt = torch.from_numpy(z), torch.from_numpy(y)
        return multiclass_calibration_error(zt, yt, num_classes=z.shape[1], n_bins=N_BINS, norm=norm).item()

    return run


def _netcal(metric):
    from netcal.metrics import ECE, MCE

    cls = {"ece": ECE, "mce": MCE}[metric]

    def run(z, y):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        return cls(bins=N_BINS).measure(e, y)

    return run


def _top_label(z, y):
    from hf_calibration.metrics._format import prepare, top_label

    top = top_label(prepare(z, y))
    return top.confidence, top.correct


def _smooth(impl):
    """(confidence, correct)-level smooth metrics; the softmax is not part of the timing."""
    if impl == "ours_smece":
        from hf_calibration.metrics.smooth import smece_from_confidence as fn
    elif impl == "ours_smce":
        from hf_calibration.metrics.smooth import smce_from_confidence as fn
    elif impl == "relplot_smece":
        import relplot

        fn = relplot.smECE
    elif impl == "scipy_lp_smce":
        fn = _smce_linprog
    return fn


def _smce_linprog(confidence, correct):
    """smCE as the LP of the design notes: max (1/n) sum w_i r_i, |w_i| <= 1, |w_{i+1} - w_i| <= p_{i+1} - p_i."""
    from scipy.optimize import linprog
    from scipy.sparse import diags, vstack

    order = np.argsort(confidence, kind="stable")
    p, a = confidence[order], correct[order]
    n = p.shape[0]
    r = (a - p) / n
    diff = diags([-np.ones(n - 1), np.ones(n - 1)], [0, 1], shape=(n - 1, n))
    gaps = np.diff(p)
    res = linprog(-r, A_ub=vstack([diff, -diff]), b_ub=np.concatenate([gaps, gaps]), bounds=(-1, 1), method="highs")
    return -res.fun


def _synthetic_confidences(n, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 1.0, n)
    return p, (rng.random(n) < p**1.5).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# child process: one measurement
# ---------------------------------------------------------------------------------------------


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _detection_share(spec: dict) -> dict:
    """In one process: the every-row detection alone against the ECE call that runs it (best of interleaved repeats)."""
    from hf_calibration._core.checks import looks_like_probabilities
    from hf_calibration.metrics import ece

    z, y = np.load(spec["logits"]), np.load(spec["labels"])
    if spec.get("softmax"):
        z = np.exp(z - z.max(axis=1, keepdims=True))
        z /= z.sum(axis=1, keepdims=True)
    looks_like_probabilities(z[:8])  # compile / load the kernel outside the timing
    detect, metric = [], []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        looks_like_probabilities(z)
        detect.append(time.perf_counter() - start)
        start = time.perf_counter()
        ece(z, y, N_BINS)
        metric.append(time.perf_counter() - start)
    return {"detect": min(detect), "ece": min(metric)}


def _child(spec: dict) -> dict:
    if spec["kind"] == "detect":
        return _detection_share(spec)
    if spec["kind"] == "logits":
        z = np.load(spec["logits"])
        y = np.load(spec["labels"])
        if spec.get("softmax"):  # the same predictions as probabilities (float32, as a user's softmax gives them)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            z /= z.sum(axis=1, keepdims=True)
        args = (z, y)
        impl = spec["impl"]
        fn = {
            "ours": lambda: _ours(spec["metric"]),
            "bare_numpy": _bare_numpy,
            "torchmetrics": lambda: _torchmetrics({"ece": "l1", "mce": "max"}[spec["metric"]]),
            "netcal": lambda: _netcal(spec["metric"]),
        }[impl]()
    else:  # confidence-level smooth metrics
        if spec.get("logits"):
            conf, correct = _top_label(np.load(spec["logits"]), np.load(spec["labels"]))
        else:
            conf, correct = _synthetic_confidences(spec["n"])
        args = (conf, correct)
        fn = _smooth(spec["impl"])
        if spec["impl"].startswith("ours"):  # compile the numba kernels outside the timing
            fn(*_synthetic_confidences(200, seed=1))
    if spec.get("warmup"):
        fn(*args)
    base = _maxrss_mb()
    times = []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        value = fn(*args)
        times.append(time.perf_counter() - start)
    value = float(np.mean(value)) if np.ndim(value) else float(value)
    return {"time": min(times), "peak_mb": max(0.0, _maxrss_mb() - base), "value": value}


# extra memory beyond the input, as a multiple of the logits' size (measured at N = 2e5, K = 1000)
_EXTRA_MEMORY = {"ours": 0.05, "bare_numpy": 1.0, "torchmetrics": 1.0, "netcal": 3.0}


def _available_mb() -> float:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable")) / 1024.0
    except (OSError, StopIteration):
        return float("inf")


def _run_child(spec: dict) -> dict:
    if spec["kind"] == "logits":  # don't push a shared machine into the OOM killer
        input_mb = os.path.getsize(spec["logits"]) / 2**20
        need = input_mb * (1.0 + _EXTRA_MEMORY[spec["impl"]]) * 1.2
        if need > _available_mb():
            return {"error": f"skipped: needs ~{need / 1024:.1f} GiB, {_available_mb() / 1024:.1f} GiB available"}
    env = None
    if spec.get("pythonpath"):  # another checkout's package (the --baseline run)
        env = {**os.environ, "PYTHONPATH": spec["pythonpath"]}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=spec.get("pythonpath"),
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# parent: data, plan, table
# ---------------------------------------------------------------------------------------------


def _write_logits(folder: Path, n: int, k: int, seed: int) -> tuple[str, str]:
    """float32 logits with ~75 % top-1 accuracy, written in chunks (no full float64 copy)."""
    rng = np.random.default_rng(seed)
    path = folder / f"logits_{n}x{k}.npy"
    z = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, k))
    y = np.empty(n, dtype=np.int64)
    step = max(1, (1 << 24) // k)
    for s in range(0, n, step):
        rows = min(step, n - s)
        chunk = rng.standard_normal((rows, k), dtype=np.float32)
        labels = rng.integers(0, k, rows)
        chunk[np.arange(rows), labels] += rng.uniform(0, 8, rows).astype(np.float32)
        z[s : s + rows] = chunk * np.float32(1.5)
        y[s : s + rows] = labels
    z.flush()
    del z
    ypath = folder / f"labels_{n}.npy"
    np.save(ypath, y)
    return str(path), str(ypath)


def _machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, load average at start {load}"


def _versions() -> str:
    import importlib.metadata as md

    names = ["numpy", "torch", "torchmetrics", "netcal", "relplot", "scipy", "numba"]
    out = []
    for name in names:
        try:
            out.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(out)


def _parse_cases(text: str) -> list[tuple[int, int]]:
    """``"1e6x100,1e5x10"`` → [(1000000, 100), (100000, 10)]."""
    return [(int(float(n)), int(float(k))) for n, k in (case.lower().split("x") for case in text.split(","))]


def _baseline(args) -> None:
    """This checkout's ece / calibration_report against another checkout's, on logits and on their softmax."""
    here = str(Path(__file__).resolve().parents[1])
    checkouts = {"baseline": str(Path(args.baseline).resolve()), "this checkout": here}
    rows, shares = [], []
    with tempfile.TemporaryDirectory(prefix="metrics_speed_") as tmp:
        for n, k in _parse_cases(args.cases):
            z_path, y_path = _write_logits(Path(tmp), n, k, seed=k)
            repeats = 5 if n * k <= 10_000_000 else 2
            for metric in ("ece", "calibration_report"):
                for softmax in (False, True):
                    times: dict[str, list[float]] = {name: [] for name in checkouts}
                    values: dict[str, float] = {}
                    for r in range(args.rounds):
                        order = list(checkouts) if r % 2 == 0 else list(checkouts)[::-1]
                        for name in order:
                            spec = {
                                "kind": "logits",
                                "logits": z_path,
                                "labels": y_path,
                                "impl": "ours",
                                "metric": metric,
                                "softmax": softmax,
                                "repeats": repeats,
                                "warmup": True,
                                "pythonpath": checkouts[name],
                            }
                            res = _run_child(spec)
                            if "error" in res:
                                raise RuntimeError(f"{name}: {res['error']}")
                            times[name].append(res["time"])
                            values[name] = res["value"]
                    ratios = [b / a for a, b in zip(times["this checkout"], times["baseline"])]
                    rows.append(
                        (
                            f"N={n:.0e}, K={k}".replace("e+0", "e"),
                            metric,
                            "probabilities" if softmax else "logits",
                            float(np.median(times["baseline"])),
                            float(np.median(times["this checkout"])),
                            float(np.median(ratios)),
                            values["baseline"],
                            values["this checkout"],
                        )
                    )
                    print(rows[-1], flush=True)
            for softmax in (False, True):
                res = _run_child(
                    {
                        "kind": "detect",
                        "logits": z_path,
                        "labels": y_path,
                        "softmax": softmax,
                        "repeats": 2 * repeats,
                        "pythonpath": here,
                        "impl": "ours",
                    }
                )
                shares.append((f"N={n:.0e}, K={k}".replace("e+0", "e"), "probabilities" if softmax else "logits", res))
    lines = [
        "## Metrics speed against a baseline checkout (`benchmarks/metrics_speed.py --baseline`)",
        "",
        f"- machine: {_machine()}",
        f"- command: `python benchmarks/metrics_speed.py --baseline <checkout> --cases {args.cases} --rounds {args.rounds}`",
        "- float32 logits (and their float32 softmax), each measurement its own process, the two checkouts alternating "
        f"over {args.rounds} rounds; time = median over rounds of the best of the repeats; `baseline / this` = median of "
        "the per-round ratios (above 1: this checkout is faster).",
        "",
        "| case | metric | input | baseline (s) | this checkout (s) | baseline / this | value (baseline) | value (this) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, metric, kind, base, ours, ratio, v_base, v_ours in rows:
        lines.append(
            f"| {case} | {metric} | {kind} | {base:.4f} | {ours:.4f} | {ratio:.2f} | {v_base:.6f} | {v_ours:.6f} |"
        )
    lines += [
        "",
        "This checkout's logits-or-probabilities detection (every row, `looks_like_probabilities`) alone, against "
        "the `ece` call that runs it, in one process (best of interleaved repeats):",
        "",
        "| case | input | detection (s) | ece (s) | detection / ece |",
        "|---|---|---:|---:|---:|",
    ]
    for case, kind, res in shares:
        if "error" in res:
            lines.append(f"| {case} | {kind} | failed: {res['error'][:80]} | | |")
        else:
            lines.append(
                f"| {case} | {kind} | {res['detect']:.4f} | {res['ece']:.4f} | {res['detect'] / res['ece']:.1%} |"
            )
    text = "\n".join(lines) + "\n"
    out = RESULTS.parent / "metrics_speed_baseline.md"
    out.write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2e5 instead of 1e6 for the K = 1000 case")
    parser.add_argument(
        "--baseline", metavar="DIR", help="time this checkout against the hf_calibration in DIR instead"
    )
    parser.add_argument(
        "--cases", default="1e6x100,1e5x10", help="with --baseline: N x K cases (default 1e6x100,1e5x10)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="with --baseline: alternating rounds (default 5)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    if args.baseline:
        _baseline(args)
        return

    import torch

    big_n = 200_000 if args.quick else 1_000_000
    cases = [(big_n, 1000, 2), (100_000, 10, 5)]  # (N, K, repeats for our code and the bare pass)
    rows: list[tuple] = []
    notes: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="metrics_speed_") as tmp:
        for n, k, repeats in cases:
            z_path, y_path = _write_logits(Path(tmp), n, k, seed=k)
            case = f"N={n:.0e}, K={k}".replace("e+0", "e")
            base = {"kind": "logits", "logits": z_path, "labels": y_path}
            small = n * k <= 10_000_000
            bare = _run_child({**base, "impl": "bare_numpy", "repeats": repeats if small else 1, "warmup": small})
            rows.append((case, "max-softmax pass", "bare numpy (float32)", bare, None))
            for metric in ("ece", "mce", "adaece"):
                ours = _run_child({**base, "impl": "ours", "metric": metric, "repeats": repeats, "warmup": small})
                rows.append((case, metric, "hf_calibration", ours, bare))
                notes[f"{case} {metric} ours/bare"] = ours.get("time", np.nan) / bare.get("time", np.nan)
                if metric == "adaece":
                    continue
                for impl in ("torchmetrics", "netcal"):
                    ref_repeats = 1 if not small else 3
                    res = _run_child({**base, "impl": impl, "metric": metric, "repeats": ref_repeats, "warmup": small})
                    rows.append((case, metric, impl, res, ours))
                    notes[f"{case} {metric} {impl}/ours"] = res.get("time", np.nan) / ours.get("time", np.nan)
            if k == 10:  # smooth metrics on the top label of these logits
                for impl in ("ours_smece", "relplot_smece"):
                    spec = {
                        "kind": "conf",
                        "impl": impl,
                        "logits": z_path,
                        "labels": y_path,
                        "repeats": 3,
                        "warmup": True,
                    }
                    res = _run_child(spec)
                    rows.append(
                        (
                            case,
                            "smece",
                            impl.split("_")[0].replace("ours", "hf_calibration"),
                            res,
                            rows[-1][3] if impl != "ours_smece" else None,
                        )
                    )
                notes["smece relplot/ours"] = rows[-1][3].get("time", np.nan) / rows[-2][3].get("time", np.nan)
        for n, impls in ((10_000, ("ours_smce", "scipy_lp_smce")), (1_000_000, ("ours_smce",))):
            first = None
            for impl in impls:
                res = _run_child({"kind": "conf", "impl": impl, "n": n, "repeats": 3 if impl.startswith("ours") else 1})
                label = "hf_calibration" if impl.startswith("ours") else "scipy linprog (HiGHS)"
                rows.append((f"n={n:.0e} confidences".replace("e+0", "e"), "smce", label, res, first))
                first = first or res
            if n == 10_000:
                notes["smce LP/ours n=1e4"] = rows[-1][3].get("time", np.nan) / rows[-2][3].get("time", np.nan)
            else:
                notes["smce n=1e6 seconds"] = rows[-1][3].get("time", np.nan)

    lines = [
        "## Metrics speed (`benchmarks/metrics_speed.py`)",
        "",
        f"- machine: {_machine()}; torch threads {torch.get_num_threads()} (numpy single-threaded)",
        f"- versions: {_versions()}",
        f"- command: `python benchmarks/metrics_speed.py{' --quick' if args.quick else ''}`",
        "- float32 logits; each row is its own process (skipped when the machine lacks the memory it needs); time = best of the repeats; peak = the process's "
        "high-water RSS above the loaded input. netcal is timed with the numpy softmax that feeds it. "
        "Smooth metrics are timed on given (confidence, correct) arrays. "
        "`ratio` = this row's time / the row it is compared with (ours vs bare numpy; a reference vs ours).",
        "",
        "| case | metric | implementation | time (s) | peak memory (MB) | ratio | value |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for case, metric, impl, res, other in rows:
        if "error" in res:
            lines.append(f"| {case} | {metric} | {impl} | failed: {res['error'][:80]} | | | |")
            continue
        ratio = f"{res['time'] / other['time']:.2f}" if other and "time" in other else ""
        value = f"{res['value']:.6f}" if metric != "max-softmax pass" else ""
        lines.append(f"| {case} | {metric} | {impl} | {res['time']:.3f} | {res['peak_mb']:.0f} | {ratio} | {value} |")
    big = f"N={big_n:.0e}, K=1000".replace("e+0", "e")
    lines += [
        "",
        "Targets:",
        f"- ECE >= 3x faster than torchmetrics: {notes.get(big + ' ece torchmetrics/ours', np.nan):.2f}x at {big}, "
        f"{notes.get('N=1e5, K=10 ece torchmetrics/ours', np.nan):.2f}x at N=1e5, K=10",
        f"- ECE within 2x of the bare numpy pass: ours/bare = {notes.get(big + ' ece ours/bare', np.nan):.2f} at {big}, "
        f"{notes.get('N=1e5, K=10 ece ours/bare', np.nan):.2f} at N=1e5, K=10",
        f"- exact smce at n = 1e6 <= 1 s: {notes.get('smce n=1e6 seconds', np.nan):.3f} s; "
        f">= 100x faster than the LP at n = 1e4: {notes.get('smce LP/ours n=1e4', np.nan):.0f}x",
        f"- smece vs relplot: relplot/ours = {notes.get('smece relplot/ours', np.nan):.2f}x",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
