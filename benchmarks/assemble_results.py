"""Gather the sections the benchmark scripts wrote under benchmarks/results/ into benchmarks/RESULTS.md.

Run from the repository root after any benchmark:  python benchmarks/assemble_results.py
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (section file, script that writes it), in the order of the product: measure, recalibrate, train
SECTIONS = [
    ("fixed_cost.md", "fixed_cost.py --before <7fbf62a checkout> --suite"),
    ("metrics_speed.md", "metrics_speed.py"),
    ("evaluate_overhead.md", "evaluate_overhead.py"),
    ("accumulator.md", "accumulator.py"),
    ("bootstrap_speed.md", "bootstrap_speed.py"),
    ("bootstrap_coverage.md", "bootstrap_coverage.py"),
    ("predict_logits.md", "predict_logits.py"),
    ("calibrators.md", "calibrators.py"),
    ("calibrator_comparison.md", "calibrators.py --part comparison"),
    ("calibrator_fits.md", "calibrator_fits.py"),
    ("calibrator_fits_cv_target.md", "calibrator_fits.py --sections cv-target --baseline <previous main>"),
    ("calibrator_selection.md", "calibrator_selection.py"),
    ("small_sample_selection.md", "small_sample_selection.py"),
    ("small_sample_rule.md", "small_sample_rule.py --split validation|test --rule before|now"),
    ("conformal.md", "conformal.py"),
    ("losses.md", "losses.py"),
    ("loss_comparison.md", "loss_comparison.py"),
    ("maccal.md", "maccal.py"),
    ("training_cifar.md", "training_cifar.py"),
    ("training_cifar_maccal.md", "training_cifar.py --explore-maccal .data/features"),
    ("training_cifar_fedlas_gate.md", "training_cifar.py --diagnose-fedlas --seeds 0"),
    ("multilabel.md", "multilabel.py"),
    ("shift.md", "shift.py"),
    ("shift_calibration.md", "shift.py study --seeds 1 2"),
    ("shift_routes.md", "shift.py study --losses ce --seeds 1 --n-corrupt 1000 --max-per-cell 200 --levels 6"),
    ("dac_serving.md", "dac_serving.py --rounds 30"),
    ("serving.md", "serving.py"),
    ("scale.md", "scale.py --sections issue grid peers conformal disk"),
    ("cold_start.md", "cold_start.py --demo"),
]

HEADER = """# Benchmark results

Each section below is written by one script under `benchmarks/` (named in its heading, with the
exact command and machine). Peers run side by side in the same process or run, and speed is
reported as ratios. Re-run a script, then `python benchmarks/assemble_results.py` to rebuild this
file. CPU figures come from the project's 2-core x86_64 machine (no GPU); GPU figures come from
one NVIDIA H100 (80 GB). Sections also say where a target was missed.
"""


# a section's relative link to a file beside it (its plot): results/<file> once the section sits in RESULTS.md
_BESIDE = re.compile(r"\]\((?![a-z]+:|/|\.\./|#)([^)/\s]+\.(?:png|svg|jpg|json|md))\)")


def main() -> None:
    parts = [HEADER]
    for name, script in SECTIONS:
        path = HERE / "results" / name
        if path.exists():
            parts.append(_BESIDE.sub(r"](results/\1)", path.read_text().strip()) + "\n")
        else:
            parts.append(f"## `{script}`\n\nNot run yet: `python benchmarks/{script}`.\n")
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
