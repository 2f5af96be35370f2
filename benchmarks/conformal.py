"""Conformal prediction sets (THR / LAC, APS, RAPS): ours beside TorchCP and torch-uncertainty on the same random splits
of the shared real logits: empirical coverage, mean set size, fit and predict time.

Run from the repository root:

    python benchmarks/conformal.py                 # 20 splits per file and alpha (~10-15 min on the shared 2-core box)
    python benchmarks/conformal.py --splits 5 --files cifar10_resnet50_cross_entropy_calibench

Writes benchmarks/results/conformal.md (then ``python benchmarks/assemble_results.py``).

Each file's val and test parts are pooled and split at random, half to calibrate, half to test, ``--splits`` times per
alpha in {0.05, 0.1, 0.2}; within a split every implementation sees the same logits (float32, as stored) and the
implementations run one after another in a rotating order. Every implementation works on the softmax of the logits
(no temperature scaling: torch-uncertainty's is switched off). RAPS runs with k_reg = 1, lambda = 0.1 everywhere
(torch-uncertainty's defaults); ours with "auto" (the paper's tuning on 30 % of the calibration half) is an extra row.
Times are the median over splits of one fit (threshold from the calibration half) and one predict (the test half's
sets); ratios are peer / ours, the median of the per-split ratios. Torch runs on one thread for everyone (the box is
shared; our own code switches to one thread on CPU anyway).

TorchCP does not install with a plain ``pip install torchcp`` here (its dependency torchsort fails to build in pip's
isolated build); it was installed with ``pip install --no-deps torchcp torch_geometric`` and torchsort built with
``pip install --no-build-isolation torchsort`` (CPU only: with no ``nvcc`` on the ``PATH``, as its setup builds the
CUDA extension whenever ``nvcc`` runs), which is why it is not in the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# the steady state: parallel kernels from the warm-up on (cold_start.py times the first calls)
os.environ.setdefault("HF_CALIBRATION_PARALLEL_COMPILE_SECONDS", "0")
os.environ.setdefault("HF_CALIBRATION_COMPILE_SECONDS", "0")  # the kernels, not their numpy twins: the steady state

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "data" / "logits"
OUT = ROOT / "benchmarks" / "results" / "conformal.md"
sys.path.insert(0, str(ROOT))

from hf_calibration.conformal import ConformalPredictor, coverage, set_size  # noqa: E402

logging.getLogger("hf_calibration").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=UserWarning)

ALPHAS = (0.05, 0.1, 0.2)
K_REG, PENALTY = 1, 0.1
METHODS = ("thr", "aps", "raps")


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


# ----------------------------------------------------------------------------- implementations: fit -> predict -> bool sets
def ours(method: str, *, allow_empty: bool = False, auto: bool = False):
    def fit(z, y, alpha, seed):
        kwargs = {} if method != "raps" or auto else {"k_reg": K_REG, "penalty": PENALTY}
        predictor = ConformalPredictor(method, allow_empty=allow_empty, seed=seed, **kwargs).fit(z, y, alpha=alpha)
        return predictor.predict_sets

    return fit


def torchcp(method: str):
    from torchcp.classification.predictor import SplitPredictor
    from torchcp.classification.score import APS, LAC, RAPS

    def fit(z, y, alpha, seed):
        score = {
            "thr": lambda: LAC(),
            "aps": lambda: APS(randomized=True),
            "raps": lambda: RAPS(randomized=True, penalty=PENALTY, kreg=K_REG),
        }[method]()
        predictor = SplitPredictor(score)
        torch.manual_seed(seed)
        predictor.calculate_threshold(z, y, alpha)
        return lambda zt: predictor.predict_with_logits(zt).bool()

    return fit


def torch_uncertainty(method: str):
    from torch.utils.data import DataLoader, TensorDataset
    from torch_uncertainty.post_processing import ConformalClsAPS, ConformalClsRAPS, ConformalClsTHR

    def fit(z, y, alpha, seed):
        kwargs = {
            "thr": {},
            "aps": {"randomized": True},
            "raps": {"randomized": True, "penalty": PENALTY, "regularization_rank": K_REG},
        }[method]
        cls = {"thr": ConformalClsTHR, "aps": ConformalClsAPS, "raps": ConformalClsRAPS}[method]
        predictor = cls(alpha=alpha, model=torch.nn.Identity(), enable_ts=False, device="cpu", **kwargs)
        torch.manual_seed(seed)
        predictor.fit(DataLoader(TensorDataset(z, y), batch_size=len(y)))
        return lambda zt: predictor.conformal(zt) > 0

    return fit


def implementations(method: str) -> dict:
    impls = {"ours": ours(method), "ours, empty sets allowed": ours(method, allow_empty=True)}
    if method == "raps":
        impls["ours, k_reg / lambda auto"] = ours(method, auto=True)
    for name, factory in (("TorchCP", torchcp), ("torch-uncertainty", torch_uncertainty)):
        try:
            impls[name] = factory(method)
        except ImportError as err:
            print(f"{name} not available: {err}", file=sys.stderr)
    return impls


def run_file(path: Path, splits: int, records: list) -> None:
    d = np.load(path)
    z = np.concatenate([d["logits_val"], d["logits_test"]]).astype(np.float32)
    y = np.concatenate([d["labels_val"], d["labels_test"]]).astype(np.int64)
    n = len(y)
    rng = np.random.default_rng(0)
    for method in METHODS:
        impls = implementations(method)
        names = list(impls)
        for alpha in ALPHAS:
            for split in range(splits):
                order = rng.permutation(n)
                cal, test = order[: n // 2], order[n // 2 :]
                z_cal, y_cal, z_test = torch.from_numpy(z[cal]), torch.from_numpy(y[cal]), torch.from_numpy(z[test])
                shift = split % len(names)
                for name in names[shift:] + names[:shift]:  # rotate who runs first
                    start = time.perf_counter()
                    predict = impls[name](z_cal, y_cal, alpha, split)
                    fitted = time.perf_counter()
                    sets = predict(z_test)
                    done = time.perf_counter()
                    sets = sets.numpy() if isinstance(sets, torch.Tensor) else sets
                    records.append(
                        {
                            "file": path.stem,
                            "k": z.shape[1],
                            "method": method,
                            "alpha": alpha,
                            "split": split,
                            "impl": name,
                            "coverage": coverage(sets, y[test]),
                            "size": set_size(sets),
                            "empty": float((sets.sum(1) == 0).mean()),
                            "fit": fitted - start,
                            "predict": done - fitted,
                        }
                    )
        print(f"{path.stem} {method} done (load {_load()})", file=sys.stderr)


# ----------------------------------------------------------------------------- tables
def _select(records, **where):
    return [r for r in records if all(r[k] == v for k, v in where.items())]


def _impls(records, method):
    seen = []
    for r in _select(records, method=method):
        if r["impl"] not in seen:
            seen.append(r["impl"])
    return seen


def coverage_table(records, files, alpha) -> list[str]:
    lines = [
        f"### Coverage and mean set size at alpha = {alpha} (target coverage {1 - alpha:.2f}; mean over splits)",
        "",
        "Coverage in %, then the mean set size; `empty` is the share of empty sets (%).",
        "",
    ]
    for method in METHODS:
        impls = _impls(records, method)
        lines += [f"**{method}**", "", "| file | K | " + " | ".join(impls) + " |", "|---|---:|" + "---:|" * len(impls)]
        for f in files:
            cells = []
            for impl in impls:
                rs = _select(records, file=f, method=method, alpha=alpha, impl=impl)
                if not rs:
                    cells.append("")
                    continue
                cov = 100 * np.mean([r["coverage"] for r in rs])
                size = np.mean([r["size"] for r in rs])
                empty = 100 * np.mean([r["empty"] for r in rs])
                cells.append(f"{cov:.2f} / {size:.3f}" + (f" (empty {empty:.1f})" if empty >= 0.05 else ""))
            k = _select(records, file=f)[0]["k"]
            lines.append(f"| {f} | {k} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def deviation_table(records, files) -> list[str]:
    lines = [
        "### Mean coverage minus target, every file and alpha (percentage points)",
        "",
        "For each implementation, the mean over splits of (coverage - (1 - alpha)), then the smallest and largest of "
        "those over the files and the three alphas. A split-conformal method with empty sets allowed should lie in "
        "[0, 100/(n+1)] up to noise (n = half a file: 100/(n+1) is 0.02 to 0.04 points here).",
        "",
        "| method | implementation | min | max |",
        "|---|---|---:|---:|",
    ]
    for method in METHODS:
        for impl in _impls(records, method):
            devs = [
                100
                * (
                    np.mean([r["coverage"] for r in _select(records, file=f, method=method, alpha=a, impl=impl)])
                    - (1 - a)
                )
                for f in files
                for a in ALPHAS
                if _select(records, file=f, method=method, alpha=a, impl=impl)
            ]
            lines.append(f"| {method} | {impl} | {min(devs):+.2f} | {max(devs):+.2f} |")
    return lines + [""]


def timing_table(records) -> list[str]:
    lines = [
        "### Fit and predict time (same splits, interleaved)",
        "",
        "Median over every split and alpha of the time to fit on the calibration half and to predict the test half's "
        "sets (5,000 to 7,500 images each); `ratio` = the median of the per-split peer / ours ratios (above 1: ours "
        "faster). Ours includes its input checks (labels in range, finite logits, probability detection).",
        "",
        "| method | K | implementation | fit (ms) | fit ratio | predict (ms) | predict ratio |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for method in METHODS:
        for k in sorted({r["k"] for r in records}):
            base = {(r["file"], r["alpha"], r["split"]): r for r in _select(records, method=method, k=k, impl="ours")}
            for impl in _impls(records, method):
                rs = _select(records, method=method, k=k, impl=impl)
                fit = 1000 * statistics.median(r["fit"] for r in rs)
                pred = 1000 * statistics.median(r["predict"] for r in rs)
                ratios = [
                    (r["fit"] / base[key]["fit"], r["predict"] / base[key]["predict"])
                    for r in rs
                    if (key := (r["file"], r["alpha"], r["split"])) in base
                ]
                fr = statistics.median(x for x, _ in ratios)
                pr = statistics.median(x for _, x in ratios)
                same = impl == "ours"
                lines.append(
                    f"| {method} | {k} | {impl} | {fit:.1f} | {'' if same else f'{fr:.2f}'} | {pred:.1f} | {'' if same else f'{pr:.2f}'} |"
                )
    return lines + [""]


def ties_table(paths, splits) -> list[str]:
    """THR's threshold with float32 and with float64 probabilities, on the same splits: how many calibration scores
    tie with q_hat, and the coverage that follows (the split-conformal upper bound assumes no ties)."""
    lines = [
        "### Ties at THR's threshold: float32 against float64 probabilities",
        "",
        "Same half / half splits; `ties` = the mean number of calibration scores equal to q_hat (1 without ties); "
        "coverage in % on the other half; `bound` = 100 (1 - alpha + 1/(n+1)).",
        "",
        "| file | alpha | ties, float32 | ties, float64 | coverage, float32 | coverage, float64 | bound |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for path in paths:
        d = np.load(path)
        z = torch.from_numpy(np.concatenate([d["logits_val"], d["logits_test"]]).astype(np.float32))
        y = torch.from_numpy(np.concatenate([d["labels_val"], d["labels_test"]]).astype(np.int64))
        n = len(y) // 2
        scores = {
            bits: 1 - torch.softmax(z.to(dtype), dim=1) for bits, dtype in ((32, torch.float32), (64, torch.float64))
        }
        for alpha in ALPHAS:
            rng = np.random.default_rng(1)
            ties, covered = {32: [], 64: []}, {32: [], 64: []}
            for _ in range(splits):
                order = torch.from_numpy(rng.permutation(len(y)))
                cal, test = order[:n], order[n:]
                for bits, s in scores.items():
                    label = s[cal, y[cal]]
                    q_hat = torch.kthvalue(label, math.ceil((n + 1) * (1 - alpha) - 1e-9)).values
                    ties[bits].append(int((label == q_hat).sum()))
                    covered[bits].append(float((s[test, y[test]] <= q_hat).double().mean()))
            lines.append(
                f"| {path.stem} | {alpha} | {np.mean(ties[32]):.1f} | {np.mean(ties[64]):.1f} | {100 * np.mean(covered[32]):.2f} | "
                f"{100 * np.mean(covered[64]):.2f} | {100 * (1 - alpha + 1 / (n + 1)):.2f} |"
            )
    return lines + [""]


def summary(records, files) -> list[str]:
    """The figures the README quotes, computed from the tables' records."""

    def worst(method, impl):
        devs = [
            abs(np.mean([r["coverage"] for r in rs]) - (1 - a))
            for f in files
            for a in ALPHAS
            if (rs := _select(records, file=f, method=method, alpha=a, impl=impl))
        ]
        return 100 * max(devs) if devs else float("nan")

    def ratio(method, impl, what, k=None):
        base = {
            (r["file"], r["alpha"], r["split"]): r
            for r in _select(records, method=method, impl="ours")
            if k is None or r["k"] == k
        }
        values = [
            r[what] / base[key][what]
            for r in _select(records, method=method, impl=impl)
            if (key := (r["file"], r["alpha"], r["split"])) in base
        ]
        return statistics.median(values) if values else float("nan")

    lines = ["### Summary", ""]
    exact = max(worst(m, "ours, empty sets allowed") for m in METHODS)
    peer = max(worst(m, "TorchCP") for m in METHODS if "TorchCP" in _impls(records, m))
    lines.append(
        f"- Exact sets (empty allowed): the mean coverage is within {exact:.2f} points of 1 - alpha for every method, file "
        f"and alpha (TorchCP: {peer:.2f}). Never-empty sets (ours by default, torch-uncertainty always) cover more "
        "wherever the model is more accurate than 1 - alpha."
    )
    for method in METHODS:
        parts = []
        for impl in ("TorchCP", "torch-uncertainty"):
            if impl in _impls(records, method):
                parts.append(
                    f"{impl} fit {ratio(method, impl, 'fit'):.2f}x / predict {ratio(method, impl, 'predict'):.2f}x "
                    f"(K = 100: {ratio(method, impl, 'fit', 100):.2f}x / {ratio(method, impl, 'predict', 100):.2f}x)"
                )
        lines.append(f"- {method}: peer time / ours, median over all splits: " + "; ".join(parts) + ".")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=20, help="random calibration / test splits per file and alpha")
    parser.add_argument("--files", default="", help="comma-separated file stems (default: every shared file)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = sorted(SHARED.glob("*.npz"))
    if args.files:
        paths = [p for p in paths if p.stem in args.files.split(",")]
    if not paths:
        raise SystemExit(f"no shared logits under {SHARED}")
    versions = f"torch {torch.__version__}, numpy {np.__version__}"
    for package in ("torchcp", "torch_uncertainty"):
        try:
            versions += f", {package} {__import__(package).__version__}"
        except Exception:  # noqa: BLE001 - a missing peer only loses its columns
            versions += f", {package} not installed"
    load_start = _load()
    records: list[dict] = []
    for path in paths:
        run_file(path, args.splits, records)
    files = [p.stem for p in paths]
    command = (
        "python benchmarks/conformal.py"
        + (f" --splits {args.splits}" if args.splits != 20 else "")
        + (f" --files {args.files}" if args.files else "")
    )
    lines = [
        "## Conformal prediction sets: THR, APS, RAPS beside TorchCP and torch-uncertainty (`benchmarks/conformal.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other users' jobs, torch threads 1 for every "
        f"implementation, Python {platform.python_version()}; {versions}. Load average at start: {load_start}.",
        f"Command: `{command}`. Each shared file's val and test parts pooled, {args.splits} random half / half "
        "calibration / test splits per alpha, the same splits for every implementation. RAPS: k_reg = 1, lambda = 0.1 "
        '(and ours with both on "auto"). No temperature scaling anywhere. Ours: default never-empty sets (an empty set '
        "gets the top class, as the paper's code), and the exact procedure with empty sets allowed; TorchCP allows empty "
        "sets; torch-uncertainty never returns one.",
        "",
    ]
    for alpha in ALPHAS:
        lines += coverage_table(records, files, alpha)
    lines += deviation_table(records, files)
    lines += timing_table(records)
    lines += ties_table(paths, args.splits)
    lines += summary(records, files)
    lines += [f"Load average at the end: {_load()}."]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
