"""The fixed cost of a call, before and after the input boundary (inputs read once), side by side in one run.

Each case runs in fresh processes, one per side: "before" imports the package from an earlier checkout (``--before``),
"after" from this tree; the peer (torchmetrics for ECE, probmetrics for the TS / SVS / SMS fits) runs in the "after"
process on the same arrays. A process warms its call up once (compiling what it compiles), then times ``--calls``
calls; the sides alternate ``--rounds`` times, and the table gives the median over every timed call with the
interquartile range. Sizes: the ones the boundary issue names (ECE at 1e3 x 100 and 1e4 x 10, fits at 1e3 x 10,
``AutoCalibrator().fit`` at 5e3 x 100).

    python benchmarks/fixed_cost.py --before ../old-checkout            # writes benchmarks/results/fixed_cost.json

The JSON keeps every timing; ``--markdown`` prints the RESULTS.md table from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

# the steady state: parallel kernels from the warm-up on (cold_start.py times the first calls)
os.environ.setdefault("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS", "0")
os.environ.setdefault("HF_CALIBRATION_COMPILE_SECONDS", "0")  # the kernels, not their numpy twins: the steady state

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CASES = [  # (name, N, K)
    ("ece", 1_000, 100),
    ("ece", 10_000, 10),
    ("temperature_scaling", 1_000, 10),
    ("svs", 1_000, 10),
    ("sms", 1_000, 10),
    ("auto", 5_000, 100),
]
PEERS = {"ece": "torchmetrics", "temperature_scaling": "probmetrics", "svs": "probmetrics", "sms": "probmetrics"}


def _data(n: int, k: int, seed: int = 0):
    """Over-confident logits (labels drawn from the softmax at twice the temperature), float32, and int64 labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    z = (3.0 * rng.normal(size=(n, k))).astype(np.float32)
    p = np.exp(z / 2 - (z / 2).max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1).astype(np.int64)
    return z, y


def _ours(name: str):
    import warnings

    import hf_calibration.metrics as metrics

    if name == "ece":
        return lambda z, y: metrics.ece(z, y)
    if name == "auto":
        from hf_calibration.calibrators import AutoCalibrator

        def auto(z, y):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return AutoCalibrator().fit(z, y, progress_bar=False)

        return auto
    from hf_calibration.calibrators import create_calibrator

    def fit(z, y):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return create_calibrator(name).fit(z, y, progress_bar=False)

    return fit


def _peer(name: str):
    import warnings

    import torch

    if name == "ece":
        from torchmetrics.functional.classification import multiclass_calibration_error

        return lambda z, y: multiclass_calibration_error(
            torch.from_numpy(z), torch.from_numpy(y), num_classes=z.shape[1], n_bins=15, norm="l1"
        ).item()
    from probmetrics.calibrators import get_calibrator

    kind = {"temperature_scaling": "temp-scaling", "svs": "svs", "sms": "sms"}[name]

    cache = {}

    def fit(
        z, y
    ):  # probmetrics takes probabilities: float64, computed once outside the timed calls (calibrator_fits.py)
        probs = cache.setdefault(id(z), torch.softmax(torch.from_numpy(z).double(), 1).numpy())
        cal = get_calibrator(kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal.fit(probs, y)
        return cal

    return fit


def _time(fn, z, y, calls: int) -> list[float]:
    fn(z, y)  # warm-up: imports, compiled kernels
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(z, y)
        out.append(time.perf_counter() - start)
    return out


def child(name: str, n: int, k: int, side: str, calls: int) -> None:
    import numba
    import torch

    z, y = _data(n, k)
    record = {
        "ours": _time(_ours(name), z, y, calls),
        "threads": {"torch": torch.get_num_threads(), "numba": numba.get_num_threads()},
    }
    if side == "after" and name in PEERS:
        record["peer"] = _time(_peer(name), z, y, calls)
    import hf_calibration

    record["package"] = str(Path(hf_calibration.__file__).parent)
    print(json.dumps(record))


def _run_child(name: str, n: int, k: int, side: str, calls: int, before: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(before if side == "before" else REPO))
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, str(n), str(k), side, str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=str(before if side == "before" else REPO),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "n": len(values)}


def _lines_of_code(root: Path) -> dict:
    """Python files and lines of ``root/hf_calibration`` (all lines, and those that are neither blank nor comments)."""
    files = sorted((root / "hf_calibration").rglob("*.py"))
    lines = [path.read_text().splitlines() for path in files]
    code = sum(1 for text in lines for line in text if line.strip() and not line.strip().startswith("#"))
    return {
        "files": len(files),
        "lines": sum(map(len, lines)),
        "code_lines": code,
        "root_entries": len([p for p in (root / "hf_calibration").iterdir() if p.name != "__pycache__"]),
    }


def _suite(root: Path) -> dict:
    """Wall time and summary line of the test suite of the checkout ``root`` (its own tests, its own package)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(root))
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [line for line in out.stdout.splitlines() if " in " in line and ("passed" in line or "failed" in line)]
    return {"seconds": time.perf_counter() - start, "summary": lines[-1] if lines else out.stdout[-300:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the earlier version (its repository root)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per process (AutoCalibrator: a quarter)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fixed_cost.json")
    parser.add_argument("--markdown", action="store_true", help="print the table of --out")
    parser.add_argument("--suite", action="store_true", help="also time both test suites (about 10 minutes each)")
    parser.add_argument("--cases", nargs="+", help="only these calls (ece, temperature_scaling, svs, sms, auto)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the cases and suite times already in --out that this run does not redo",
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, n, k, side, calls = args.child
        child(name, int(n), int(k), side, int(calls))
        return
    if args.markdown:
        print(section(json.loads(args.out.read_text())))
        return
    if args.before is None or not (args.before / "hf_calibration").is_dir():
        parser.error("--before must be a checkout holding hf_calibration/")
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_at_start": os.getloadavg()[0],
        "before": str(args.before),
        "cases": {},
    }
    if args.merge and args.out.is_file():
        earlier = json.loads(args.out.read_text())
        results["cases"] = earlier.get("cases", {})
        for key in ("suite", "note"):  # the suites' times and the reading written beside them
            if key in earlier:
                results[key] = earlier[key]
    for name, n, k in CASES:
        if args.cases and name not in args.cases:
            continue
        calls = max(2, args.calls // 4) if name == "auto" else args.calls
        runs = {"before": [], "after": [], "peer": []}
        for _ in range(args.rounds):
            for side in ("before", "after"):
                record = _run_child(name, n, k, side, calls, args.before)
                runs[side] += record["ours"]
                runs["peer"] += record.get("peer", [])
                results.setdefault("threads", record["threads"])
        key = f"{name} {n:.0e} x {k}".replace("e+0", "e")
        results["cases"][key] = {
            "peer_name": PEERS.get(name),
            **{side: _summary(v) for side, v in runs.items() if v},
            "raw": runs,
        }
        print(key, {side: round(_summary(v)["median"] * 1e3, 3) for side, v in runs.items() if v}, "ms", flush=True)
    results["lines_of_code"] = {"before": _lines_of_code(args.before), "after": _lines_of_code(REPO)}
    if args.suite:
        results["suite"] = {side: _suite(root) for side, root in (("before", args.before), ("after", REPO))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    (HERE / "results" / "fixed_cost.md").write_text(section(results))
    print(section(results))


def markdown(results: dict) -> str:
    rows = [
        "| call | before (ms) | after (ms) | after / before | peer | peer (ms) | peer / after |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, case in results["cases"].items():
        before, after = case["before"]["median"] * 1e3, case["after"]["median"] * 1e3
        peer = case.get("peer")
        peer_cells = (
            "- | - | -"
            if peer is None
            else f"{case['peer_name']} | {peer['median'] * 1e3:.2f} | {peer['median'] * 1e3 / after:.2f}x"
        )
        rows.append(f"| {key} | {before:.2f} | {after:.2f} | {after / before:.2f} | {peer_cells} |")
    return "\n".join(rows)


def section(results: dict) -> str:
    """The RESULTS.md section: the fixed-cost table, the suite's time and the package's size, before and after."""
    out = [
        "## Fixed cost per call, before and after the input boundary (`benchmarks/fixed_cost.py`)",
        "",
        f"Command: `python benchmarks/fixed_cost.py --before <checkout of 7fbf62a> --suite`. Machine: {results['machine']}, "
        f"load {results['load_at_start']:.2f} at the start; threads (both sides, the peers' too): torch "
        f"{results.get('threads', {}).get('torch')}, numba {results.get('threads', {}).get('numba')}. Each case in fresh "
        "processes, the two sides alternating, one warm-up call each (compiles excluded), median over every timed call "
        "(before = 7fbf62a, the package before it was regrouped; after = this tree). The peers run in the after process "
        "on the same arrays: torchmetrics' `multiclass_calibration_error` on the logits, probmetrics' `temp-scaling` / "
        "`svs` / `sms` on float64 probabilities computed once, outside the timed calls (as `calibrator_fits.py` does).",
        "",
        markdown(results),
    ]
    loc = results.get("lines_of_code")
    if loc:
        b, a = loc["before"], loc["after"]
        out += [
            "",
            "| package | Python files | lines | code lines (no blanks, no comments) | entries at the root |",
            "|---|---|---|---|---|",
            f"| before | {b['files']} | {b['lines']:,} | {b['code_lines']:,} | {b['root_entries']} |",
            f"| after | {a['files']} | {a['lines']:,} | {a['code_lines']:,} | {a['root_entries']} |",
        ]
    suite = results.get("suite")
    if suite:
        out += ["", "| test suite | wall time | result |", "|---|---|---|"]
        out += [
            f"| {side} | {suite[side]['seconds']:.0f} s | {suite[side]['summary']} |" for side in ("before", "after")
        ]
        if suite.get("note"):
            out += ["", suite["note"]]
    if results.get("note"):
        out += ["", results["note"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
