"""Choosing a calibrator: what ``AutoCalibrator()`` costs and what it picks, before and after issue 21's changes.

Run from the repository root:

    python benchmarks/calibrator_selection.py                     # both sections (~30-40 min on the shared 2-core box)
    python benchmarks/calibrator_selection.py --sections speed    # or: choices

Writes benchmarks/results/calibrator_selection.md (then ``python benchmarks/assemble_results.py``).

"Before" is ``AutoCalibrator`` as it was at commit ``BASELINE`` (every registered calibrator, SMART and PTS averaged
over 3 fit seeds a fold, no racing), read from the git history and run in this process on today's calibrators,
so that the two differ only in the selection code. "After" is today's ``AutoCalibrator()`` (the default candidates,
one fit seed, racing). Matrix and Dirichlet scaling, in the "before" candidates, are timed as this tree has them.

1. speed: the default ``AutoCalibrator().fit`` (metric ECE, 5 folds) on the 5,000 validation logits of a K = 100 file
   and a K = 10 file, before and after alternating within each of ``--rounds`` rounds (median, and the median of the
   per-round ratios), after one warm-up fit (numba loads its compiled kernels once per process). Also after with
   ``race=False``, to show what racing saves.
2. choices: on every shared file, the method each picks, its cross-validated ECE and NLL (the numbers the choice was
   made on), and, as a check only, the refitted calibrator's test ECE and NLL.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "data" / "logits"
OUT = ROOT / "benchmarks" / "results" / "calibrator_selection.md"
sys.path.insert(0, str(ROOT))

from hf_calibration.calibrators import AutoCalibrator  # noqa: E402
from hf_calibration.calibrators.selection.auto import DEFAULT_METHODS  # noqa: E402
from hf_calibration.metrics import ece, nll  # noqa: E402

logging.getLogger().setLevel(logging.ERROR)
logging.getLogger("hf_calibration").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

BASELINE = "f03c26fb965d8f9150982566acc2bed0ddb3d30d"  # main before issue 21 items 4-5
TIMED = {100: "netcal_densenet-bc-100-cifar-100", 10: "cifar10_resnet50_cross_entropy_calibench"}
TARGET_SECONDS = 15.0


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def baseline_selection():
    """The selection module as it was at ``BASELINE``, bound to today's package (its relative imports resolve there)."""
    source = subprocess.run(
        ["git", "show", f"{BASELINE}:hf_calibration/calibrators/selection.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader("hf_calibration.calibrators._selection_baseline", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "hf_calibration.calibrators"
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"selection.py@{BASELINE[:7]}", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


def _read(name: str):
    d = np.load(SHARED / f"{name}.npz")
    return d["logits_val"], d["labels_val"], d["logits_test"], d["labels_test"]


def runners(old_module):
    return {
        "before": lambda z, y: old_module.AutoCalibrator().fit(z, y, progress_bar=False),
        "after": lambda z, y: AutoCalibrator().fit(z, y, progress_bar=False),
        "after, race=False": lambda z, y: AutoCalibrator(race=False).fit(z, y, progress_bar=False),
    }


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def section_speed(old_module, rounds: int) -> list[str]:
    run = runners(old_module)
    lines = [
        "### Time of the default `AutoCalibrator().fit` on 5,000 validation logits (median of "
        f"{rounds} interleaved rounds)",
        "",
        "Each round fits before, after and after without racing, in turn, on the same logits. `ratio` is the median over "
        "rounds of before / after in that round. Load average is the host's at the start of each file's rounds.",
        "",
        "| K | file | load | before (s) | after (s) | after, race=False (s) | ratio before / after | chosen before | chosen after | target <= 15 s |",
        "|---:|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    z0, y0, _, _ = _read(TIMED[10])
    run["after"](z0[:1000], y0[:1000])  # warm-up: numba loads the compiled kernels once per process
    for k, name in TIMED.items():
        z, y, _, _ = _read(name)
        load = _load()
        times = {label: [] for label in run}
        chosen = {}
        for r in range(rounds):
            for label, fn in run.items():
                seconds, auto = timed(fn, z, y)
                times[label].append(seconds)
                chosen[label] = auto.method_
                print(f"  K={k} round {r + 1}: {label} {seconds:.1f} s ({auto.method_})", flush=True)
        ratio = statistics.median(b / a for b, a in zip(times["before"], times["after"]))
        after = statistics.median(times["after"])
        lines.append(
            f"| {k} | {name} | {load} | {statistics.median(times['before']):.1f} | {after:.1f} | "
            f"{statistics.median(times['after, race=False']):.1f} | {ratio:.1f} | {chosen['before']} | {chosen['after']} | "
            f"{'met' if after <= TARGET_SECONDS else 'NOT met'} |"
        )
    return lines


def _test_scores(auto, zt, yt) -> tuple[float, float]:
    with torch.no_grad():
        out = auto(torch.from_numpy(zt)).double().numpy()
    return ece(out, yt, from_logits=True), nll(out, yt, from_logits=True)


def rule_on_full_table(old_table) -> str:
    """Today's rule (``CalibratorComparison.best``) applied to the before-run's table of every method (5 folds each)."""
    from hf_calibration.calibrators.selection.auto import CalibratorComparison, MethodScores

    scores = {}
    for name in old_table.methods:
        entry = MethodScores(name, fit_seeds=old_table[name].fit_seeds, errors=list(old_table[name].errors))
        entry.folds = {c: list(v) for c, v in old_table[name].folds.items()}
        entry.fold_ids = list(range(len(entry.folds["nll"])))
        scores[name] = entry
    table = CalibratorComparison(
        scores,
        cv=old_table.cv,
        seed=old_table.seed,
        n_bins=old_table.n_bins,
        num_samples=old_table.num_samples,
        num_classes=old_table.num_classes,
    )
    try:
        return table.best("ece")
    except ValueError:
        return "uncalibrated"


def section_choices(old_module) -> list[str]:
    run = runners(old_module)
    lines = [
        "### What each picks on the shared logits (metric ECE, 5 folds on the 5,000 validation logits)",
        "",
        "CV = mean over the held-out folds of the validation set (what the choice is made on); test = the refitted "
        "calibrator on the file's test part (a check only: no setting here was chosen on it). A choice must now have a "
        "CV NLL no worse than the uncalibrated model's (second column).",
        "",
        "| file | uncalibrated CV NLL | before: chosen | CV ECE % | CV NLL | test ECE % | test NLL | time (s) "
        "| after: chosen | CV ECE % | CV NLL | test ECE % | test NLL | time (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    extra = [
        "",
        "The same files: today's rule on the before-run's table of every registered method (`methods=\"all\"`, 3 fit "
        "seeds, no racing), against the default candidates; and the default run without racing (the choice racing "
        "must not change).",
        "",
        "| file | all methods, today's rule | CV ECE % | CV NLL | default candidates | CV ECE % | CV NLL | default, race=False |",
        "|---|---|---:|---:|---|---:|---:|---|",
    ]
    facts = {"worse_nll": [], "race_changed": []}
    for path in sorted(SHARED.glob("*.npz")):
        z, y, zt, yt = _read(path.stem)
        cells, autos = [], {}
        for label in ("before", "after", "after, race=False"):
            seconds, auto = timed(run[label], z, y)
            autos[label] = auto
            print(f"  {path.stem}: {label} {auto.method_} {seconds:.1f} s", flush=True)
            if label == "after, race=False":
                continue
            table = auto.comparison_
            row = table[auto.method_] if auto.method_ in table.scores else table["uncalibrated"]
            test_ece, test_nll = _test_scores(auto, zt.astype(np.float64), yt)
            cells += [
                auto.method_,
                f"{100 * row.mean('ece'):.2f}",
                f"{row.mean('nll'):.4f}",
                f"{100 * test_ece:.2f}",
                f"{test_nll:.4f}",
                f"{seconds:.1f}",
            ]
        uncal = autos["after"].comparison_["uncalibrated"].mean("nll")
        lines.append(f"| {path.stem} | {uncal:.4f} | " + " | ".join(cells) + " |")
        full = autos["before"].comparison_
        if autos["before"].method_ in full.scores and full[autos["before"].method_].mean("nll") > uncal:
            facts["worse_nll"].append(path.stem)
        if autos["after, race=False"].method_ != autos["after"].method_:
            facts["race_changed"].append(path.stem)
        best_all = rule_on_full_table(full)
        new = autos["after"].comparison_
        chosen = autos["after"].method_
        extra.append(
            f"| {path.stem} | {best_all} | {100 * full[best_all].mean('ece'):.2f} | {full[best_all].mean('nll'):.4f} | "
            f"{chosen} | {100 * new[chosen].mean('ece'):.2f} | {new[chosen].mean('nll'):.4f} | "
            f"{autos['after, race=False'].method_} |"
        )
    summary = [
        "",
        f"Before, the choice had a cross-validated NLL worse than the uncalibrated model's on {len(facts['worse_nll'])} of "
        f"the files ({', '.join(facts['worse_nll']) or 'none'}); after, never (by construction). Racing changed the "
        f"choice on {len(facts['race_changed'])} files ({', '.join(facts['race_changed']) or 'none'}).",
    ]
    return lines + extra + summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="speed,choices")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",")]
    old_module = baseline_selection()
    import numba

    header = [
        "## Choosing a calibrator: `AutoCalibrator` before and after (`benchmarks/calibrator_selection.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores shared with other users' jobs, torch threads "
        f"{torch.get_num_threads()}, Python {platform.python_version()}; torch {torch.__version__}, numba {numba.__version__}, "
        f"numpy {np.__version__}. Load average at start: {_load()}.",
        f"Command: `python benchmarks/calibrator_selection.py --sections {args.sections} --rounds {args.rounds}`. "
        f"Before = `AutoCalibrator()` at commit {BASELINE[:7]} (all {len(old_module.list_calibrators())} calibrators, 3 fit seeds, "
        f"no racing); after = today's default ({len(DEFAULT_METHODS)} candidates: {', '.join(DEFAULT_METHODS)}; one fit seed; "
        "racing). Both run today's calibrators, matrix and Dirichlet scaling included as this tree has them.",
        "",
    ]
    body: list[str] = []
    if "speed" in sections:
        body += section_speed(old_module, args.rounds) + [""]
    if "choices" in sections:
        body += section_choices(old_module) + [""]
    OUT.write_text("\n".join(header + body))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
