"""The first call, as a new user meets it: each case in a fresh process with an empty compiled-kernel cache.

A fresh ``NUMBA_CACHE_DIR`` per process is what a machine has after ``pip install``: every numba kernel a call uses is
compiled on that first call. Each case times, in its own process, the import, the first call (compiling included)
and then the warm call (median of ``--warm`` more calls), and the peer's first and warm calls in another fresh process
on the same arrays (torchmetrics for ECE, probmetrics for the TS / SVS / SMS fits, whose first fit pays torch's own
warm-up). The cases are the sizes the speed issue names: ``ece`` at 1e4 x 100; the TS / SVS / SMS fits at 5e3 x 100;
every public metric, calibrator fit and conformal fit / predict at 5e3 x 100 (100 labels for the sigmoid ones);
and, with ``--demo``, the demo's first and second runs (a fresh cache, then the one the first run filled).

    python benchmarks/cold_start.py                    # resumable: writes benchmarks/results/cold_start.json
    python benchmarks/cold_start.py --demo             # also the demo, twice (a few minutes)
    python benchmarks/cold_start.py --markdown         # the RESULTS.md section from the JSON

Cases already in the JSON are kept unless ``--redo`` names them (or ``--redo all``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "results" / "cold_start.json"
METRICS = ["ece", "adaece", "classwise_ece", "mce", "rmsce", "smece", "smce", "debiased_ece", "nll", "brier",
           "calibration_report", "reliability_table", "aurc"]  # fmt: skip
SIGMOID = {"platt", "beta", "sigmoid_temperature_scaling", "sigmoid_isotonic", "sigmoid_histogram_binning"}
PEERS = {"ece": "torchmetrics", "temperature_scaling": "probmetrics", "svs": "probmetrics", "sms": "probmetrics"}
TARGETS = {  # the targets: (what, bound)
    "ece 1e4 x 100": ("first call", "<= 1 s"),
    "temperature_scaling 5e3 x 100": ("import + first fit", "<= 2x probmetrics'"),
    "svs 5e3 x 100": ("import + first fit", "<= 2x probmetrics'"),
    "sms 5e3 x 100": ("import + first fit", "<= 2x probmetrics'"),
}


def _data(n: int, k: int, seed: int = 0, multilabel: bool = False):
    """Over-confident float32 logits and int64 labels (multi-label: (N, K) 0 / 1 labels)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    z = (3.0 * rng.normal(size=(n, k))).astype(np.float32)
    if multilabel:
        y = (rng.random((n, k)) < 1 / (1 + np.exp(-z / 2))).astype(np.int64)
        return z, y
    p = np.exp(z / 2 - (z / 2).max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1).astype(np.int64)
    return z, y


def _call(case: str, side: str):
    """``(function of (z, y), multilabel)`` for the case's call on ``side`` ("ours" or "peer")."""
    import warnings

    name = case.split()[0]
    warnings.simplefilter("ignore")
    if side == "peer":
        import torch

        if name == "ece":
            from torchmetrics.functional.classification import multiclass_calibration_error

            return lambda z, y: multiclass_calibration_error(
                torch.from_numpy(z), torch.from_numpy(y), num_classes=z.shape[1], n_bins=15, norm="l1"
            ).item(), False
        from probmetrics.calibrators import get_calibrator

        kind = {"temperature_scaling": "temp-scaling", "svs": "svs", "sms": "sms"}[name]

        def peer_fit(z, y):  # probmetrics takes probabilities (float64), as in calibrator_fits.py
            get_calibrator(kind).fit(torch.softmax(torch.from_numpy(z).double(), 1).numpy(), y)

        return peer_fit, False
    if name.startswith("conformal_"):
        from hf_calibration.conformal import ConformalPredictor, MultiLabelConformalPredictor

        method, what = name.split("_")[1:]

        def fit(z, y):
            if method == "crc":
                return MultiLabelConformalPredictor().fit(z, y, alpha=0.1)
            return ConformalPredictor(method).fit(z, y, alpha=0.1)

        if what == "fit":
            return fit, method == "crc"
        fitted = {}

        def predict(z, y):
            if "p" not in fitted:  # the setup call (``child``: not timed): a predict case times predict_sets only
                fitted["p"] = fit(z, y)
                return
            fitted["p"].predict_sets(z)

        predict.setup = True
        return predict, method == "crc"
    if name in METRICS:
        import hf_calibration.metrics as metrics

        function = getattr(metrics, name)
        return (lambda z, y: function(z, y)), False
    from hf_calibration.calibrators import create_calibrator

    return (lambda z, y: create_calibrator(name).fit(z, y, progress_bar=False)), name in SIGMOID


class _Compiles:
    """numba's compile events: the seconds each outermost compile took (the kernels a call compiles, with what they
    call), by kernel."""

    def __init__(self):
        from numba.core import event

        self.open: dict[int, list[float]] = {}
        self.depth = 0
        self.seconds: dict[str, float] = {}
        outer = self

        class Listener(event.Listener):
            def on_start(self, ev):
                outer.on_start(ev)

            def on_end(self, ev):
                outer.on_end(ev)

        event.register("numba:compile", Listener())

    def on_start(self, ev) -> None:
        self.open.setdefault(id(ev.data["dispatcher"]), []).append(time.perf_counter())
        self.depth += 1

    def on_end(self, ev) -> None:
        self.depth -= 1
        start = self.open[id(ev.data["dispatcher"])].pop()
        if self.depth == 0:
            function = ev.data["dispatcher"].py_func
            name = f"{function.__module__}.{function.__qualname__}".removeprefix("hf_calibration.")
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def child(case: str, side: str, warm: int) -> None:
    start = time.perf_counter()
    function, multilabel = _call(case, side)  # imports what the call needs
    imported = time.perf_counter() - start
    size = case.split()[1:]
    n, k = int(float(size[0])), int(size[2])
    z, y = _data(n, k, multilabel=multilabel)
    if getattr(function, "setup", False):  # a predictor to predict with: fitted first, untimed (its kernels too)
        function(z, y)
    compiles = _Compiles() if side == "ours" else None
    start = time.perf_counter()
    function(z, y)
    first = time.perf_counter() - start
    warm_times = []
    for _ in range(warm):
        start = time.perf_counter()
        function(z, y)
        warm_times.append(time.perf_counter() - start)
    record = {"import": imported, "first": first, "warm": statistics.median(warm_times), "warm_all": warm_times}
    if compiles is not None:  # what the first and warm calls compiled (not what the kernels' phase below compiles)
        record["compiles"] = dict(sorted(compiles.seconds.items(), key=lambda item: -item[1]))
    if side == "ours":  # the kernels' warm call: compiled now (not timed), then timed as above
        from hf_calibration._core import numpy_twin, parallel

        numpy_twin.compile_from_now()
        parallel.PARALLEL_COMPILE_SECONDS = 0.0
        function(z, y)
        kernel_times = []
        for _ in range(warm):
            start = time.perf_counter()
            function(z, y)
            kernel_times.append(time.perf_counter() - start)
        record["warm_compiled"] = statistics.median(kernel_times)
    print(json.dumps(record))


def _fresh_process(args: list[str], cache: str | None = None) -> dict:
    """Run this script's child in a fresh process with an empty kernel cache (or ``cache``); its JSON line."""
    folder = cache or tempfile.mkdtemp(prefix="numba-cold-")
    env = dict(os.environ, HF_HUB_OFFLINE="1", NUMBA_CACHE_DIR=folder, PYTHONPATH=str(REPO))
    try:
        out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, cwd=REPO)
    finally:
        if cache is None:
            shutil.rmtree(folder, ignore_errors=True)
    if out.returncode != 0:
        raise RuntimeError(f"{args}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _demo_run(cache: str, output: Path) -> float:
    env = dict(os.environ, HF_HUB_OFFLINE="1", NUMBA_CACHE_DIR=cache, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    subprocess.run(
        [str(Path(sys.executable).parent / "hf-calibration"), "demo", "--output-dir", str(output)],
        env=env,
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    return time.perf_counter() - start


def cases() -> list[str]:
    from hf_calibration.calibrators import list_calibrators

    out = ["ece 1e4 x 100"] + [f"{name} 5e3 x 100" for name in METRICS]
    out += [f"{name} 5e3 x 100" for name in list_calibrators()]
    out += [f"conformal_{m}_{w} 5e3 x 100" for m in ("thr", "aps", "raps", "crc") for w in ("fit", "predict")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=5, help="warm calls timed after the first (median)")
    parser.add_argument("--cases", nargs="+", help="only these case names (first word), e.g. ece svs")
    parser.add_argument("--redo", nargs="+", default=[], help="case names to measure again ('all': every one)")
    parser.add_argument("--demo", action="store_true", help="also run the demo twice (fresh cache, then warm)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--markdown", action="store_true", help="print the RESULTS.md section of --out")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.warm)
        return
    results = json.loads(args.out.read_text()) if args.out.is_file() else {"cases": {}}
    if args.markdown:
        print(section(results))
        return
    import numba
    import torch

    results.update(
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        versions={"numba": numba.__version__, "torch": torch.__version__},
        threads="each side's defaults: torch and numba use every core",
    )
    for case in cases():
        name = case.split()[0]
        if args.cases and name not in args.cases:
            continue
        if case in results["cases"] and name not in args.redo and "all" not in args.redo:
            continue
        record = {"load_before": os.getloadavg()[0], "ours": _fresh_process(["--child", case, "ours"])}
        if name in PEERS:
            record["peer_name"] = PEERS[name]
            record["peer"] = _fresh_process(["--child", case, "peer"])
        results["cases"][case] = record
        print(case, {k: round(v, 4) for k, v in record["ours"].items() if k in ("import", "first", "warm")}, flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    if args.demo and ("demo" not in results or "demo" in args.redo or "all" in args.redo):
        cache, output = tempfile.mkdtemp(prefix="numba-cold-"), Path(tempfile.mkdtemp(prefix="demo-"))
        try:
            first = _demo_run(cache, output / "first")
            second = _demo_run(cache, output / "second")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(output, ignore_errors=True)
        results["demo"] = {"first": first, "second": second, "load_before": os.getloadavg()[0]}
        print("demo", results["demo"], flush=True)
        args.out.write_text(json.dumps(results, indent=1))
    args.out.with_suffix(".md").write_text(section(results))
    print(section(results))


def section(results: dict) -> str:
    lines = [
        "## The first call: `cold_start.py`",
        "",
        "Each case in a fresh process with an empty compiled-kernel cache (a fresh `NUMBA_CACHE_DIR`, as after "
        "`pip install`): the import of what the call needs, the first call (compiling included) and the warm call "
        "(median of the calls after it); the peer in its own fresh process on the same arrays. Float32 logits, "
        "int64 labels (multi-label 0 / 1 labels for the sigmoid calibrators and CRC).",
        "",
        f"Machine: {results.get('machine', '?')}; {results.get('threads', '')}; "
        f"numba {results.get('versions', {}).get('numba', '?')}, torch {results.get('versions', {}).get('torch', '?')}.",
        "",
        "Command: `python benchmarks/cold_start.py --demo`",
        "",
        "`warm`: the calls after the first, as they come (on the numpy twins while their time has not paid for the "
        "kernels' compile: `_core/numpy_twin.py`); `warm, compiled`: the same call once every kernel is compiled, "
        "the steady state the grid tables compare with the peers.",
        "",
        "| call | import (s) | first (s) | of which compiling (s) | warm (s) | warm, compiled (s) | first / warm | "
        "peer import + first (s) | ours / peer, import + first | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, record in results.get("cases", {}).items():
        ours, peer = record["ours"], record.get("peer")
        target = TARGETS.get(case)
        if target is None:
            verdict = "met" if ours["first"] <= 3 * ours["warm"] else "not met"
            target_text = f"first <= 3x warm: {verdict}"
        elif case.startswith("ece"):
            target_text = f"first {target[1]}: {'met' if ours['first'] <= 1.0 else 'not met'}"
        else:
            ratio = (ours["import"] + ours["first"]) / (peer["import"] + peer["first"]) if peer else float("inf")
            target_text = f"import + first <= 2x probmetrics': {'met' if ratio <= 2 else 'not met'}"
        lines.append(
            f"| {case} | {ours['import']:.2f} | {ours['first']:.3f} | {sum(ours.get('compiles', {}).values()):.2f} | "
            f"{ours['warm']:.4f} | "
            + (f"{ours['warm_compiled']:.4f} | " if "warm_compiled" in ours else "- | ")
            + f"{ours['first'] / ours['warm']:.1f}x | "
            + (
                f"{peer['import'] + peer['first']:.2f} ({record['peer_name']}) | "
                f"{(ours['import'] + ours['first']) / (peer['import'] + peer['first']):.2f}x"
                if peer
                else "- | -"
            )
            + f" | {target_text} |"
        )
    if "demo" in results:
        demo = results["demo"]
        ratio = demo["first"] / demo["second"]
        lines += [
            "",
            f"The demo (`hf-calibration demo`): first run {demo['first']:.0f} s with an empty cache, second run "
            f"{demo['second']:.0f} s with the cache the first filled: {ratio:.2f}x (target <= 1.5x: "
            f"{'met' if ratio <= 1.5 else 'not met'}).",
        ]
    kernels: dict[str, list[float]] = {}
    for record in results.get("cases", {}).values():
        for name, seconds in record["ours"].get("compiles", {}).items():
            kernels.setdefault(name, []).append(seconds)
    if kernels:
        lines += [
            "",
            "What the first calls compile (each kernel's compile, with the kernels it calls, in seconds; median over the "
            "cases that compiled it, and how many did):",
            "",
            "| kernel | compile (s) | cases |",
            "|---|---|---|",
        ]
        ranked = sorted(kernels.items(), key=lambda item: -statistics.median(item[1]) * len(item[1]))
        lines += [f"| `{name}` | {statistics.median(v):.2f} | {len(v)} |" for name, v in ranked[:20]]
    if results.get("note"):
        lines += ["", results["note"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
