"""How often each metric's 95 % bootstrap interval covers the TRUE value, on synthetic models whose true value is known.

Run from the repository root (about an hour on 2 busy CPU cores; resumable: finished draws are kept in
benchmarks/results/bootstrap_coverage.json and skipped on a re-run):

    python benchmarks/bootstrap_coverage.py                          # 200 draws at N = 1,000 and 10,000
    python benchmarks/bootstrap_coverage.py --draws 40 --sizes 1000  # quicker, noisier

The model: K = 3 rows ``[p, (1-p)/2, (1-p)/2]``, right (label 0) with probability ``f(p)``, else label 1 or 2 at random.
Four maps with ``p ~ U(1/3, 1)``: over-confident ``f = 0.7 p``; uniformly over-confident ``f = p - 0.1`` (the same gap
in every bin: MCE's maximum is a tie of 10 bins); crossing ``f = 0.3 + 0.5 p`` (under- then over-confident, some
bins with no gap); calibrated ``f = p`` (every calibration error 0). A fifth, discrete map for ``binning="distinct"``:
``p`` uniform on 12 values in [0.4, 0.95], ``f = 0.7 p + 0.15``.

True values, by integration of the known map (scipy's quad, tolerance 1e-12), so to well below 1e-4: accuracy,
Brier, NLL; ECE, O-ECE, U-ECE, MCE with the 15 equal-width bins; AdaECE and the debiased estimator's target with the
population's 15 equal-mass bins (the debiased L2 target ``sqrt(sum_b w_b gap_b^2)``, L1 ``sum_b w_b |gap_b|``; the
marginal mode per class, then ``(mean_k CE_k^p)^(1/p)``); classwise ECE per class over its own bins; smCE by its
exact LP on a 200,001-point grid carrying the expected residual ``f(p) - p``; smECE by the same kernel smoothing and
bandwidth search as the estimator, on a 1,000,001-point grid with the expected labels ``f(p)``; the discrete map's
values are finite sums.

Each draw computes every metric's replicates once (1,000 resamples; smCE, smECE and classwise ECE 200, their
defaults) and from them the interval each metric ships (``bootstrap.INTERVALS``) and the alternatives (percentile,
basic; for debiased_ece also the basic interval on the CE scale instead of CE^p), so the choice is measured on the
same resamples. It counts whether the interval holds the true value, whether the printed estimate lies outside its
own interval, and how often the shipped interval carries a note or none at all. The first draw of every (map, N)
checks that the public functions return the very interval computed here. Writes
benchmarks/results/bootstrap_coverage.md (and the .json) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from scipy import integrate

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bootstrap_coverage.md"
STATE = HERE / "results" / "bootstrap_coverage.json"
LO = 1.0 / 3.0
LEVEL = 0.95
BAND = (0.93, 0.97)  # the target band of a 95 % interval's coverage
MIN_DRAWS = 40  # a cell with fewer draws is listed as not finished, not tabulated
MAPS = {
    "over-confident, f = 0.7 p": lambda p: 0.7 * p,
    "uniformly over-confident, f = p - 0.1": lambda p: p - 0.1,
    "crossing, f = 0.3 + 0.5 p": lambda p: 0.3 + 0.5 * p,
    "calibrated, f = p": lambda p: p,
}
DISCRETE = "discrete (12 values), f = 0.7 p + 0.15"
LEVELS = np.linspace(0.4, 0.95, 12)
DISCRETE_MAP = lambda p: 0.7 * p + 0.15  # noqa: E731
REPORT_METRICS = (
    "accuracy",
    "ece",
    "adaece",
    "mce",
    "classwise_ece",
    "o_ece",
    "u_ece",
    "smce",
    "smece",
    "brier",
    "nll",
)
DEBIASED = ("debiased top L2", "debiased top L1", "debiased marginal L2", "debiased marginal L1")


# ------------------------------------------------------------------------------------------------ true values
def _quad(g, a, b) -> float:
    return integrate.quad(g, a, b, epsabs=1e-13, epsrel=1e-12, limit=200)[0] if b > a else 0.0


def truth(f) -> dict[str, float]:
    """Every metric's population value for the continuous map ``f`` (see the module docstring)."""
    from hf_calibration.metrics.smooth import _fixed_point_sigma, _smce_sum, _SmoothECE

    density = 1.0 / (1.0 - LO)
    gap = lambda a, b: _quad(lambda p: (p - f(p)) * density, max(a, LO), b)  # noqa: E731  E[(p - f) 1{a < p <= b}]
    width = np.linspace(0.0, 1.0, 16)
    gaps = np.array([gap(a, b) for a, b in zip(width[:-1], width[1:])])
    mass = np.array([max(b - max(a, LO), 0.0) * density for a, b in zip(width[:-1], width[1:])])
    equal = np.linspace(LO, 1.0, 16)  # the population's equal-mass edges (p is uniform)
    mean_gaps = np.array([gap(a, b) for a, b in zip(equal[:-1], equal[1:])]) * 15  # each bin holds 1/15 of the mass
    # classes 1 and 2: q = (1 - p) / 2 in (0, 1/3), P(y = k | p) = (1 - f) / 2, gap q - P = (f - p) / 2
    other = sum(
        abs(_quad(lambda p: (f(p) - p) / 2 * density, max(1 - 2 * b, LO), min(1 - 2 * a, 1.0)))
        for a, b in zip(width[:-1], width[1:])
    )
    grid = np.linspace(LO, 1.0, 200_001)
    fine = np.linspace(LO, 1.0, 1_000_001)
    q = lambda p: (1 - p) / 2  # noqa: E731
    brier_row = lambda p: f(p) * ((1 - p) ** 2 + 2 * q(p) ** 2) + (1 - f(p)) * (p**2 + (1 - q(p)) ** 2 + q(p) ** 2)  # noqa: E731
    nll_row = lambda p: -(f(p) * np.log(p) + (1 - f(p)) * np.log(q(p)))  # noqa: E731
    top_l2, top_l1 = float(np.sqrt(np.mean(mean_gaps**2))), float(np.mean(np.abs(mean_gaps)))
    # marginal: class 0's equal-mass bins are the top label's; a class-1 bin is a p-bin with half the gap, twice
    return {
        "accuracy": _quad(lambda p: f(p) * density, LO, 1.0),
        "ece": float(np.abs(gaps).sum()),
        "adaece": float(np.abs(mean_gaps).sum() / 15),
        "mce": float(np.max(np.abs(gaps[mass > 0] / mass[mass > 0]))),
        "classwise_ece": float((np.abs(gaps).sum() + 2 * other) / 3),
        "o_ece": float(np.clip(gaps, 0, None).sum()),
        "u_ece": float(np.clip(-gaps, 0, None).sum()),
        "smce": float(_smce_sum(grid, (f(grid) - grid) * density * (grid[1] - grid[0]))),
        "smece": float(_fixed_point_sigma(_SmoothECE(fine, f(fine)))[1][0]),
        "brier": _quad(lambda p: brier_row(p) * density, LO, 1.0),
        "nll": _quad(lambda p: nll_row(p) * density, LO, 1.0),
        "debiased top L2": top_l2,
        "debiased top L1": top_l1,
        "debiased marginal L2": float(np.sqrt((top_l2**2 + 2 * (top_l2 / 2) ** 2) / 3)),
        "debiased marginal L1": float((top_l1 + 2 * top_l1 / 2) / 3),
    }


def discrete_truth() -> dict[str, float]:
    """The distinct-binning targets of the discrete map: one bin per value, each of mass 1/12."""
    gaps = LEVELS - DISCRETE_MAP(LEVELS)
    l2, l1 = float(np.sqrt(np.mean(gaps**2))), float(np.mean(np.abs(gaps)))
    return {
        "debiased top L2": l2,
        "debiased top L1": l1,
        "debiased marginal L2": float(np.sqrt((l2**2 + 2 * (l2 / 2) ** 2) / 3)),
        "debiased marginal L1": float((l1 + 2 * l1 / 2) / 3),
    }


# ------------------------------------------------------------------------------------------------ one draw
def draw(rng, n: int, f, discrete: bool = False):
    p = rng.choice(LEVELS, n) if discrete else rng.uniform(LO, 1.0, n)
    probs = np.stack([p, (1 - p) / 2, (1 - p) / 2], axis=1)
    return probs, np.where(rng.random(n) < f(p), 0, rng.integers(1, 3, n))


def _debiased_parts(probs, labels, binning: str, boot, position):
    """Per variant: (value, estimate and plug-in on the CE^p scale, raw replicates, replicates on the CE scale)."""
    from hf_calibration.metrics._format import prepare, top_label
    from hf_calibration.metrics.debiased import _Sorted

    top = top_label(prepare(probs, labels, from_logits=False))
    n = labels.shape[0]
    column = _Sorted(top.confidence, top.correct, 15, binning)
    classes = [_Sorted(probs[:, k], (labels == k).astype(np.float64), 15, binning) for k in range(probs.shape[1])]

    def statistic(counts):
        out = [column.replicates(counts, 2, raw=True), column.replicates(counts, 1, raw=True)]
        for c in classes:
            gathered = np.take(counts, position[c.order], axis=1)
            out += [c.replicates(gathered, 2, raw=True), c.replicates(gathered, 1, raw=True)]
        return np.stack(out, axis=1)

    reps = boot.replicates([statistic], n)[0]
    parts = {}
    for power, col in ((2, 0), (1, 1)):
        raw = reps[:, col]
        parts[f"debiased top L{power}"] = (
            column.value(power, None, None),
            column.raw(power),
            column.plugin(power) ** power,
            raw,
            np.sqrt(np.maximum(raw, 0)) if power == 2 else raw,
            column.plugin(power),
        )
        per_class = reps[:, 2 + (power == 1) :: 2]
        values = np.array([c.value(power, None, None) ** power for c in classes])
        raws = np.array([c.raw(power) for c in classes])
        plugins = np.array([c.plugin(power) ** power for c in classes])
        linear = np.mean(np.maximum(per_class, 0) if power == 2 else per_class, axis=1) ** (1 / power)
        parts[f"debiased marginal L{power}"] = (
            float(np.mean(values) ** (1 / power)),
            float(raws.mean()),
            float(plugins.mean()),
            per_class.mean(axis=1),
            linear,
            float(plugins.mean() ** (1 / power)),
        )
    return parts


def intervals_of_a_draw(
    probs, labels, seed: int, discrete: bool = False
) -> dict[str, dict[str, tuple[float, float, str]]]:
    """metric -> method -> (low, high, flag); method "shipped" is the interval the package returns."""
    from hf_calibration.metrics import bootstrap as bs
    from hf_calibration.metrics._format import prepare, top_label
    from hf_calibration.metrics._probability_pass import probability_rows
    from hf_calibration.metrics.adaptive import _adaece_compute, _adaece_statistic
    from hf_calibration.metrics.ece import (
        BINNED_COLUMNS,
        _binned_statistic,
        _classwise_ece_compute,
        _ece_split_compute,
        _mce_compute,
    )
    from hf_calibration.metrics.smooth import (
        _smce_statistic,
        _smece_statistic,
        smce_from_confidence,
        smece_from_confidence,
    )

    boot = bs.check_bootstrap(LEVEL, None, seed)
    small = bs.check_bootstrap(LEVEL, None, seed, default_n_boot=bs.SMOOTH_N_BOOT)
    inputs = prepare(probs, labels, from_logits=False)
    top = top_label(inputs)
    conf, correct = top.confidence, top.correct
    n = conf.shape[0]
    position = bs.frame_position(conf)
    out: dict[str, dict[str, tuple[float, float, str]]] = {}

    def record(name, value, reps, small_boot=False, alternatives=("percentile", "basic"), **kw):
        b = small if small_boot else boot
        shipped = b.interval(value, reps, bs.INTERVALS["debiased_ece" if name.startswith("debiased") else name], **kw)
        out[name] = {"value": (float(value), float(value), ""), "shipped": (shipped.low, shipped.high, shipped.flag)}
        for method in alternatives:
            alt = b.interval(value, reps, bs.IntervalRule(method))
            out[name][method] = (alt.low, alt.high, alt.flag)

    if not discrete:
        rows = probability_rows(inputs, 15, boot=small, position=position)
        split = _ece_split_compute(conf, correct, 15)
        from hf_calibration.metrics.ece import _ece_compute

        values = {
            "accuracy": float(correct.mean()),
            "ece": _ece_compute(conf, correct, 15),
            "mce": _mce_compute(conf, correct, 15),
            "o_ece": split.over,
            "u_ece": split.under,
            "adaece": _adaece_compute(conf, correct, 15),
            "classwise_ece": _classwise_ece_compute(rows.cells, n),
            "brier": rows.brier,
            "nll": rows.nll,
            "smce": smce_from_confidence(conf, correct),
            "smece": smece_from_confidence(conf, correct),
        }
        binned, ada, scores = boot.replicates(
            [
                _binned_statistic(conf, correct, 15),
                _adaece_statistic(conf, correct, 15),
                bs.weighted_means(rows.scores, bs.frame(conf)),
            ],
            n,
        )
        sm, sme = small.replicates([_smce_statistic(conf, correct), _smece_statistic(conf, correct)], n)
        reps = {name: binned[:, c] for c, name in enumerate(BINNED_COLUMNS)}
        reps.update(adaece=ada, brier=scores[:, 0], nll=scores[:, 1])
        for name, r in reps.items():
            record(name, values[name], r)
        record("classwise_ece", values["classwise_ece"], rows.replicates, small_boot=True)
        record("smce", values["smce"], sm, small_boot=True)
        record("smece", values["smece"], sme, small_boot=True)
    for name, (value, raw, plugin_raw, raw_reps, linear_reps, plugin) in _debiased_parts(
        probs, labels, "distinct" if discrete else "equal_mass", boot, position
    ).items():
        power = 2 if name.endswith("L2") else 1
        record(name, value, raw_reps, plugin=plugin_raw, estimate=raw, power=power, alternatives=())
        out[name]["percentile"] = (lambda i: (i.low, i.high, i.flag))(
            boot.interval(value, linear_reps, bs.IntervalRule("percentile"))
        )
        lin = boot.interval(value, linear_reps, bs.IntervalRule("basic_plugin", 0.0, 1.0), plugin=plugin)
        out[name]["basic on CE"] = (lin.low, lin.high, lin.flag)
    return out


def check_public(probs, labels, seed: int, got: dict, discrete: bool = False) -> None:
    """The public functions return the intervals computed above (the benchmark measures what ships)."""
    from hf_calibration import metrics

    kw = dict(ci=LEVEL, seed=seed, from_logits=False)
    calls = {}
    if not discrete:
        report = metrics.calibration_report(probs, labels, **kw)
        calls.update({name: report[name] for name in REPORT_METRICS})
        calls.update(
            ece=metrics.ece(probs, labels, **kw),
            classwise_ece=metrics.classwise_ece(probs, labels, **kw),
            smece=metrics.smece(probs, labels, **kw),
            nll=metrics.nll(probs, labels, **kw),
        )
    binning = "distinct" if discrete else "equal_mass"
    for name in DEBIASED:
        calls[name] = metrics.debiased_ece(
            probs,
            labels,
            p=2 if name.endswith("L2") else 1,
            mode="top-label" if " top " in name else "marginal",
            binning=binning,
            **kw,
        )
    for name, value in calls.items():
        low, high, _ = got[name]["shipped"]
        same = (
            np.allclose([value.low, value.high], [low, high], atol=1e-12, equal_nan=True)
            and abs(float(value) - got[name]["value"][0]) < 1e-12
        )
        if not same:
            raise AssertionError(f"{name}: the package gives {value!r}, the benchmark computed [{low}, {high}]")


# ------------------------------------------------------------------------------------------------ the run
def _key(name: str, n: int) -> str:
    return f"{name} | N={n}"


def run_cell(name: str, n: int, draws: int, state: dict, save) -> None:
    discrete = name == DISCRETE
    f = DISCRETE_MAP if discrete else MAPS[name]
    cell = state.setdefault(_key(name, n), {"draws": []})
    index = (list(MAPS) + [DISCRETE]).index(name)
    start = time.perf_counter()
    for d in range(len(cell["draws"]), draws):
        rng = np.random.default_rng([index, n, d])
        probs, labels = draw(rng, n, f, discrete)
        got = intervals_of_a_draw(probs, labels, d, discrete)
        if d == 0:
            check_public(probs, labels, d, got, discrete)
        cell["draws"].append(
            {
                m: {k: [None if isinstance(x, float) and np.isnan(x) else x for x in v] for k, v in methods.items()}
                for m, methods in got.items()
            }
        )
        if (d + 1) % 10 == 0 or d + 1 == draws:
            save()
            print(f"{name}, N = {n}: {d + 1}/{draws} draws ({time.perf_counter() - start:.0f} s)", flush=True)


def summarise(cell: dict, true: dict[str, float]) -> dict:
    """metric -> method -> {coverage, outside, width, flagged, none}."""
    out = {}
    draws = cell["draws"]
    for metric in draws[0]:
        out[metric] = {}
        for method in draws[0][metric]:
            if method == "value":
                continue
            cover = outside = width = flagged = none = silent = 0
            for d in draws:
                low, high, flag = d[metric][method]
                value = d[metric]["value"][0]
                if low is None:
                    none += 1
                    continue
                cover += low - 1e-12 <= true[metric] <= high + 1e-12
                outside += not (low <= value <= high)
                silent += not (low <= value <= high) and not flag
                width += high - low
                flagged += bool(flag)
            k = len(draws)
            out[metric][method] = {
                "coverage": cover / k,
                "outside": outside / k,
                "width": width / max(k - none, 1),
                "flagged": flagged / k,
                "none": none / k,
                "silent": silent,
            }
    return out


def markdown(state: dict, truths: dict, sizes, draws: int, seconds: float, load) -> str:
    se = 100 * np.sqrt(LEVEL * (1 - LEVEL) / draws)
    lines = [
        "## Bootstrap coverage (`benchmarks/bootstrap_coverage.py`)",
        "",
        f"- command: `python benchmarks/bootstrap_coverage.py` ({draws} draws at N = {' and '.join(f'{n:,}' for n in sizes)}; "
        + (
            f"{seconds / 60:.0f} min of this run, load average at its start {load[0]:.1f})"
            if seconds is not None
            else "this table written from the draws kept so far, `--table-only`)"
        ),
        f"- model and true values: see the script's docstring (K = 3, a known map `f(p)` from confidence to accuracy; "
        f"true values by integration). 95 % intervals, 1,000 resamples (smCE, smECE, classwise ECE 200). A correct "
        f"interval covers 95 % of the time, ± {se:.1f} points (one standard error over {draws} draws): the target band "
        "is 93-97 %.",
        "- columns: **shipped** is the interval the package returns (`bootstrap.INTERVALS`: basic for the calibration "
        "errors, percentile for accuracy / Brier / NLL, basic with the plug-in as pivot on the CE^p scale for "
        "debiased_ece, none for MCE); **outside**: how often the printed estimate lies outside its own interval; "
        "**noted**: how often the shipped interval carries a note (estimate outside it, interval reaching 0) or is "
        "none; the alternatives' coverage from the same resamples.",
        "",
    ]
    short: dict[str, list[str]] = {}
    missing: list[str] = []
    silent = [0, 0]  # shipped intervals that leave out their estimate without a note, of all shipped intervals
    for n in sizes:
        lines += [
            f"### N = {n:,}",
            "",
            "| map | metric | true value | shipped coverage (%) | outside (%) | noted (%) | percentile (%) | basic (%) | basic on CE (%) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in list(MAPS) + [DISCRETE]:
            key = _key(name, n)
            done = len(state.get(key, {"draws": []})["draws"])
            if done < MIN_DRAWS:
                missing.append(f"{name} at N = {n:,} ({done} of {draws} draws)")
                continue
            label = name if done >= draws else f"{name} (**{done} of {draws} draws so far**)"
            if done < draws:
                missing.append(f"{name} at N = {n:,} ({done} of {draws} draws)")
            summary = summarise({"draws": state[key]["draws"][:draws]}, truths[name])
            for metric, methods in summary.items():
                shipped = methods["shipped"]
                silent[0] += shipped["silent"]
                silent[1] += len(state[key]["draws"][:draws])
                noted = shipped["flagged"] + shipped["none"]
                cov = "no interval" if shipped["none"] == 1 else f"{100 * shipped['coverage']:.1f}"
                alt = lambda m: f"{100 * methods[m]['coverage']:.1f}" if m in methods else ""  # noqa: E731
                lines.append(
                    f"| {label} | {metric} | {truths[name][metric]:.4f} | {cov} | {100 * shipped['outside']:.1f} | "
                    f"{100 * noted:.1f} | {alt('percentile')} | {alt('basic')} | {alt('basic on CE')} |"
                )
                if shipped["none"] < 1 and not BAND[0] <= shipped["coverage"] <= BAND[1]:
                    c = 100 * shipped["coverage"]
                    gap = f"{93 - c:.1f} points below 93 %" if c < 93 else f"{c - 97:.1f} points above 97 %"
                    short.setdefault(metric, []).append(
                        f"{c:.1f} % ({gap}) on {name}, N = {n:,}" + ("" if done >= draws else f", {done} draws")
                    )
        lines.append("")
    lines += [
        f"Estimates outside their own shipped interval **without a note**: {silent[0]} of {silent[1]:,} intervals "
        "(every other estimate outside its interval carries the note that says so).",
        "",
        "### Outside the 93-97 % band (shipped intervals)",
        "",
        "Above the band at a true value of 0 (U-ECE of an over-confident model, the debiased L2 error of a calibrated "
        "one): the interval is [0, 0] or reaches 0 and says so; it over-covers, which is harmless. Below the band at "
        "a true value of 0 (a calibrated model): a plug-in error is biased upwards there and no bootstrap interval "
        "of it is consistent at the boundary; its note says the interval reaches 0 or lies below the estimate.",
        "",
    ]
    if short:
        lines += [f"- **{metric}**: " + "; ".join(cells) for metric, cells in short.items()]
    else:
        lines.append("- none")
    lines += [
        "- **MCE**: no interval is printed (a maximum over bins: its bootstrap is inconsistent when several bins "
        "are near the maximum); the value comes back with `low = high = nan` and a note saying why.",
        "",
    ]
    if missing:
        lines += [
            "Cells not finished (re-run the same command: finished draws are kept and skipped): "
            + "; ".join(missing)
            + ".",
            "",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--state", type=Path, default=STATE, help="the resumable JSON of per-draw results")
    parser.add_argument(
        "--table-only", action="store_true", help="write the tables from the draws kept so far, draw nothing"
    )
    args = parser.parse_args()
    load = os.getloadavg()
    state = json.loads(args.state.read_text()) if args.state.exists() else {}
    args.state.parent.mkdir(parents=True, exist_ok=True)

    def save():
        tmp = args.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(args.state)

    if args.table_only and "truths" in state:
        truths = state["truths"]
    else:
        truths = {name: truth(f) for name, f in MAPS.items()}
        truths[DISCRETE] = discrete_truth()
    state["truths"] = truths
    start = time.perf_counter()
    for n in args.sizes:
        for name in list(MAPS) + [DISCRETE]:
            if not args.table_only:
                run_cell(name, n, args.draws, state, save)
    text = markdown(
        state, truths, args.sizes, args.draws, None if args.table_only else time.perf_counter() - start, load
    )
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
