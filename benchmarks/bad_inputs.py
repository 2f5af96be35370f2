"""Bad-input matrix: the calls a new user makes with bad or tricky input, across metrics, calibrators, losses, CLI.

Run from the repository root:  python benchmarks/bad_inputs.py [-v]   (writes benchmarks/results/bad_inputs.md)

Every case is one call, classified by what it did:

* clear error   a ValueError / TypeError (the command line: exit status 1 or 2 with one line on stderr; the Hub:
                a ConnectionError sentence) whose message names the argument or file at fault, and no file of the
                user's changed;
* correct       a value equal, to a stated tolerance, to an independent computation (numpy / scipy formulas in
                this file on clean float64 input, relplot for smECE, scipy for the temperature);
* SILENT WRONG / crash   anything else: a wrong value, bad input accepted, another exception, a traceback, an
                error that names nothing, a user's file replaced.

Cases whose right answer is only an error have no reference. This is a sweep, not a test: it prints counts per
category and every case that is not well behaved, and exits 0 either way.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: the push cases must meet an unreachable Hub
os.environ.setdefault("HF_CALIBRATION_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "bad_inputs.md"
sys.path.insert(0, str(ROOT))

from hf_calibration import losses, metrics  # noqa: E402
from hf_calibration.calibrators import SMARTCalibrator, TemperatureScaling, load_calibrator  # noqa: E402

ERROR, CORRECT, BAD = "clear error", "correct", "SILENT WRONG / crash"

# The issue-23 items (third sweep) each builder's calls cover.
ISSUE_23_ITEMS = {
    "detection_cases": "1",
    "per_class_cases": "2",
    "image_cases": "3, 12",
    "cache_cases": "4",
    "user_file_cases": "5, 6, 7, 12",
    "accumulator_cases": "8, 12, 13",
    "model_route_cases": "7, 10, 11",
    "smaller_cases": "12",
    "maccal_feature_cases": "9",
    "diagram_cases": "14",
    "demo_log_cases": "15",
}
# The issue-29 items (fourth sweep, section 3) each builder's calls cover.
ISSUE_29_ITEMS = {
    "small_sample_cases": "1, 2, 7",
    "conformal_cases": "3, 4, 5, 6, 11, 12",
    "loading_cases": "10, 11",
    "friction_cases": "8, 9, 11, 13, 14, 15",
}

# Which branch of the round-2 work owns the behaviour an area's cases probe (the lead re-runs after merging).
AREA_OWNER = {"metrics": "metrics", "losses": "losses", "calibrators": "calibrators / CLI", "CLI": "calibrators / CLI"}


@dataclass
class Case:
    category: str
    area: str  # metrics / calibrators / losses / CLI
    name: str
    call: Callable[[], Any]
    names: tuple[str, ...] = ()  # a clear error names one of these (argument, option or file)
    reference: Callable[[], Any] | None = None  # the right value, computed independently; None: only an error is right
    atol: float = 1e-9
    untouched: Callable[[], bool] | None = None  # after the call: the user's files are as they were
    source: str = ""  # the function that built it (filled by run)


# ----------------------------------------------------------------------------- independent references (numpy, float64)


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _bins(p: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bins lo < p <= hi on (0, 1]; p = 0 in the first bin."""
    return np.clip(np.ceil(p * n_bins).astype(np.int64) - 1, 0, n_bins - 1)


def _binned_gaps(conf, hit, index, n_bins):
    count = np.bincount(index, minlength=n_bins)
    gap = np.abs(np.bincount(index, conf, n_bins) - np.bincount(index, hit, n_bins))
    return count, gap


def ref_ece(p, y, n_bins=15):
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    _, gap = _binned_gaps(conf, hit, _bins(conf, n_bins), n_bins)
    return gap.sum() / len(y)


def ref_mce(p, y, n_bins=15):
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    count, gap = _binned_gaps(conf, hit, _bins(conf, n_bins), n_bins)
    return max(g / c for g, c in zip(gap, count) if c)


def ref_adaece(p, y, n_bins=15):
    """Equal-count bins of the sorted confidences (len(y) divisible by n_bins here: no rounding choice)."""
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    order = np.argsort(conf, kind="stable")
    return sum(abs(conf[b].sum() - hit[b].sum()) for b in np.array_split(order, n_bins)) / len(y)


def ref_classwise_ece(p, y, n_bins=15):
    k = p.shape[1]
    return np.mean(
        [
            _binned_gaps(p[:, c], (y == c).astype(float), _bins(p[:, c], n_bins), n_bins)[1].sum() / len(y)
            for c in range(k)
        ]
    )


def ref_brier(p, y):
    return float(((p - np.eye(p.shape[1])[y]) ** 2).sum(1).mean())


def ref_nll(p, y):
    return float(-np.log(p[np.arange(len(y)), y]).mean())


def ref_smece(p, y):
    import relplot

    return float(relplot.smECE(p.max(1), (p.argmax(1) == y).astype(float)))


def ref_ts_temperature(z, y, bounds=(0.05, 100.0)):
    """The NLL-optimal temperature by scipy (bounded scalar search in log T), in temperature scaling's range."""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    z = np.asarray(z, dtype=np.float64)
    nll = lambda t: -log_softmax(z / np.exp(t), axis=1)[np.arange(len(y)), y].mean()  # noqa: E731
    return float(np.exp(minimize_scalar(nll, bounds=np.log(bounds), method="bounded", options={"xatol": 1e-10}).x))


# ----------------------------------------------------------------------------- data


def make_data(n=600, k=5, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = 3.0 * (rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y]) + rng.normal(scale=4.0, size=(n, 1))
    return z, y


Z, Y = make_data()
P = softmax(Z)
Z32 = Z.astype(np.float32)
K = Z.shape[1]


# ----------------------------------------------------------------------------- the command line


def cli(*argv) -> str:
    """Run ``hf-calibration`` in-process. A one-line error (exit 1 or 2) becomes a ValueError carrying that line; a
    traceback or several lines a RuntimeError (a crash); success returns stdout."""
    from hf_calibration.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_info:
            code = exit_info.code
    lines = err.getvalue().strip().splitlines()
    if code == 0:
        return out.getvalue()
    if code in (1, 2) and len(lines) == 1 and "Traceback" not in lines[0]:
        raise ValueError(lines[0])
    raise RuntimeError(f"exit {code}, stderr: {' / '.join(lines[-3:])}")


# ----------------------------------------------------------------------------- the cases


def metric_cases(tmp: Path) -> list[Case]:
    m = metrics
    cases: list[Case] = []
    add = cases.append
    refs = {
        "ece": (m.ece, ref_ece),
        "mce": (m.mce, ref_mce),
        "adaece": (m.adaece, ref_adaece),
        "classwise_ece": (m.classwise_ece, ref_classwise_ece),
        "brier": (m.brier, ref_brier),
        "nll": (m.nll, ref_nll),
        "smece": (m.smece, ref_smece),
    }
    for name, (fn, ref) in refs.items():
        add(
            Case(
                "probabilities vs logits",
                "metrics",
                f"{name}(logits)",
                lambda fn=fn: fn(Z, Y),
                reference=lambda ref=ref: ref(P, Y),
                atol=1e-6 if name == "smece" else 1e-9,
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "metrics",
                f"{name}(probs), from_logits default",
                lambda fn=fn: fn(P, Y),
                ("from_logits",),
                lambda ref=ref: ref(P, Y),
                atol=1e-6 if name == "smece" else 1e-9,
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "metrics",
                f"{name}(probs, from_logits=False)",
                lambda fn=fn: fn(P, Y, from_logits=False),
                reference=lambda ref=ref: ref(P, Y),
                atol=1e-6 if name == "smece" else 1e-9,
            )
        )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "calibration_report(probs).ece",
            lambda: m.calibration_report(P, Y).ece,
            ("from_logits",),
            lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "calibration_report(float16 softmax as float32).ece",
            lambda: m.calibration_report(P.astype(np.float16).astype(np.float32), Y).ece,
            ("from_logits",),
            lambda: ref_ece(P.astype(np.float16).astype(np.float64), Y),
            atol=1e-6,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "reliability_table(probs).ece",
            lambda: m.reliability_table(P, Y).ece,
            ("from_logits",),
            lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "ece(logits, from_logits=False)",
            lambda: m.ece(Z, Y, from_logits=False),
            ("preds", "from_logits"),
        )
    )

    def evaluate_ece(preds):
        import evaluate

        from hf_calibration import metric_path

        return evaluate.load(metric_path("ece")).compute(predictions=preds, references=Y)["ece"]

    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "evaluate ece script (probs)",
            lambda: evaluate_ece(P),
            ("from_logits",),
            lambda: ref_ece(P, Y),
            atol=1e-6,
        )
    )

    bad = Z.copy()
    bad[3, 1] = np.nan
    inf = Z.copy()
    inf[5, 0] = np.inf
    for name in ("ece", "brier", "nll", "classwise_ece", "smce", "calibration_report"):
        fn = getattr(m, name)
        add(
            Case(
                "NaN / inf", "metrics", f"{name}(logits with NaN)", lambda fn=fn: fn(bad, Y), ("preds", "row 3", "NaN")
            )
        )
        add(
            Case(
                "NaN / inf", "metrics", f"{name}(logits with inf)", lambda fn=fn: fn(inf, Y), ("preds", "row 5", "inf")
            )
        )
    add(
        Case(
            "NaN / inf",
            "metrics",
            "ece(probs with NaN, from_logits=False)",
            lambda: m.ece(np.where(np.arange(K) == 0, np.nan, P), Y, from_logits=False),
            ("preds",),
        )
    )

    add(Case("rank / shape", "metrics", "ece(1-D preds)", lambda: m.ece(Z[:, 0], Y), ("preds",)))
    add(Case("rank / shape", "metrics", "ece(3-D preds)", lambda: m.ece(Z[None], Y), ("preds",)))
    add(Case("rank / shape", "metrics", "ece(N mismatch)", lambda: m.ece(Z, Y[:-1]), ("preds", "target")))
    add(Case("rank / shape", "metrics", "ece(K = 1)", lambda: m.ece(Z[:, :1], Y * 0), ("preds",)))
    add(Case("rank / shape", "metrics", "ece(2-D target)", lambda: m.ece(Z, Y[:, None]), ("target",)))
    add(Case("rank / shape", "metrics", "ragged list preds", lambda: m.ece([[0.1, 0.2], [0.3]], [0, 1]), ("preds",)))

    add(Case("dtype", "metrics", "ece(int preds)", lambda: m.ece(Z.astype(np.int64), Y), ("preds",)))
    add(Case("dtype", "metrics", "ece(float labels)", lambda: m.ece(Z, Y.astype(np.float32)), ("target",)))
    add(Case("dtype", "metrics", "ece(bool labels)", lambda: m.ece(Z, Y.astype(bool)), ("target",)))
    add(Case("dtype", "metrics", "ece(complex preds)", lambda: m.ece(Z.astype(complex), Y), ("preds",)))
    add(Case("dtype", "metrics", "ece(str preds)", lambda: m.ece("logits", Y), ("preds",)))
    add(
        Case(
            "dtype",
            "metrics",
            "ece(float16 logits)",
            lambda: m.ece(Z.astype(np.float16), Y),
            reference=lambda: ref_ece(softmax(Z.astype(np.float16)), Y),
            atol=1e-6,
        )
    )
    add(
        Case(
            "dtype",
            "metrics",
            "ece(bfloat16 torch logits)",
            lambda: m.ece(torch.from_numpy(Z).bfloat16(), torch.from_numpy(Y)),
            reference=lambda: ref_ece(softmax(torch.from_numpy(Z).bfloat16().double().numpy()), Y),
            atol=1e-6,
        )
    )
    add(
        Case(
            "dtype",
            "metrics",
            "ece(uint8 labels)",
            lambda: m.ece(Z, Y.astype(np.uint8)),
            reference=lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "dtype",
            "metrics",
            "ece(int32 torch labels)",
            lambda: m.ece(torch.from_numpy(Z), torch.from_numpy(Y).int()),
            reference=lambda: ref_ece(P, Y),
        )
    )

    add(
        Case(
            "memory layout",
            "metrics",
            "ece(every other row)",
            lambda: m.ece(Z[::2], Y[::2]),
            reference=lambda: ref_ece(P[::2], Y[::2]),
        )
    )
    add(
        Case(
            "memory layout",
            "metrics",
            "ece(negative strides)",
            lambda: m.ece(Z[::-1], Y[::-1]),
            reference=lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "memory layout",
            "metrics",
            "ece(big-endian)",
            lambda: m.ece(Z.astype(">f8"), Y.astype(">i8")),
            reference=lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "memory layout",
            "metrics",
            "brier(Fortran order)",
            lambda: m.brier(np.asfortranarray(Z), Y),
            reference=lambda: ref_brier(P, Y),
        )
    )
    add(
        Case(
            "memory layout",
            "metrics",
            "nll(transposed view of (K, N))",
            lambda: m.nll(np.ascontiguousarray(Z.T).T, Y),
            reference=lambda: ref_nll(P, Y),
        )
    )

    y_bad = Y.copy()
    y_bad[4] = K
    y_neg = Y.copy()
    y_neg[4] = -1
    y_ign = Y.copy()
    y_ign[::3] = -100
    keep = y_ign != -100
    add(Case("labels", "metrics", "ece(label = K)", lambda: m.ece(Z, y_bad), ("target",)))
    add(Case("labels", "metrics", "ece(label = -1)", lambda: m.ece(Z, y_neg), ("target",)))
    add(
        Case(
            "labels",
            "metrics",
            "ece(labels -100 ignored)",
            lambda: m.ece(Z, y_ign),
            reference=lambda: ref_ece(P[keep], Y[keep]),
        )
    )
    add(
        Case(
            "labels",
            "metrics",
            "brier(labels -100 ignored)",
            lambda: m.brier(Z, y_ign),
            reference=lambda: ref_brier(P[keep], Y[keep]),
        )
    )
    add(
        Case(
            "labels",
            "metrics",
            "ece(every label -100)",
            lambda: m.ece(Z, np.full_like(Y, -100)),
            ("target", "ignore_index"),
        )
    )
    add(
        Case(
            "labels",
            "metrics",
            "ece(ignore_index=None, a -100 label)",
            lambda: m.ece(Z, y_ign, ignore_index=None),
            ("target",),
        )
    )
    add(Case("labels", "metrics", "ece(ignore_index=2.5)", lambda: m.ece(Z, Y, ignore_index=2.5), ("ignore_index",)))

    add(
        Case("empty input", "metrics", "ece(N = 0)", lambda: m.ece(np.zeros((0, K)), np.zeros(0, np.int64)), ("preds",))
    )
    add(
        Case(
            "empty input",
            "metrics",
            "calibration_report(N = 0)",
            lambda: m.calibration_report(np.zeros((0, K)), np.zeros(0, np.int64)),
            ("preds",),
        )
    )
    add(
        Case(
            "empty input",
            "metrics",
            "smece(N = 0)",
            lambda: m.smece(np.zeros((0, K)), np.zeros(0, np.int64)),
            ("preds",),
        )
    )

    big = Z * 1e4
    near_max = Z / np.abs(Z).max() * 1e308
    tied = np.zeros((60, K))
    y_t = np.arange(60) % K
    add(
        Case(
            "extreme values",
            "metrics",
            "ece(logits x 1e4)",
            lambda: m.ece(big, Y),
            reference=lambda: ref_ece(softmax(big), Y),
        )
    )
    add(
        Case(
            "extreme values",
            "metrics",
            "nll(logits x 1e4)",
            lambda: m.nll(big, Y),
            reference=lambda: ref_nll_logits(big, Y),
            atol=1e-6,
        )
    )
    for name, ref in (
        ("ece", lambda: ref_ece(softmax(near_max), Y)),
        ("brier", lambda: ref_brier(softmax(near_max), Y)),
        ("nll", lambda: ref_nll_logits(near_max, Y)),
        ("classwise_ece", lambda: ref_classwise_ece(softmax(near_max), Y)),
    ):
        # finite logits: "NaN or inf" would be the wrong reason; an error must name the real one (magnitude / overflow)
        add(
            Case(
                "extreme values",
                "metrics",
                f"{name}(finite logits near 1e308)",
                lambda name=name: getattr(m, name)(near_max, Y),
                ("overflow", "too large", "magnitude", "1e308"),
                ref,
                atol=1e-6,
            )
        )
    add(
        Case(
            "extreme values",
            "metrics",
            "ece(all logits equal: confidence 1/K)",
            lambda: m.ece(tied, y_t),
            reference=lambda: ref_ece(softmax(tied), y_t),
        )
    )
    add(
        Case(
            "extreme values",
            "metrics",
            "adaece(tied confidences, perfectly calibrated)",
            lambda: m.adaece(
                np.array([[0.6, 0.4]] * 1000), np.r_[np.zeros(600, int), np.ones(400, int)], from_logits=False
            ),
            reference=lambda: 0.0,
            atol=1e-9,
        )
    )

    add(Case("hyper-parameters", "metrics", "ece(n_bins=0)", lambda: m.ece(Z, Y, 0), ("n_bins",)))
    add(Case("hyper-parameters", "metrics", "ece(n_bins=1.5)", lambda: m.ece(Z, Y, 1.5), ("n_bins",)))
    add(Case("hyper-parameters", "metrics", "ece(n_bins=True)", lambda: m.ece(Z, Y, True), ("n_bins",)))
    add(Case("hyper-parameters", "metrics", "ece(n_bins='15')", lambda: m.ece(Z, Y, "15"), ("n_bins",)))
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "reliability_diagram(n_bins=10**12)",
            lambda: m.reliability_diagram(Z, Y, 10**12),
            ("n_bins",),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "ece(from_logits='yes')",
            lambda: m.ece(Z, Y, from_logits="yes"),
            ("from_logits",),
        )
    )
    return cases


def ref_nll_logits(z, y):
    """Mean of ``logsumexp(z_i) - z_iy`` in extended precision (long double: no overflow for float64 logits near 1e308)."""
    z = np.asarray(z, dtype=np.longdouble)
    top = z.max(axis=1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    return float((lse - z[np.arange(len(y)), y]).mean())


def _fit(cls, z, y, **kw):
    return cls(**({"max_steps": 300} if cls is SMARTCalibrator else {})).fit(z, y, progress_bar=False, **kw)


def calibrator_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    t_ref = ref_ts_temperature(Z, Y)
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=300).fit(Z, Y, progress_bar=False)
    smart_ref = smart.predict_proba(
        Z
    ).numpy()  # SMART's own fit on logits: the probabilities must not depend on the form
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "TS fit(logits): T",
            lambda: TemperatureScaling().fit(Z, Y, progress_bar=False).fitted_temperature,
            reference=lambda: t_ref,
            atol=1e-5,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "TS fit(probs), detected: T",
            lambda: TemperatureScaling().fit(P, Y, progress_bar=False).fitted_temperature,
            ("from_logits",),
            lambda: t_ref,
            atol=1e-5,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "TS fit(probs, from_logits=False): T",
            lambda: TemperatureScaling().fit(P, Y, from_logits=False, progress_bar=False).fitted_temperature,
            ("from_logits",),
            lambda: t_ref,
            atol=1e-5,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "TS predict_proba(probs)",
            lambda: ts.predict_proba(P).numpy(),
            ("from_logits",),
            lambda: softmax(Z / ts.fitted_temperature),
            atol=1e-9,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "SMART fit(probs): predict_proba",
            lambda: SMARTCalibrator(max_steps=300).fit(P, Y, progress_bar=False).predict_proba(Z).numpy(),
            ("from_logits",),
            lambda: smart_ref,
            atol=1e-9,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "SMART predict_proba(probs)",
            lambda: smart.predict_proba(P).numpy(),
            ("from_logits",),
            lambda: smart_ref,
            atol=1e-9,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "TS forward(logits, from_logits=False)",
            lambda: ts(Z, from_logits=False),
            ("logits", "from_logits"),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "TS fit(probs rows summing to 0.9, from_logits=False)",
            lambda: TemperatureScaling().fit(P * 0.9, Y, from_logits=False, progress_bar=False),
            ("logits",),
        )
    )

    bad = Z.copy()
    bad[7, 2] = np.nan
    for cls in (TemperatureScaling, SMARTCalibrator):
        add(
            Case(
                "NaN / inf",
                "calibrators",
                f"{cls.__name__}.fit(NaN logits)",
                lambda cls=cls: _fit(cls, bad, Y),
                ("logits",),
            )
        )
        add(
            Case(
                "NaN / inf",
                "calibrators",
                f"{cls.__name__}.fit(inf logits)",
                lambda cls=cls: _fit(cls, np.where(bad != bad, np.inf, bad), Y),
                ("logits",),
            )
        )
    add(Case("NaN / inf", "calibrators", "TS forward(NaN logits)", lambda: ts(bad), ("logits",)))
    add(
        Case(
            "NaN / inf",
            "calibrators",
            "SMART forward(-inf logits)",
            lambda: smart(np.where(bad != bad, -np.inf, bad)),
            ("logits",),
        )
    )
    add(
        Case(
            "NaN / inf",
            "calibrators",
            "SMART forward(fp16 logits that overflow after scaling)",
            lambda: bool(
                torch.isfinite(
                    smart(
                        torch.full((2, K), 6e4, dtype=torch.float16)
                        * torch.tensor([1.0, 0.5, 0, 0, 0], dtype=torch.float16)
                    )
                ).all()
            ),
            reference=lambda: True,
        )
    )

    add(Case("rank / shape", "calibrators", "TS forward(1-D)", lambda: ts(Z[0]), ("logits",)))
    add(Case("rank / shape", "calibrators", "TS forward(K = 1)", lambda: ts(Z[:, :1]), ("logits",)))
    add(
        Case(
            "rank / shape",
            "calibrators",
            "TS fit(N mismatch)",
            lambda: TemperatureScaling().fit(Z, Y[:-1]),
            ("logits", "labels"),
        )
    )
    add(
        Case(
            "rank / shape",
            "calibrators",
            "SMART fit(too few samples)",
            lambda: SMARTCalibrator().fit(Z[:20], Y[:20]),
            ("samples",),
        )
    )
    add(
        Case(
            "rank / shape",
            "calibrators",
            "TS forward(other K): z / T",
            lambda: ts(torch.from_numpy(np.c_[Z, Z[:, :1]])).numpy(),
            reference=lambda: np.c_[Z, Z[:, :1]] / ts.fitted_temperature,
            atol=1e-9,
        )
    )
    add(
        Case(
            "rank / shape",
            "calibrators",
            "TS forward(N = 0)",
            lambda: ts(np.zeros((0, K))).shape,
            reference=lambda: (0, K),
        )
    )

    add(Case("dtype", "calibrators", "TS forward(int logits)", lambda: ts(Z.astype(np.int64)), ("logits",)))
    add(Case("dtype", "calibrators", "TS forward(object array)", lambda: ts(Z.astype(object)), ("logits",)))
    add(Case("dtype", "calibrators", "TS forward(longdouble)", lambda: ts(Z.astype(np.longdouble)), ("logits",)))
    add(Case("dtype", "calibrators", "TS forward(list)", lambda: ts(Z.tolist()), ("logits",)))
    add(
        Case(
            "dtype",
            "calibrators",
            "TS fit(float labels)",
            lambda: TemperatureScaling().fit(Z, Y.astype(float)),
            ("labels",),
        )
    )
    add(
        Case(
            "dtype",
            "calibrators",
            "SMART forward(bf16)",
            lambda: smart(torch.from_numpy(Z32).bfloat16()).float().argmax(1).numpy(),
            reference=lambda: torch.from_numpy(Z32).bfloat16().float().argmax(1).numpy(),
        )
    )
    add(
        Case(
            "dtype",
            "calibrators",
            "TS forward(float16 numpy)",
            lambda: ts(Z.astype(np.float16)).double().numpy(),
            reference=lambda: Z.astype(np.float16).astype(np.float64) / ts.fitted_temperature,
            atol=0.02,
        )
    )

    for label, arr in (
        ("negative strides", Z[::-1]),
        ("big-endian", Z.astype(">f8")),
        ("Fortran order", np.asfortranarray(Z)),
        ("every other row", Z[::2]),
    ):
        add(
            Case(
                "memory layout",
                "calibrators",
                f"TS forward({label})",
                lambda arr=arr: ts(arr).numpy(),
                ("logits",),
                lambda arr=arr: np.asarray(arr, dtype=np.float64) / ts.fitted_temperature,
                atol=1e-12,
            )
        )
        add(
            Case(
                "memory layout",
                "calibrators",
                f"SMART predict_proba({label})",
                lambda arr=arr: smart.predict_proba(arr).numpy(),
                ("logits",),
                lambda arr=arr: smart.predict_proba(np.ascontiguousarray(arr, dtype=np.float64)).numpy(),
                atol=0,
            )
        )
    add(
        Case(
            "memory layout",
            "calibrators",
            "TS fit(big-endian, reversed)",
            lambda: (
                TemperatureScaling()
                .fit(Z.astype(">f8")[::-1], Y[::-1].astype(">i8"), progress_bar=False)
                .fitted_temperature
            ),
            ("logits",),
            lambda: t_ref,
            atol=1e-5,
        )
    )

    y_ign = Y.copy()
    y_ign[::3] = -100
    keep = y_ign != -100
    add(
        Case(
            "labels",
            "calibrators",
            "TS fit(labels -100 ignored): T",
            lambda: TemperatureScaling().fit(Z, y_ign, progress_bar=False).fitted_temperature,
            reference=lambda: ref_ts_temperature(Z[keep], Y[keep]),
            atol=1e-5,
        )
    )
    add(
        Case(
            "labels",
            "calibrators",
            "TS fit(label = K)",
            lambda: TemperatureScaling().fit(Z, np.where(np.arange(len(Y)) == 3, K, Y)),
            ("labels",),
        )
    )
    add(
        Case(
            "labels",
            "calibrators",
            "TS fit(every label -100)",
            lambda: TemperatureScaling().fit(Z, np.full_like(Y, -100)),
            ("labels", "ignore_index"),
        )
    )
    add(Case("labels", "calibrators", "TS fit(no labels)", lambda: TemperatureScaling().fit(Z), ("labels",)))

    add(
        Case(
            "empty input",
            "calibrators",
            "TS fit(N = 0)",
            lambda: TemperatureScaling().fit(np.zeros((0, K)), np.zeros(0, np.int64)),
            ("logits",),
        )
    )
    add(
        Case(
            "empty input",
            "calibrators",
            "SMART fit(N = 0)",
            lambda: SMARTCalibrator().fit(np.zeros((0, K)), np.zeros(0, np.int64)),
            ("logits",),
        )
    )

    sat_z, sat_y = make_data(1000, 10, seed=1)
    sat_z = np.round(sat_z / 3 * 1e4)  # saturated: every softmax confidence rounds to 0 or 1

    def saturated_temperature():
        temps = SMARTCalibrator().fit(sat_z, sat_y, progress_bar=False).temperature(sat_z)
        return float(temps[0]) if bool((temps == temps[0]).all()) else float("nan")  # one T for every margin

    add(
        Case(
            "extreme values",
            "calibrators",
            "SMART fit(logits x 1e4): a constant T, TS's NLL temperature",
            saturated_temperature,
            reference=lambda: ref_ts_temperature(sat_z, sat_y),
            atol=1e-3 * ref_ts_temperature(sat_z, sat_y),
        )
    )
    rng = np.random.default_rng(3)
    y_ok = rng.integers(0, 5, 200)
    z_ok = rng.normal(size=(200, 5)) + 6 * np.eye(5)[y_ok]
    add(
        Case(
            "extreme values",
            "calibrators",
            "TS fit(every sample correct): T at its 0.05 bound",
            lambda: TemperatureScaling().fit(z_ok, y_ok, progress_bar=False).fitted_temperature,
            reference=lambda: 0.05,
            atol=1e-9,
        )
    )
    tied = Z.copy()
    tied[:50, 1] = tied[:50].max(1)
    add(
        Case(
            "extreme values",
            "calibrators",
            "SMART forward(tied top-2): argmax kept",
            lambda: smart(tied).argmax(1).numpy(),
            reference=lambda: tied.argmax(1),
        )
    )
    add(
        Case(
            "extreme values",
            "calibrators",
            "TS predict_proba(probabilities with zeros)",
            lambda: ts.predict_proba(np.eye(K)[Y]).numpy(),
            reference=lambda: softmax(
                np.log(np.maximum(np.eye(K)[Y], np.finfo(np.float64).tiny)) / ts.fitted_temperature
            ),
            atol=1e-12,
        )
    )

    for name, make in (
        ("SMART(hidden_size=0)", lambda: SMARTCalibrator(hidden_size=0)),
        ("SMART(lr=-1)", lambda: SMARTCalibrator(lr=-1.0)),
        ("SMART(eps=0)", lambda: SMARTCalibrator(eps=0.0)),
        ("SMART(seed=2**70)", lambda: SMARTCalibrator(seed=2**70)),
        ("SMART(seed=1.5)", lambda: SMARTCalibrator(seed=1.5)),
        ("SMART(max_steps=0)", lambda: SMARTCalibrator(max_steps=0)),
        ("TS(lr=nan)", lambda: TemperatureScaling(lr=float("nan"))),
        ("TS(max_iter=True)", lambda: TemperatureScaling(max_iter=True)),
    ):
        arg = name.split("(")[1].split("=")[0]
        add(Case("hyper-parameters", "calibrators", name, make, (arg,)))
    for name, kw, arg in (
        ("fit(objective='ece')", {"objective": "ece"}, "objective"),
        ("fit(objective='soft_ece', sigma=1e-300)", {"objective": "soft_ece", "sigma": 1e-300}, "sigma"),
        ("fit(objective='soft_ece', sigma=1e200)", {"objective": "soft_ece", "sigma": 1e200}, "sigma"),
        ("fit(objective='soft_ece', n_bins=0)", {"objective": "soft_ece", "n_bins": 0}, "n_bins"),
        (
            "fit(objective='charbonnier_soft_ece', delta=-1)",
            {"objective": "charbonnier_soft_ece", "delta": -1.0},
            "delta",
        ),
        ("fit(bins=15)", {"bins": 15}, "bins"),
        ("fit(progress_bar='yes')", {"progress_bar": "yes"}, "progress_bar"),
        ("fit(from_logits=1)", {"from_logits": 1}, "from_logits"),
    ):
        for cls in (TemperatureScaling, SMARTCalibrator):
            add(
                Case(
                    "hyper-parameters",
                    "calibrators",
                    f"{cls.__name__}.{name}",
                    lambda cls=cls, kw=kw: cls().fit(Z, Y, **kw),
                    (arg,),
                )
            )
    add(
        Case(
            "hyper-parameters",
            "calibrators",
            "SMART fit(soft_ece, sigma=1e-150): trains or falls back",
            lambda: bool(
                np.isfinite(
                    SMARTCalibrator(max_steps=50)
                    .fit(Z, Y, objective="soft_ece", sigma=1e-150, progress_bar=False)
                    .predict_proba(Z)
                    .numpy()
                ).all()
            ),
            reference=lambda: True,
        )
    )
    return cases


def checkpoint_cases(tmp: Path) -> list[Case]:
    from safetensors.torch import load_file, save_file

    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=50).fit(Z, Y, progress_bar=False)
    ts.save_pretrained(tmp / "ts")
    smart.save_pretrained(tmp / "smart")

    def tampered(src, name, config=None, tensors=None, edit=None):
        dst = tmp / name
        shutil.copytree(tmp / src, dst)
        if config is not None:
            data = json.loads((dst / "config.json").read_text())
            config(data)
            (dst / "config.json").write_text(json.dumps(data))
        if tensors:
            weights = load_file(dst / "model.safetensors")
            weights.update(tensors)
            save_file(
                weights,
                dst / "model.safetensors",
                metadata={"format": "pt", "calibrator": json.loads((dst / "config.json").read_text())["calibrator"]},
            )
        if edit is not None:
            edit(dst)
        return dst

    def set_fit(key, value):
        return lambda c: c["fit"].__setitem__(key, value)

    rows = [
        (
            "format_version 99",
            tampered("smart", "v99", config=lambda c: c.__setitem__("format_version", 99)),
            ("format_version",),
        ),
        (
            "calibrator kind 'platt'",
            tampered("smart", "kind", config=lambda c: c.__setitem__("calibrator", "platt")),
            ("calibrator",),
        ),
        (
            "hidden_size 8 vs 16-unit weights",
            tampered("smart", "h8", config=lambda c: c.__setitem__("hidden_size", 8)),
            ("does not match", "SMARTCalibrator"),
        ),
        (
            "truncated weights",
            tampered(
                "smart",
                "trunc",
                edit=lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:60]),
            ),
            ("corrupted",),
        ),
        (
            "NaN weight",
            tampered("smart", "nan", tensors={"hidden.bias": torch.full((16,), float("nan"), dtype=torch.float64)}),
            ("NaN",),
        ),
        (
            "missing weights",
            tampered("smart", "noweights", edit=lambda d: (d / "model.safetensors").unlink()),
            ("model.safetensors", "missing"),
        ),
        (
            "missing config",
            tampered("smart", "noconfig", edit=lambda d: (d / "config.json").unlink()),
            ("config.json",),
        ),
        (
            "config not JSON",
            tampered("smart", "badjson", edit=lambda d: (d / "config.json").write_text("{oops")),
            ("JSON",),
        ),
        ("no fit record", tampered("smart", "nofit", config=lambda c: c.pop("fit")), ("fit",)),
        (
            "margin_std = 0",
            tampered("smart", "std0", tensors={"margin_std": torch.tensor(0.0, dtype=torch.float64)}),
            ("margin_std",),
        ),
        ("fit.num_classes a string", tampered("smart", "kstr", config=set_fit("num_classes", "5")), ("num_classes",)),
        (
            "TS log_temperature 9 (T = 8103)",
            tampered("ts", "t9", tensors={"log_temperature": torch.tensor(9.0, dtype=torch.float64)}),
            ("log_temperature",),
        ),
        (
            "TS log_temperature edited in range",
            tampered("ts", "tedit", tensors={"log_temperature": torch.tensor(0.1, dtype=torch.float64)}),
            ("do not match", "log_temperature"),
        ),
    ]
    for name, folder, names in rows:
        add(
            Case(
                "corrupted / tampered checkpoints",
                "calibrators",
                f"load_calibrator({name})",
                lambda folder=folder: load_calibrator(folder)(Z),
                names,
            )
        )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "load_calibrator(untouched TS): T",
            lambda: load_calibrator(tmp / "ts").fitted_temperature,
            reference=lambda: ts.fitted_temperature,
            atol=0,
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "from_pretrained(strict=False)",
            lambda: SMARTCalibrator.from_pretrained(tmp / "smart", strict=False),
            ("strict",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "TS.from_pretrained(a SMART folder)",
            lambda: TemperatureScaling.from_pretrained(tmp / "smart"),
            ("calibrator",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "load_calibrator('./no-such-folder')",
            lambda: load_calibrator("./no-such-folder"),
            ("name_or_path",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "load_calibrator(a file)",
            lambda: load_calibrator(tmp / "ts" / "config.json"),
            ("name_or_path",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "load_calibrator('a/b/c')",
            lambda: load_calibrator("a/b/c"),
            ("name_or_path",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "load_calibrator(repo id, offline, uncached)",
            lambda: load_calibrator("someone/not-cached", cache_dir=tmp / "hub-cache"),
            ("someone/not-cached",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "calibrators",
            "load_calibrator(subfolder missing)",
            lambda: load_calibrator(tmp / "ts", subfolder="calibrator"),
            ("subfolder",),
        )
    )
    return cases


def tiny_vit(image_size: int = 8):
    """A tiny random-init ViT classifier (config-built: nothing downloaded)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=image_size,
        patch_size=4,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=K,
    )
    return ViTForImageClassification(config).eval()


def tiny_model_folder(folder: Path) -> Path:
    tiny_vit().save_pretrained(folder)
    return folder


def tiny_pipeline():
    from transformers import ViTImageProcessor, pipeline

    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return pipeline("image-classification", model=tiny_vit(), image_processor=processor, device="cpu"), torch.randn(
        4, 3, 8, 8
    )


def output_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=50).fit(Z, Y, progress_bar=False)
    model = tiny_model_folder(tmp / "model")
    snapshot = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}

    def model_untouched():
        return {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()} == snapshot

    smart.save_pretrained(tmp / "cal_smart")
    card = (tmp / "cal_smart" / "README.md").read_bytes()
    (tmp / "data.npz").write_bytes(b"")
    np.savez(tmp / "data.npz", logits_val=Z32[:300], labels_val=Y[:300], logits_test=Z32[300:], labels_test=Y[300:])
    data_bytes = (tmp / "data.npz").read_bytes()
    (tmp / "mine.npz").write_bytes(b"the user's own file")

    def data_untouched():
        return (tmp / "data.npz").read_bytes() == data_bytes and (
            tmp / "mine.npz"
        ).read_bytes() == b"the user's own file"

    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(a model's folder)",
            lambda: ts.save_pretrained(model),
            ("save_directory", "calibrator"),
            untouched=model_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(a model's folder, overwrite=True)",
            lambda: ts.save_pretrained(model, overwrite=True),
            ("save_directory",),
            untouched=model_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(a SMART folder) without overwrite",
            lambda: ts.save_pretrained(tmp / "cal_smart"),
            ("save_directory", "overwrite"),
            untouched=lambda: (tmp / "cal_smart" / "README.md").read_bytes() == card,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_pretrained(overwrite=True): the card is the new one",
            lambda: (
                ts.save_pretrained(tmp / "cal_smart", overwrite=True),
                "SMART" in (tmp / "cal_smart" / "README.md").read_text(),
            )[1],
            reference=lambda: False,
        )
    )
    add(
        Case(
            "existing output files",
            "calibrators",
            "save_logits(an existing file)",
            lambda: __import__("hf_calibration.io.logits_files", fromlist=["x"]).save_logits(tmp / "mine.npz", Z, Y),
            ("path", "mine.npz"),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "fit --out <model folder> --overwrite",
            lambda: cli("fit", "--logits", tmp / "data.npz", "--method", "ts", "--out", model, "--overwrite"),
            ("--out",),
            untouched=model_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "fit --out <calibrator folder>",
            lambda: cli("fit", "--logits", tmp / "data.npz", "--method", "ts", "--out", tmp / "cal_smart"),
            ("--out", "--overwrite"),
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits <its input>",
            lambda: cli(
                "apply",
                "--calibrator",
                tmp / "cal_smart",
                "--logits",
                tmp / "data.npz",
                "--save-logits",
                tmp / "data.npz",
                "--overwrite",
            ),
            ("--save-logits",),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits <its input, without .npz>",
            lambda: cli(
                "apply", "--calibrator", tmp / "cal_smart", "--logits", tmp / "data.npz", "--save-logits", tmp / "data"
            ),
            ("--save-logits",),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits <an existing file>",
            lambda: cli(
                "apply",
                "--calibrator",
                tmp / "cal_smart",
                "--logits",
                tmp / "data.npz",
                "--save-logits",
                tmp / "mine.npz",
            ),
            ("--save-logits", "--overwrite"),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --diagram <its input>",
            lambda: cli(
                "apply", "--calibrator", tmp / "cal_smart", "--logits", tmp / "data.npz", "--diagram", tmp / "data.npz"
            ),
            ("--diagram",),
            untouched=data_untouched,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "fit --n-bins 0 writes nothing",
            lambda: cli("fit", "--logits", tmp / "data.npz", "--method", "ts", "--out", tmp / "nb0", "--n-bins", "0"),
            ("--n-bins", "--n_bins"),
            untouched=lambda: not (tmp / "nb0").exists(),
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "failed fit leaves no --out folder",
            lambda: cli("fit", "--logits", _few(tmp), "--method", "smart", "--out", tmp / "few"),
            ("50", "samples"),
            untouched=lambda: not (tmp / "few").exists(),
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "apply --save-logits cal_out prints the file written",
            lambda: (
                f"calibrated logits: {tmp / 'cal_out.npz'}"
                in cli(
                    "apply",
                    "--calibrator",
                    tmp / "cal_smart",
                    "--logits",
                    tmp / "data.npz",
                    "--save-logits",
                    tmp / "cal_out",
                )
            ),
            reference=lambda: True,
        )
    )
    return cases


def _few(tmp: Path) -> Path:
    np.savez(tmp / "few.npz", logits=Z32[:20], labels=Y[:20])
    return tmp / "few.npz"


def cli_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    np.savez(tmp / "split.npz", logits_val=Z[:300], labels_val=Y[:300], logits_test=Z[300:], labels_test=Y[300:])
    np.savez(tmp / "probs.npz", logits_val=P[:300], labels_val=Y[:300], logits_test=P[300:], labels_test=Y[300:])
    t_val = ref_ts_temperature(Z[:300], Y[:300])

    def fit_t(source, out, *extra):
        import re

        return float(
            re.search(
                r"T = ([0-9.]+)", cli("fit", "--logits", source, "--method", "ts", "--out", tmp / out, *extra)
            ).group(1)
        )

    def apply_json(source, cal, *extra):
        return json.loads(cli("apply", "--calibrator", tmp / cal, "--logits", source, "--json", *extra))

    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "fit --method ts (logits file): T",
            lambda: fit_t(tmp / "split.npz", "c_logits"),
            reference=lambda: t_val,
            atol=1e-4,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "fit --method ts (probabilities file): T",
            lambda: fit_t(tmp / "probs.npz", "c_probs"),
            ("--probs",),
            lambda: t_val,
            atol=1e-4,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "apply (probabilities file): uncalibrated ECE",
            lambda: apply_json(tmp / "probs.npz", "c_logits")["reports"]["uncalibrated"]["ece"],
            ("--probs",),
            lambda: ref_ece(P[300:], Y[300:]),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "CLI",
            "fit --probs on a logits file",
            lambda: cli("fit", "--logits", tmp / "split.npz", "--method", "ts", "--out", tmp / "c_bad", "--probs"),
            ("probabilities", "logits"),
        )
    )
    p_zero = P.copy()
    p_zero[300] = np.eye(K)[(Y[300] + 1) % K]
    np.savez(tmp / "pzero.npz", logits=p_zero[300:], labels=Y[300:])
    add(
        Case(
            "extreme values",
            "CLI",
            "apply --json with an infinite NLL: strict JSON",
            lambda: json.loads(
                cli("apply", "--calibrator", tmp / "c_logits", "--logits", tmp / "pzero.npz", "--json"),
                parse_constant=_refuse,
            )["reports"]["uncalibrated"]["non_finite"],
            reference=lambda: {"nll": "inf"},
        )
    )
    bad = Z.copy()
    bad[2, 2] = np.nan
    np.savez(tmp / "nan.npz", logits=bad, labels=Y)
    add(Case("NaN / inf", "CLI", "report (NaN logits)", lambda: cli("report", "--logits", tmp / "nan.npz"), ("NaN",)))
    add(
        Case(
            "NaN / inf",
            "CLI",
            "fit (NaN logits)",
            lambda: cli("fit", "--logits", tmp / "nan.npz", "--method", "ts", "--out", tmp / "c_nan"),
            ("NaN",),
        )
    )
    np.savez(tmp / "k6.npz", logits=np.c_[Z, Z[:, :1]], labels=Y)
    add(
        Case(
            "rank / shape",
            "CLI",
            "apply to K = 6 logits (fitted on 5): warns once, runs",
            lambda: _stderr_count(
                lambda: cli("apply", "--calibrator", tmp / "c_logits", "--logits", tmp / "k6.npz"), "fitted on K = 5"
            ),
            reference=lambda: 1,
        )
    )
    np.savez(tmp / "mismatch.npz", logits=Z, labels=Y[:-1])
    add(
        Case(
            "rank / shape",
            "CLI",
            "report (N mismatch)",
            lambda: cli("report", "--logits", tmp / "mismatch.npz"),
            ("same number of samples",),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "report --n-bins many",
            lambda: cli("report", "--logits", tmp / "split.npz", "--n-bins", "many"),
            ("--n-bins", "--n_bins"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "apply --margin-groups 0",
            lambda: cli(
                "apply",
                "--calibrator",
                tmp / "c_logits",
                "--logits",
                tmp / "split.npz",
                "--diagram",
                tmp / "d.png",
                "--margin-groups",
                "0",
            ),
            ("--margin-groups", "--margin_groups"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "fit --method platt",
            lambda: cli("fit", "--logits", tmp / "split.npz", "--method", "platt", "--out", tmp / "c_p"),
            ("--method",),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "fit --seed with ts",
            lambda: cli("fit", "--logits", tmp / "split.npz", "--method", "ts", "--seed", "1", "--out", tmp / "c_s"),
            ("--seed",),
        )
    )
    add(
        Case(
            "corrupted / tampered checkpoints",
            "CLI",
            "apply --calibrator <missing folder>",
            lambda: cli("apply", "--calibrator", tmp / "none", "--logits", tmp / "split.npz"),
            ("--calibrator",),
        )
    )
    (tmp / "bad.npz").write_bytes(b"not a zip")
    add(
        Case(
            "corrupted / tampered checkpoints",
            "CLI",
            "report (corrupted .npz)",
            lambda: cli("report", "--logits", tmp / "bad.npz"),
            ("bad.npz",),
        )
    )
    add(
        Case(
            "Hub and attach",
            "CLI",
            "fit --push-to-hub offline",
            lambda: cli(
                "fit",
                "--logits",
                tmp / "split.npz",
                "--method",
                "ts",
                "--out",
                tmp / "c_push",
                "--push-to-hub",
                "me/ts",
            ),
            ("unreachable",),
            untouched=lambda: (tmp / "c_push" / "model.safetensors").is_file(),
        )
    )
    add(
        Case(
            "Hub and attach",
            "CLI",
            "fit --push-to-hub --dry-run: files listed",
            lambda: re.findall(
                r"([\w.]+) \([\d,]+ bytes\)",
                cli(
                    "fit",
                    "--logits",
                    tmp / "split.npz",
                    "--method",
                    "ts",
                    "--out",
                    tmp / "c_dry",
                    "--push-to-hub",
                    "me/ts",
                    "--dry-run",
                ),
            ),
            reference=lambda: ["README.md", "config.json", "model.safetensors"],
        )
    )
    return cases


def _refuse(token):
    raise ValueError(f"non-standard JSON token {token}")


def _stderr_count(call, text):
    err = io.StringIO()
    handler = logging.StreamHandler(err)
    logging.getLogger("hf_calibration").addHandler(handler)
    try:
        call()
    finally:
        logging.getLogger("hf_calibration").removeHandler(handler)
    return err.getvalue().count(text)


def hub_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "push_to_hub offline",
            lambda: ts.push_to_hub("me/ts"),
            ("unreachable", "me/ts"),
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "push_to_hub(dry_run=True): the folder loads back",
            lambda: (
                load_calibrator(ts.push_to_hub("me/ts", path_in_repo="calibrator", dry_run=True)).fitted_temperature
            ),
            reference=lambda: ts.fitted_temperature,
            atol=0,
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "push_to_hub('a/b/c')",
            lambda: ts.push_to_hub("a/b/c", dry_run=True),
            ("repo_id",),
        )
    )
    pipe, x = tiny_pipeline()

    def attached_logits():
        with torch.no_grad():
            plain = pipe.model(pixel_values=x).logits
            ts.attach(pipe)
            try:
                return (pipe.model(pixel_values=x).logits - plain / ts.fitted_temperature).abs().max().item()
            finally:
                ts.detach()

    add(
        Case(
            "Hub and attach",
            "calibrators",
            "attach(pipeline): logits / T",
            attached_logits,
            ("model",),
            lambda: 0.0,
            atol=1e-5,
        )
    )
    add(
        Case(
            "Hub and attach", "calibrators", "attach('a model name')", lambda: ts.attach("google/vit-base"), ("model",)
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "attach(unfitted calibrator)",
            lambda: TemperatureScaling().attach(pipe.model),
            ("fit",),
        )
    )
    return cases


def loss_cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, K, generator=g)
    labels = torch.randint(0, K, (16,), generator=g)

    def focal_grad():
        z = torch.zeros(4, K)
        z[:, 0] = 40.0  # p_y rounds to 1 in float32
        z.requires_grad_(True)
        losses.FocalLoss(gamma=0.5)(z, torch.zeros(4, dtype=torch.long)).backward()
        return z.grad.abs().max().item()

    add(
        Case(
            "NaN / inf",
            "losses",
            "FocalLoss(gamma=0.5) gradient on confident float32 rows",
            focal_grad,
            reference=lambda: 0.0,
            atol=1e-6,
        )
    )
    for value in (0, -4, float("nan"), float("inf")):
        add(
            Case(
                "hyper-parameters",
                "losses",
                f"LabelSmoothingLoss(num_items_in_batch={value})",
                lambda value=value: losses.LabelSmoothingLoss(alpha=0.1)(
                    logits, labels, num_items_in_batch=value
                ).item(),
                ("num_items_in_batch",),
            )
        )
    add(Case("hyper-parameters", "losses", "FocalLoss(gamma=-1)", lambda: losses.FocalLoss(gamma=-1.0), ("gamma",)))
    add(
        Case(
            "hyper-parameters",
            "losses",
            "LabelSmoothingLoss(alpha=1.5)",
            lambda: losses.LabelSmoothingLoss(alpha=1.5),
            ("alpha",),
        )
    )
    add(Case("hyper-parameters", "losses", "MbLSLoss(margin=-1)", lambda: losses.MbLSLoss(margin=-1.0), ("margin",)))
    add(
        Case(
            "rank / shape",
            "losses",
            "CrossEntropyLoss(N mismatch)",
            lambda: losses.CrossEntropyLoss()(logits, labels[:-1]),
            ("labels", "logits"),
        )
    )
    add(
        Case(
            "labels",
            "losses",
            "CrossEntropyLoss(label = K)",
            lambda: losses.CrossEntropyLoss()(logits, torch.full((16,), K)),
            ("labels",),
        )
    )
    add(
        Case(
            "labels",
            "losses",
            "CrossEntropyLoss(-100 ignored)",
            lambda: losses.CrossEntropyLoss()(logits, torch.where(torch.arange(16) % 2 == 0, -100, labels)).item(),
            reference=lambda: torch.nn.functional.cross_entropy(logits[1::2], labels[1::2]).item(),
            atol=1e-6,
        )
    )

    def fedlas_after_inf():
        loss = losses.FeDLaSLoss(num_classes=K, variant="ls")
        loss.train()
        features = torch.randn(16, 8, generator=g)
        features[0] = float("inf")
        loss(logits, labels, features=features)
        return loss(logits, labels, features=torch.randn(16, 8, generator=g)).item()

    add(
        Case(
            "NaN / inf",
            "losses",
            "FeDLaS: an inf feature row, then a clean batch: finite loss",
            lambda: math.isfinite(fedlas_after_inf()),
            ("features",),
            lambda: True,
        )
    )
    return cases


# ----------------------------------------------------------------------------- running and reporting


def registry_cases(tmp: Path) -> list[Case]:
    """Every registered calibrator (the ones added after TS and SMART included): probabilities, NaN, labels, checkpoints."""
    from safetensors.torch import load_file, save_file

    from hf_calibration.calibrators import create_calibrator, list_calibrators

    cases: list[Case] = []
    add = cases.append
    zt = torch.from_numpy(Z)
    for kind in list_calibrators():
        if kind in ("temperature_scaling", "smart"):  # covered case by case above
            continue
        fitted = create_calibrator(kind).fit(Z, Y, progress_bar=False)
        expected = fitted.predict_proba(zt).numpy()
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind} fit(probs), detected: predict_proba",
                lambda kind=kind: create_calibrator(kind).fit(P, Y, progress_bar=False).predict_proba(zt).numpy(),
                ("from_logits",),
                lambda expected=expected: expected,
                atol=1e-9,
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind} forward(probs), detected",
                lambda fitted=fitted: torch.softmax(fitted(torch.from_numpy(P)).double(), 1).numpy(),
                ("from_logits",),
                lambda expected=expected: expected,
                atol=1e-9,
            )
        )
        bad = Z.copy()
        bad[4, 1] = np.nan
        add(
            Case(
                "NaN / inf",
                "calibrators",
                f"{kind} forward(a NaN row)",
                lambda fitted=fitted, bad=bad: fitted(bad),
                ("logits",),
            )
        )
        add(
            Case(
                "NaN / inf",
                "calibrators",
                f"{kind} fit(an inf row)",
                lambda kind=kind, bad=bad: create_calibrator(kind).fit(np.where(np.isnan(bad), np.inf, bad), Y),
                ("logits",),
            )
        )
        add(
            Case(
                "labels",
                "calibrators",
                f"{kind} fit(label = K)",
                lambda kind=kind: create_calibrator(kind).fit(Z, np.where(np.arange(len(Y)) == 3, K, Y)),
                ("labels",),
            )
        )
        folder = tmp / kind
        fitted.save_pretrained(folder)
        tensors = load_file(str(folder / "model.safetensors"))
        name = next(n for n, t in tensors.items() if t.is_floating_point() and t.numel())
        tensors[name] = torch.full_like(tensors[name], float("nan"))
        nan_folder = tmp / f"{kind}_nan"
        shutil.copytree(folder, nan_folder)
        save_file(
            tensors,
            str(nan_folder / "model.safetensors"),
            metadata={"format": "pt", "calibrator": kind, "format_version": "1"},
        )
        add(
            Case(
                "corrupted / tampered checkpoints",
                "calibrators",
                f"{kind}: NaN in {name}",
                lambda nan_folder=nan_folder: load_calibrator(nan_folder),
                ("NaN", "corrupted"),
            )
        )
        add(
            Case(
                "existing output files",
                "calibrators",
                f"{kind}.save_pretrained(a folder holding a calibrator)",
                lambda fitted=fitted, folder=folder: fitted.save_pretrained(folder),
                ("overwrite", str(folder)),
            )
        )
    return cases


def new_surface_cases(tmp: Path) -> list[Case]:
    """The streaming accumulator, OOD / selective metrics, calibrator comparison and corruptions."""
    from hf_calibration.calibrators import compare_calibrators
    from hf_calibration.metrics import CalibrationAccumulator, aurc, ood_metrics
    from hf_calibration.shift import corrupt

    cases: list[Case] = []
    add = cases.append
    rng = np.random.default_rng(1)
    z_out = rng.normal(scale=2.0, size=(300, K))
    msp_in, msp_out = P.max(1), softmax(z_out).max(1)
    ref_auroc = float(np.mean((msp_in[:, None] > msp_out[None, :]) + 0.5 * (msp_in[:, None] == msp_out[None, :])))
    risk = np.cumsum(1.0 - (P.argmax(1) == Y)[np.argsort(-P.max(1), kind="stable")]) / np.arange(1, len(Y) + 1)

    def accumulate(preds, **kw):
        acc = CalibrationAccumulator(**kw)
        for rows in np.array_split(np.arange(len(Y)), 7):
            acc.update(preds[rows], Y[rows])
        return acc.compute().ece

    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "CalibrationAccumulator(probs in batches).ece",
            lambda: accumulate(P),
            ("from_logits",),
            lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "CalibrationAccumulator(logits in batches).ece",
            lambda: accumulate(Z),
            reference=lambda: ref_ece(P, Y),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "ood_metrics(probs, probs, msp).auroc",
            lambda: ood_metrics(P, softmax(z_out), "msp")["auroc"],
            ("from_logits",),
            lambda: ref_auroc,
            atol=1e-12,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "ood_metrics(logits, logits, msp).auroc",
            lambda: ood_metrics(Z, z_out, "msp")["auroc"],
            reference=lambda: ref_auroc,
            atol=1e-12,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "metrics",
            "aurc(probs)",
            lambda: aurc(P, Y),
            ("from_logits",),
            lambda: float(risk.mean()),
            atol=1e-12,
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "calibrators",
            "compare_calibrators(probs) == (logits): TS ECE",
            lambda: compare_calibrators(P, Y, methods=["temperature_scaling"], cv=3).rows()[0]["ece_mean"],
            ("from_logits",),
            lambda: compare_calibrators(Z, Y, methods=["temperature_scaling"], cv=3).rows()[0]["ece_mean"],
            atol=1e-9,
        )
    )
    add(
        Case(
            "rank / shape",
            "metrics",
            "ood_metrics(K = 5 vs K = 4)",
            lambda: ood_metrics(Z, z_out[:, :4]),
            ("out_logits", "in_logits"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "ood_metrics(score='odin')",
            lambda: ood_metrics(Z, z_out, "odin"),
            ("score",),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "CalibrationAccumulator(n_bins=0)",
            lambda: CalibrationAccumulator(n_bins=0),
            ("n_bins",),
        )
    )
    add(
        Case(
            "rank / shape",
            "metrics",
            "CalibrationAccumulator.update(K changes between batches)",
            lambda: (lambda a: (a.update(Z[:10], Y[:10]), a.update(Z[:10, :4], Y[:10])))(CalibrationAccumulator()),
            ("logits", "preds", "K"),
        )
    )
    add(
        Case(
            "hyper-parameters", "metrics", "compare_calibrators(cv=1)", lambda: compare_calibrators(Z, Y, cv=1), ("cv",)
        )
    )
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "compare_calibrators(methods=['nope'])",
            lambda: compare_calibrators(Z, Y, methods=["nope"]),
            ("methods", "nope"),
        )
    )
    try:
        from PIL import Image

        image = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        add(
            Case(
                "hyper-parameters",
                "shift",
                "corrupt(name='gausian_noise')",
                lambda: corrupt(image, "gausian_noise", 3),
                ("name", "gausian_noise"),
            )
        )
        add(
            Case(
                "hyper-parameters",
                "shift",
                "corrupt(severity=6)",
                lambda: corrupt(image, "gaussian_noise", 6),
                ("severity",),
            )
        )
        add(
            Case(
                "hyper-parameters",
                "shift",
                "corrupt(severity=2.5)",
                lambda: corrupt(image, "gaussian_noise", 2.5),
                ("severity",),
            )
        )
        add(
            Case(
                "dtype",
                "shift",
                "corrupt(a list, not an image)",
                lambda: corrupt([[1, 2]], "gaussian_noise", 1),
                ("image",),
            )
        )
    except ImportError:  # the shift extra is not installed
        pass
    return cases


# ----------------------------------------------------------------------------- the third sweep (issue 23): every row decides, per-class
# maps, images, the logits cache, users' files, the order of checks, the model route, processes, smaller holes


def cli_err(*argv) -> tuple[str, str]:
    """``cli`` that also returns stderr on success (warnings a command prints while it works)."""
    from hf_calibration.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_info:
            code = exit_info.code
    lines = err.getvalue().strip().splitlines()
    if code == 0:
        return out.getvalue(), err.getvalue()
    if code in (1, 2) and lines and "Traceback" not in err.getvalue():
        raise ValueError(lines[-1])
    raise RuntimeError(f"exit {code}, stderr: {' / '.join(lines[-3:])}")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return (
        {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        if folder.exists()
        else {}
    )


def _unchanged(folder: Path) -> Callable[[], bool]:
    """A check that ``folder`` (files and all) is as it is now."""
    before = _snapshot(folder)
    return lambda: _snapshot(folder) == before


# the issue's data: softmax of N(0, 3) logits, 5000 rows, so a defect can sit before or after row 4096
Z5 = np.random.default_rng(0).normal(size=(5000, 5)) * 3
Y5 = Z5.argmax(1)
P5 = softmax(Z5)
DEFECTS = {
    "row x 1.02": lambda r: r * 1.02,
    "a value -1e-9": lambda r: np.r_[-1e-9, r[1:]],
    "a value 1 + 1e-7": lambda r: np.r_[1 + 1e-7, r[1:]],
}


def _malformed(row: int, defect: str) -> np.ndarray:
    bad = P5.copy()
    bad[row] = DEFECTS[defect](bad[row])
    return bad


MIXED = {
    "probabilities then logits": np.vstack([P5[:100], np.log(P5[100:]) + 2.0]),
    "logits then probabilities": np.vstack([np.log(P5[:100]) + 2.0, P5[100:]]),
}


def detection_cases(tmp: Path) -> list[Case]:
    """Item 1: a malformed probability row anywhere, probability rows mixed with logit rows, chance rows in small logits."""
    from hf_calibration.calibrators import create_calibrator, list_calibrators
    from hf_calibration.metrics import CalibrationAccumulator, aurc, ood_metrics

    m = metrics
    cases: list[Case] = []
    add = cases.append
    fns = {
        name: getattr(m, name)
        for name in (
            "ece",
            "mce",
            "adaece",
            "classwise_ece",
            "brier",
            "nll",
            "smce",
            "smece",
            "calibration_report",
            "reliability_table",
        )
    }
    for row in (5, 4500):
        for defect in DEFECTS:
            bad = _malformed(row, defect)
            for name, fn in fns.items():
                add(
                    Case(
                        "probabilities vs logits",
                        "metrics",
                        f"{name}(probabilities, {defect} in row {row})",
                        lambda fn=fn, bad=bad: fn(bad, Y5),
                        ("preds", f"row {row} is not"),
                    )
                )
            add(
                Case(
                    "probabilities vs logits",
                    "metrics",
                    f"ece(torch probabilities, {defect} in row {row})",
                    lambda bad=bad: m.ece(torch.from_numpy(bad), torch.from_numpy(Y5)),
                    ("preds", f"row {row} is not"),
                )
            )
            add(
                Case(
                    "probabilities vs logits",
                    "metrics",
                    f"ece(probabilities, {defect} in row {row}, from_logits=False)",
                    lambda bad=bad: m.ece(bad, Y5, from_logits=False),
                    ("preds", f"row {row}", "from_logits=False"),
                )
            )
            add(
                Case(
                    "probabilities vs logits",
                    "metrics",
                    f"CalibrationAccumulator.update({defect} in row {row})",
                    lambda bad=bad: CalibrationAccumulator().update(bad, Y5),
                    ("preds", f"row {row} is not"),
                )
            )
            add(
                Case(
                    "probabilities vs logits",
                    "metrics",
                    f"aurc({defect} in row {row})",
                    lambda bad=bad: aurc(bad, Y5),
                    ("preds", f"row {row} is not"),
                )
            )
            add(
                Case(
                    "probabilities vs logits",
                    "metrics",
                    f"ood_metrics(in = {defect} in row {row})",
                    lambda bad=bad: ood_metrics(bad, P5[:300], "msp"),
                    ("in_logits", "preds", f"row {row} is not"),
                )
            )
    for order, mixed in MIXED.items():
        for name, fn in fns.items():
            add(
                Case(
                    "probabilities vs logits",
                    "metrics",
                    f"{name}({order})",
                    lambda fn=fn, mixed=mixed: fn(mixed, Y5),
                    ("preds", "row 100", "row 0"),
                )
            )
    z_small = np.random.default_rng(5).uniform(
        0.0, 1.0, size=(4000, 2)
    )  # K = 2 logits in [0, 1]: ~2 % of rows sum to 1 by chance
    y_small = np.random.default_rng(6).integers(0, 2, 4000)
    for name, ref in (("ece", ref_ece), ("brier", ref_brier), ("nll", ref_nll)):
        add(
            Case(
                "probabilities vs logits",
                "metrics",
                f"{name}(small K = 2 logits, some rows in the simplex by chance)",
                lambda name=name: getattr(m, name)(z_small, y_small),
                reference=lambda ref=ref: ref(softmax(z_small), y_small),
            )
        )

    bad = _malformed(4500, "row x 1.02")
    for kind in list_calibrators():
        kw = {"max_steps": 100} if kind == "smart" else {}
        fitted = create_calibrator(kind, **kw).fit(Z5[:600], Y5[:600], progress_bar=False)
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind}.predict_proba(probabilities, row 4500 x 1.02)",
                lambda fitted=fitted: fitted.predict_proba(bad),
                ("logits", "row 4500 is not"),
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind}(probabilities then logits)",
                lambda fitted=fitted: fitted(MIXED["probabilities then logits"]),
                ("logits", "row 100 is not"),
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind}.fit(probabilities, row 5 x 1.02)",
                lambda kind=kind, kw=kw: create_calibrator(kind, **kw).fit(
                    _malformed(5, "row x 1.02"), Y5, progress_bar=False
                ),
                ("logits", "row 5 is not"),
            )
        )

    def evaluate_two_batches(name, first, second):
        import evaluate

        from hf_calibration import metric_path

        metric = evaluate.load(metric_path(name))
        metric.add_batch(predictions=first, references=Y5[:100])
        metric.add_batch(predictions=second, references=Y5[100:300])
        return metric.compute()

    logits5 = np.log(P5) + 2.0
    for name in ("ece", "adaece", "smce", "calibration"):
        add(
            Case(
                "probabilities vs logits",
                "metrics",
                f"evaluate {name}: add_batch(probabilities) then add_batch(logits)",
                lambda name=name: evaluate_two_batches(name, P5[:100], logits5[100:300]),
                ("preds", "row 100 is not"),
            )
        )
    np.savez(tmp / "mixed.npz", logits=MIXED["probabilities then logits"], labels=Y5)
    np.savez(tmp / "malformed.npz", logits=bad, labels=Y5)
    for source in ("mixed", "malformed"):
        for command in (
            ["report"],
            ["fit", "--method", "ts", "--out", tmp / f"cal_{source}"],
            ["compare", "--methods", "ts", "--cv", "3"],
        ):
            add(
                Case(
                    "probabilities vs logits",
                    "CLI",
                    f"{command[0]} --logits <{source} rows>",
                    lambda command=command, source=source: cli(
                        command[0], "--logits", tmp / f"{source}.npz", *command[1:]
                    ),
                    ("--from-logits", "--probs"),
                    untouched=lambda source=source: not (tmp / f"cal_{source}").exists(),
                )
            )
    return cases


def per_class_cases(tmp: Path) -> list[Case]:
    """Item 2: per-class maps refuse another K; a single top-label map serves any K."""
    from hf_calibration.calibrators import HistogramBinning, OneVsRestIsotonicRegression

    cases: list[Case] = []
    add = cases.append
    for name, make in (
        ("isotonic_ovr", OneVsRestIsotonicRegression),
        ("histogram_binning(per_class=True)", lambda: HistogramBinning(points_per_bin=10)),
    ):
        fitted = make().fit(Z, Y, progress_bar=False)
        fitted.save_pretrained(tmp / name)
        loaded = load_calibrator(tmp / name)
        for k in (3, 8):
            other = make_data(50, k, seed=k)[0]
            for where, cal in (("fitted", fitted), ("loaded", loaded)):
                for call in ("forward", "predict_proba"):
                    fn = cal if call == "forward" else cal.predict_proba
                    add(
                        Case(
                            "rank / shape",
                            "calibrators",
                            f"{name} ({where}, K = 5) {call}(K = {k})",
                            lambda fn=fn, other=other: fn(other),
                            ("logits", "K = 5"),
                        )
                    )
    single = HistogramBinning(per_class=False, binning="equal_width", n_bins=10).fit(Z, Y, progress_bar=False)
    other = make_data(50, 8, seed=8)[0]
    add(
        Case(
            "rank / shape",
            "calibrators",
            "histogram_binning(per_class=False) on K = 8: argmax kept",
            lambda: single(other).argmax(1).numpy(),
            reference=lambda: other.argmax(1),
        )
    )
    return cases


def image_cases(tmp: Path) -> list[Case]:
    """Item 3 and item 12's seed: images of more than 8 bits, seeds beyond RandomState's range."""
    try:
        from PIL import Image

        from hf_calibration.shift import corrupt, corruption_transform
    except ImportError:  # the shift extra is not installed
        return []
    cases: list[Case] = []
    add = cases.append
    ramp = np.tile(np.linspace(0, 1, 64), (64, 1))
    images = {
        "I;16 (uint16 ramp)": Image.fromarray((ramp * 65535).astype(np.uint16)),
        "I (int32 ramp)": Image.fromarray((ramp * 65535).astype(np.int32)),
        "F (float ramp in [0, 1])": Image.fromarray(ramp.astype(np.float32)),
    }
    for label, image in images.items():
        for name in ("contrast", "gaussian_noise", "fog"):
            add(
                Case(
                    "dtype",
                    "shift",
                    f"corrupt({label}, {name})",
                    lambda image=image, name=name: corrupt(image, name, 2),
                    ("image", image.mode),
                )
            )
        add(
            Case(
                "dtype",
                "shift",
                f"corruption_transform(contrast) on {label}",
                lambda image=image: corruption_transform("contrast", 2)({"image": [image]}),
                ("image", image.mode),
            )
        )
    eight = Image.fromarray((ramp * 255).astype(np.uint8))
    add(
        Case(
            "dtype",
            "shift",
            "corrupt(8-bit L ramp, brightness 1): mode and size kept",
            lambda: (corrupt(eight, "brightness", 1).mode, corrupt(eight, "brightness", 1).size),
            reference=lambda: ("L", (64, 64)),
        )
    )
    for seed in (2**32, 2**40):
        add(
            Case(
                "hyper-parameters",
                "shift",
                f"corrupt(seed={seed})",
                lambda seed=seed: corrupt(eight, "gaussian_noise", 1, seed=seed),
                ("seed",),
            )
        )
        add(
            Case(
                "hyper-parameters",
                "shift",
                f"corruption_transform(seed={seed})",
                lambda seed=seed: corruption_transform("fog", 1, seed=seed),
                ("seed",),
            )
        )
    add(
        Case(
            "hyper-parameters",
            "shift",
            "corrupt(seed=2**32 - 1): runs",
            lambda: corrupt(eight, "gaussian_noise", 1, seed=2**32 - 1).size,
            reference=lambda: (64, 64),
        )
    )
    return cases


def _saved_route(tmp: Path) -> tuple[Path, Path]:
    """A tiny ViT folder (with its image processor) and a save_to_disk dataset of 8 x 8 RGB images (60 validation, 24 test
    validation splits, an unlabelled `nolabels` dataset beside it)."""
    import datasets
    from PIL import Image
    from transformers import ViTImageProcessor

    model = tmp / "vit"
    if not model.exists():
        tiny_vit().save_pretrained(model)
        ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
            model
        )
        rng = np.random.default_rng(0)
        features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=K)})
        splits = {}
        for split, n in (("validation", 60), ("test", 24)):  # SMART fits on 50 samples at least
            images = [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(n)]
            splits[split] = datasets.Dataset.from_dict(
                {"img": images, "label": list(rng.integers(0, K, n))}, features=features
            )
        datasets.DatasetDict(splits).save_to_disk(str(tmp / "data"))
        unlabelled = splits["test"].map(lambda row: {"label": -1})
        datasets.DatasetDict({"test": unlabelled}).save_to_disk(str(tmp / "nolabels"))
    return model, tmp / "data"


def cache_cases(tmp: Path) -> list[Case]:
    """Item 4: a forward hook, a plain callable processor: never served logits keyed without them."""
    from transformers import ViTImageProcessor

    from hf_calibration.io import predict_logits
    from hf_calibration.io.data import load_image_dataset
    from hf_calibration.io.logits_cache import cache_key

    cases: list[Case] = []
    add = cases.append
    model_dir, data_dir = _saved_route(tmp)
    processor = ViTImageProcessor.from_pretrained(model_dir)

    def hooked_run(where: str):
        from transformers import AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(model_dir)
        cache = tmp / f"cache_{where}"
        predict_logits(model, str(data_dir), processor, split="test", cache_dir=cache, progress=False)
        shift = torch.arange(float(K))
        module = {"model": model, "classifier": model.classifier}[where]
        if where == "model":
            module.register_forward_hook(
                lambda mod, args, output: output.__setitem__("logits", output["logits"] + shift) or output
            )
        else:
            module.register_forward_hook(lambda mod, args, output: output + shift)
        logits, _ = predict_logits(model, str(data_dir), processor, split="test", cache_dir=cache, progress=False)
        return logits

    def hooked_reference(where: str):
        from transformers import AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained(model_dir).eval()
        data = load_image_dataset(str(data_dir), "test")
        with torch.no_grad():
            pixels = processor(images=[im.convert("RGB") for im in data["img"]], return_tensors="pt")["pixel_values"]
            return (model(pixel_values=pixels).logits + torch.arange(float(K))).numpy()

    for where in ("model", "classifier"):
        add(
            Case(
                "logits cache",
                "inference",
                f"predict_logits after a forward hook on the {where} (cached before): the hooked logits",
                lambda where=where: hooked_run(where),
                reference=lambda: hooked_reference("model"),
                atol=1e-5,
            )
        )
    data = load_image_dataset(str(data_dir), "test")
    for label, proc in (
        ("a lambda", lambda images, return_tensors: None),
        ("a string", "P"),
        ("a callable object", type("Proc", (), {"__call__": lambda self, **kw: None})()),
    ):
        add(
            Case(
                "logits cache",
                "inference",
                f"cache_key with {label} as the processor: not keyed",
                lambda proc=proc: (
                    cache_key(
                        tiny_vit(), proc, data, split="test", image_column="img", label_column="label", image_mode="RGB"
                    )[0]
                    is None
                ),
                reference=lambda: True,
            )
        )
    return cases


def user_file_cases(tmp: Path) -> list[Case]:
    """Items 5, 6, 7 and item 12's dry runs and compare: only files the package wrote are replaced, checks come first."""
    import tempfile as tempfile_module

    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    smart = SMARTCalibrator(max_steps=50).fit(Z, Y, progress_bar=False)
    readme = b"# my project\n"

    def with_readme(name: str) -> Path:
        folder = tmp / name
        folder.mkdir()
        (folder / "README.md").write_bytes(readme)
        (folder / "notes.txt").write_bytes(b"mine")
        return folder

    def users_files_kept(folder: Path) -> Callable[[], bool]:
        return lambda: (folder / "README.md").read_bytes() == readme and (folder / "notes.txt").read_bytes() == b"mine"

    for first, second in ((ts, ts), (smart, ts), (ts, smart)):
        folder = with_readme(f"readme_{first.kind}_{second.kind}")

        def twice(folder=folder, first=first, second=second):
            first.save_pretrained(folder, overwrite=True)
            second.save_pretrained(folder, overwrite=True)
            card = (folder / "README.hf_calibration.md").read_text()
            return f"{type(second).__name__} calibrator" in card and load_calibrator(folder).kind == second.kind

        add(
            Case(
                "existing output files",
                "calibrators",
                f"{first.kind} then {second.kind} saved (overwrite) beside the user's README.md",
                twice,
                reference=lambda: True,
                untouched=users_files_kept(folder),
            )
        )
    edited = tmp / "edited_card"
    ts.save_pretrained(edited)
    (edited / "README.md").write_bytes(readme)  # the card, edited by hand: the user's now
    (edited / "notes.txt").write_bytes(b"mine")
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) over a card the user edited: kept",
            lambda: ts.save_pretrained(edited, overwrite=True) or (edited / "README.hf_calibration.md").is_file(),
            reference=lambda: True,
            untouched=users_files_kept(edited),
        )
    )
    foreign = tmp / "foreign_weights"
    ts.save_pretrained(foreign)
    (foreign / "model.safetensors").write_bytes(b"someone else's weights")
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) over weights that changed since: refused",
            lambda: ts.save_pretrained(foreign, overwrite=True),
            ("model.safetensors", "did not write"),
            untouched=_unchanged(foreign),
        )
    )
    both = with_readme("both_cards")
    (both / "README.hf_calibration.md").write_bytes(b"also mine")
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) where both card names are the user's: refused",
            lambda: ts.save_pretrained(both, overwrite=True),
            ("README.md", "README.hf_calibration.md"),
            untouched=_unchanged(both),
        )
    )
    legacy = tmp / "legacy"
    ts.save_pretrained(legacy)
    config = json.loads((legacy / "config.json").read_text())
    config.pop("files", None)  # a save from before the record
    (legacy / "config.json").write_text(json.dumps(config))
    card = (legacy / "README.md").read_bytes()
    add(
        Case(
            "existing output files",
            "calibrators",
            "save (overwrite) over a save without a file record: its README.md kept",
            lambda: ts.save_pretrained(legacy, overwrite=True) or load_calibrator(legacy).fitted_temperature,
            reference=lambda: ts.fitted_temperature,
            atol=0,
            untouched=lambda: (legacy / "README.md").read_bytes() == card,
        )
    )
    np.savez(tmp / "split.npz", logits_val=Z32[:300], labels_val=Y[:300], logits_test=Z32[300:], labels_test=Y[300:])
    for command in ("fit", "fit again"):
        folder = tmp / "cli_readme" if command == "fit again" else with_readme("cli_readme")
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command} --out <folder with the user's README.md> --overwrite",
                lambda folder=folder: (
                    "README.hf_calibration.md instead"
                    in cli_err("fit", "--logits", tmp / "split.npz", "--method", "ts", "--out", folder, "--overwrite")[
                        1
                    ]
                ),
                reference=lambda: True,
                untouched=users_files_kept(folder),
            )
        )

    # --diagram NAME without an extension: NAME.png, as matplotlib writes it
    figures = tmp / "figures"
    figures.mkdir()
    (figures / "fig.png").write_bytes(b"the user's figure")
    ts.save_pretrained(tmp / "ts_cal")
    for command in (["report"], ["apply", "--calibrator", tmp / "ts_cal"]):
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command[0]} --diagram fig (fig.png exists)",
                lambda command=command: cli(
                    command[0], *command[1:], "--logits", tmp / "split.npz", "--diagram", figures / "fig"
                ),
                ("--diagram", "fig.png", "--overwrite"),
                untouched=lambda: (
                    (figures / "fig.png").read_bytes() == b"the user's figure" and not (figures / "fig").exists()
                ),
            )
        )
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command[0]} --diagram new: prints new.png, writes new.png",
                lambda command=command: (
                    f"reliability diagram: {figures / (command[0] + '_new.png')}"
                    in cli(
                        command[0],
                        *command[1:],
                        "--logits",
                        tmp / "split.npz",
                        "--diagram",
                        figures / (command[0] + "_new"),
                    ),
                    (figures / (command[0] + "_new.png")).is_file(),
                    (figures / (command[0] + "_new")).exists(),
                ),
                reference=lambda: (True, True, False),
            )
        )
        add(
            Case(
                "existing output files",
                "CLI",
                f"{command[0]} --diagram fig.v2 (no such format)",
                lambda command=command: cli(
                    command[0], *command[1:], "--logits", tmp / "split.npz", "--diagram", figures / "fig.v2"
                ),
                ("--diagram", ".v2"),
            )
        )

    # every argument is checked before anything is written; model folders refused everywhere
    model = tiny_model_folder(tmp / "model")
    for push, flag in (
        (["--push-to-hub", "bad id!!", "--dry-run"], "--push-to-hub"),
        (["--push-to-hub", "a/b/c"], "--push-to-hub"),
        (["--push-to-hub", "me/ts", "--path-in-repo", "/", "--dry-run"], "--path-in-repo"),
    ):
        out = tmp / f"never_{len(cases)}"
        add(
            Case(
                "existing output files",
                "CLI",
                f"fit --out DIR {' '.join(push)}: nothing written",
                lambda push=push, out=out: cli(
                    "fit", "--logits", tmp / "split.npz", "--method", "ts", "--out", out, *push
                ),
                (flag,),
                untouched=lambda out=out: not out.exists(),
            )
        )
    add(
        Case(
            "existing output files",
            "CLI",
            "compare --out <a model's folder>",
            lambda: cli("compare", "--logits", tmp / "split.npz", "--methods", "ts", "--cv", "3", "--out", model),
            ("--out", "model's folder"),
            untouched=_unchanged(model),
        )
    )
    cwd = tmp / "compare_cwd"
    cwd.mkdir()

    def compare_in(folder: Path):
        here = os.getcwd()
        os.chdir(folder)
        try:
            return "best by ece" in cli("compare", "--logits", tmp / "split.npz", "--methods", "ts", "--cv", "3")
        finally:
            os.chdir(here)

    add(
        Case(
            "existing output files",
            "CLI",
            "compare without --out writes nothing",
            lambda: compare_in(cwd),
            reference=lambda: True,
            untouched=lambda: list(cwd.iterdir()) == [],
        )
    )
    push_root = Path(tempfile_module.gettempdir())

    def dry_run_leftovers():
        before = set(push_root.glob("hf_calibration_push_*"))
        cli(
            "fit",
            "--logits",
            tmp / "split.npz",
            "--method",
            "ts",
            "--out",
            tmp / "dry",
            "--push-to-hub",
            "me/ts",
            "--dry-run",
        )
        return sorted(str(p) for p in set(push_root.glob("hf_calibration_push_*")) - before)

    add(
        Case(
            "existing output files",
            "CLI",
            "fit --push-to-hub --dry-run: no temporary folder left",
            dry_run_leftovers,
            reference=lambda: [],
        )
    )
    return cases


def accumulator_cases(tmp: Path) -> list[Case]:
    """Items 8, 12 (a failed first batch) and 13 (accelerate's even_batches): the accumulator."""
    import subprocess
    import types

    from hf_calibration.metrics import CalibrationAccumulator

    cases: list[Case] = []
    add = cases.append
    z16 = Z.astype(np.float16)
    p16 = softmax(z16)

    def stream(preds, labels, batches=5, **kw):
        acc = CalibrationAccumulator(confidence_dtype="float64", **kw)
        for rows in np.array_split(np.arange(len(labels)), batches):
            acc.update(preds[rows], labels[rows])
        return acc.compute()

    for label, preds in (
        ("float16 numpy logits", z16),
        ("CPU torch.half logits", torch.from_numpy(z16)),
        ("float16 numpy probabilities", P.astype(np.float16)),
    ):
        ref_p = p16 if "logits" in label else P.astype(np.float16).astype(np.float64)
        add(
            Case(
                "dtype",
                "metrics",
                f"CalibrationAccumulator.update({label}).ece",
                lambda preds=preds: stream(preds, Y).ece,
                reference=lambda ref_p=ref_p: ref_ece(ref_p, Y),
                atol=1e-9,
            )
        )
        add(
            Case(
                "dtype",
                "metrics",
                f"CalibrationAccumulator.update({label}).brier",
                lambda preds=preds: stream(preds, Y).brier,
                reference=lambda ref_p=ref_p: ref_brier(ref_p, Y),
                atol=1e-6,
            )
        )
        add(
            Case(
                "dtype",
                "metrics",
                f"CalibrationAccumulator.update({label}).nll",
                lambda preds=preds: stream(preds, Y).nll,
                reference=lambda ref_p=ref_p: ref_nll(ref_p, Y),
                atol=1e-6,
            )
        )

    def after_failed_first(bad_preds, bad_labels):
        acc = CalibrationAccumulator(confidence_dtype="float64")
        try:
            acc.update(bad_preds, bad_labels)
        except (ValueError, TypeError):
            pass
        return acc.update(Z, Y).compute().ece

    for label, bad in (
        ("K = 4 with label 4", (Z[:, :4], Y)),
        ("NaN logits", (np.where(np.arange(K) == 0, np.nan, Z), Y)),
        ("float labels", (Z[:, :3], Y.astype(float))),
        ("malformed probabilities", (_malformed(5, "row x 1.02")[:, :4], Y5)),
    ):
        add(
            Case(
                "rank / shape",
                "metrics",
                f"CalibrationAccumulator: a failed first batch ({label}), then a good one",
                lambda bad=bad: after_failed_first(*bad),
                reference=lambda: ref_ece(P, Y),
            )
        )

    # even_batches: accelerate's GradientState, as one process of two sees it on the last round (397 samples, batches of 50)
    loader = types.SimpleNamespace(
        batch_sampler=types.SimpleNamespace(even_batches=True),
        total_batch_size=100,
        end_of_dataloader=True,
        remainder=97,
    )

    def as_rank(rank: int, call: Callable[[], Any]):
        class GradientState:
            _shared_state = {"ready": True}
            in_dataloader, active_dataloader = True, loader
            end_of_dataloader = property(lambda self: loader.end_of_dataloader)
            remainder = property(lambda self: loader.remainder)

        class PartialState:
            num_processes, process_index = 2, rank

        saved = sys.modules.get("accelerate.state")
        sys.modules["accelerate.state"] = types.SimpleNamespace(GradientState=GradientState, PartialState=PartialState)
        try:
            return call()
        finally:
            if saved is None:
                sys.modules.pop("accelerate.state", None)
            else:
                sys.modules["accelerate.state"] = saved

    for rank, true_rows in ((0, 50), (1, 47)):
        add(
            Case(
                "processes",
                "metrics",
                f"even_batches: rank {rank}'s last batch of 50 ({true_rows} true rows)",
                lambda rank=rank: as_rank(
                    rank,
                    lambda: CalibrationAccumulator(confidence_dtype="float64").update(Z[:50], Y[:50]).compute().ece,
                ),
                reference=lambda true_rows=true_rows: ref_ece(P[:true_rows], Y[:true_rows]),
            )
        )
    add(
        Case(
            "processes",
            "metrics",
            "even_batches: a batch that is not the loader's (49 rows) warns, counts all",
            lambda: as_rank(1, lambda: _warns(lambda: CalibrationAccumulator().update(Z[:49], Y[:49]).n)),
            reference=lambda: (49, True),
        )
    )
    add(
        Case(
            "processes",
            "metrics",
            "even_batches: the Trainer's gathered predictions are kept whole",
            lambda: as_rank(
                1, lambda: CalibrationAccumulator()(types.SimpleNamespace(predictions=Z[:50], label_ids=Y[:50]))["n"]
            ),
            reference=lambda: 50,
        )
    )
    worker = ROOT / "tests" / "_accelerate_worker.py"
    if worker.is_file() and torch.distributed.is_available():

        def two_processes():
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nproc_per_node",
                    "2",
                    "--master_addr",
                    "127.0.0.1",
                    "--master_port",
                    str(port),
                    str(worker),
                    str(tmp),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if out.returncode != 0:
                raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "torchrun failed")
            ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
            return np.array([(r[True]["report"]["n"], r[True]["report"]["ece"]) for r in ranks])

        sys.path.insert(0, str(ROOT / "tests"))
        from _accelerate_worker import data as worker_data

        zw, yw = worker_data()
        add(
            Case(
                "processes",
                "metrics",
                "torchrun, 2 processes, accelerate even_batches=True, 397 samples: synced n and ECE",
                two_processes,
                reference=lambda: np.array([(397, ref_ece(softmax(zw), yw))] * 2),
                atol=1e-7,
            )
        )  # float32 logits: float32 exp
    return cases


def _warns(call: Callable[[], Any]) -> tuple[Any, bool]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call()
    return value, any(issubclass(w.category, UserWarning) for w in caught)


def model_route_cases(tmp: Path) -> list[Case]:
    """Items 10, 11 and 7 (shift --out): the model + dataset route names the flag and the cause."""
    cases: list[Case] = []
    add = cases.append
    model, data = _saved_route(tmp)
    route = ["--model", model, "--dataset", data, "--split", "test", "--no-cache", "--batch-size", "8"]
    for argv, names in (
        (["--model", "./nomodel", "--dataset", data, "--split", "test"], ("--model", "./nomodel")),
        (["--model", model, "--dataset", "./nodata"], ("--dataset", "./nodata")),
        (["--model", "no/such/model", "--dataset", data], ("--model",)),
        ([*route, "--image-column", "label"], ("--image-column", "label")),
        (["--model", model, "--dataset", tmp / "nolabels", "--no-cache"], ("--dataset", "no labels")),
        ([*route, "--device", "tpu"], ("--device", "tpu")),
        ([*route, "--device", "cuda:7"], ("--device",)),
        ([*route, "--split", "train"], ("--split", "train")),
        ([*route, "--label-column", "img"], ("--label-column", "img")),
    ):
        add(
            Case(
                "model + dataset route",
                "CLI",
                f"report {' '.join(str(a) for a in argv if str(a).startswith('-') or str(a).startswith('./') or a in ('tpu', 'cuda:7', 'label', 'train', 'img', 'no/such/model'))}",
                lambda argv=argv: cli("report", *argv),
                names,
            )
        )
    unwritable = Path("/proc/nope") if Path("/proc/self").is_dir() else None
    if unwritable is not None:
        for command, names in (
            (["fit", *route, "--method", "ts", "--out", unwritable / "cal"], ("--out",)),
            (["report", *route, "--diagram", unwritable / "d.png"], ("--diagram",)),
            (
                [
                    "apply",
                    "--calibrator",
                    tmp / "ts_route",
                    "--logits",
                    tmp / "route.npz",
                    "--save-logits",
                    unwritable / "c.npz",
                ],
                ("--save-logits",),
            ),
        ):
            if command[0] == "apply" and not (tmp / "ts_route").exists():
                TemperatureScaling().fit(Z, Y, progress_bar=False).save_pretrained(tmp / "ts_route")
                np.savez(tmp / "route.npz", logits=Z32, labels=Y)
            add(
                Case(
                    "model + dataset route",
                    "CLI",
                    f"{command[0]} {names[0]} <not writable>",
                    lambda command=command: cli(*command),
                    names,
                )
            )
    # shift --calibrator: the spelling decides; duplicates and unknown names are refused before the model runs
    work = tmp / "shift_cwd"
    work.mkdir()
    TemperatureScaling().fit(Z, Y, progress_bar=False).save_pretrained(work / "smart")  # a folder named like a method

    def shift(*argv, stderr=False):
        here = os.getcwd()
        os.chdir(work)
        try:
            out, err = cli_err("shift", *route, "--corruptions", "contrast", "--severities", "1", "--json", *argv)
            return (json.loads(out)["methods"], err) if stderr else json.loads(out)["methods"]
        finally:
            os.chdir(here)

    add(
        Case(
            "model + dataset route",
            "CLI",
            "shift --calibrator temperature_scaling smart ./smart (a folder smart here)",
            lambda: shift("--val-split", "validation", "--calibrator", "temperature_scaling", "smart", "./smart"),
            reference=lambda: ["uncalibrated", "temperature_scaling", "smart", "./smart"],
        )
    )
    add(
        Case(
            "model + dataset route",
            "CLI",
            "shift --calibrator smart (a folder smart here): the method, and a warning",
            lambda: (lambda r: (r[0], "write ./smart" in r[1]))(
                shift("--val-split", "validation", "--calibrator", "smart", stderr=True)
            ),
            reference=lambda: (["uncalibrated", "smart"], True),
        )
    )
    for calibrators, names in (
        (["ts", "temperature_scaling"], ("--calibrator", "same method")),
        (["smart", "SMART"], ("--calibrator", "same method")),
        (["platt"], ("--calibrator", "platt")),
        (["./nothing"], ("--calibrator", "./nothing")),
        (["./smart", str(work / "smart")], ("--calibrator", "same folder")),
    ):
        add(
            Case(
                "model + dataset route",
                "CLI",
                f"shift --calibrator {' '.join(calibrators)}",
                lambda calibrators=calibrators: shift("--calibrator", *calibrators),
                names,
            )
        )
    add(
        Case(
            "model + dataset route",
            "CLI",
            "shift --val-split test --split test: warns",
            lambda: "fitted on the very samples" in shift("--val-split", "test", "--calibrator", "ts", stderr=True)[1],
            reference=lambda: True,
        )
    )
    add(
        Case(
            "existing output files",
            "CLI",
            "shift --out <a model's folder>",
            lambda: shift("--out", model),
            ("--out", "model's folder"),
            untouched=_unchanged(model),
        )
    )
    return cases


def smaller_cases(tmp: Path) -> list[Case]:
    """Item 12: checkpoints re-saved in a narrower float, tampered maps and MaC-Cal heads, seeds."""
    from safetensors.torch import load_file, save_file

    from hf_calibration.calibrators import create_calibrator, list_calibrators

    cases: list[Case] = []
    add = cases.append
    ts = TemperatureScaling().fit(Z, Y, progress_bar=False)
    ts.save_pretrained(tmp / "ts")

    def resaved(dtype, nudge=False):
        folder = tmp / f"ts_{dtype}_{nudge}"
        shutil.copytree(tmp / "ts", folder)
        tensors = load_file(folder / "model.safetensors")
        stored = tensors["log_temperature"].to(dtype)
        if nudge:
            stored = torch.nextafter(stored, torch.tensor(10.0, dtype=dtype))
        save_file(
            {"log_temperature": stored},
            folder / "model.safetensors",
            metadata={"format": "pt", "calibrator": "temperature_scaling"},
        )
        return folder, float(stored)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        folder, stored = resaved(dtype)
        add(
            Case(
                "corrupted / tampered checkpoints",
                "calibrators",
                f"TS re-saved in {str(dtype).split('.')[1]}: loads, T as stored",
                lambda folder=folder: load_calibrator(folder).fitted_temperature,
                reference=lambda stored=stored: math.exp(stored),
                atol=1e-12,
            )
        )
        folder, _ = resaved(dtype, nudge=True)
        add(
            Case(
                "corrupted / tampered checkpoints",
                "calibrators",
                f"TS re-saved in {str(dtype).split('.')[1]}, one step off: refused",
                lambda folder=folder: load_calibrator(folder),
                ("do not match",),
            )
        )
    for kind in ("isotonic", "isotonic_ovr", "histogram_binning", "spline"):
        create_calibrator(kind).fit(Z, Y, progress_bar=False).save_pretrained(tmp / kind)
        for name, value in (("maps.values", 1.5), ("maps.values", -0.25), ("maps.knots", 1.5), ("maps.knots", -0.5)):
            folder = tmp / f"{kind}_{name}_{value}"
            shutil.copytree(tmp / kind, folder)
            tensors = load_file(folder / "model.safetensors")
            index = 0 if (name, value) != ("maps.knots", 1.5) else len(tensors[name]) - 1  # the order of the knots kept
            tensors[name][index] = value
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt", "calibrator": kind})
            add(
                Case(
                    "corrupted / tampered checkpoints",
                    "calibrators",
                    f"{kind}: {name}[{index}] = {value}",
                    lambda folder=folder: load_calibrator(folder),
                    ("outside [0, 1]", name.split(".")[1]),
                )
            )
        add(
            Case(
                "corrupted / tampered checkpoints",
                "calibrators",
                f"{kind}: untouched checkpoint loads, same probabilities",
                lambda kind=kind: load_calibrator(tmp / kind).predict_proba(Z).numpy(),
                reference=lambda kind=kind: (
                    create_calibrator(kind).fit(Z, Y, progress_bar=False).predict_proba(Z).numpy()
                ),
                atol=0,
            )
        )
    maccal = _maccal_folder(tmp / "maccal")
    if maccal is not None:
        from transformers import AutoModelForImageClassification

        from hf_calibration.maccal import load_maccal_model

        head = json.loads((maccal / "config.json").read_text())["maccal_head"]["path"]
        for value in (float("nan"), float("inf")):
            folder = tmp / f"maccal_{value}"
            shutil.copytree(maccal, folder)
            tensors = load_file(folder / "model.safetensors")
            name = next(k for k in sorted(tensors) if k.startswith(head + ".") and tensors[k].is_floating_point())
            tensors[name].view(-1)[0] = value
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
            for loader in (load_maccal_model, AutoModelForImageClassification.from_pretrained):
                add(
                    Case(
                        "corrupted / tampered checkpoints",
                        "maccal",
                        f"MaC-Cal head {name} = {value}: {loader.__name__}",
                        lambda loader=loader, folder=folder: loader(folder),
                        ("MaC-Cal head", "NaN or inf"),
                    )
                )
    import inspect

    from hf_calibration.calibrators._registry import get_calibrator_class

    for kind in list_calibrators():
        cls = get_calibrator_class(kind)
        if "seed" not in inspect.signature(cls).parameters:
            continue
        for seed in (-1, -(2**63), 2**64):
            add(
                Case(
                    "hyper-parameters",
                    "calibrators",
                    f"{cls.__name__}(seed={seed})",
                    lambda cls=cls, seed=seed: cls(seed=seed),
                    ("seed",),
                )
            )
    return cases


def maccal_feature_cases(tmp: Path) -> list[Case]:
    """Item 9: ``maccal_stage(model, features=(X, Y))`` checks its input before the first epoch."""
    from hf_calibration.maccal import MaCCalConfig, maccal_stage

    model = tiny_vit()
    d = model.config.hidden_size
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, d, generator=g), torch.randint(0, K, (64,), generator=g)
    config = MaCCalConfig(epochs=1, batch_size=32, progress=False)

    def stage(features):
        return lambda: maccal_stage(tiny_vit(), features=features, config=config)

    nan_x = x.clone()
    nan_x[63, 0] = float("nan")
    inf_x = x.clone()
    inf_x[5, 3] = float("inf")
    bad = [
        ("a NaN feature in the last row", (nan_x, y), "features[0]"),
        ("an inf feature", (inf_x, y), "features[0]"),
        (f"a label = K = {K}", (x, torch.where(torch.arange(64) == 7, K, y)), "features[1]"),
        ("a label of -1", (x, torch.where(torch.arange(64) == 7, -1, y)), "features[1]"),
        ("64 features, 63 labels", (x, y[:63]), "features"),
        ("float labels", (x, y.double() + 0.4), "features[1]"),
        (f"features of width {d + 1}, not the head's {d}", (torch.randn(64, d + 1, generator=g), y), "features[0]"),
        ("2-D labels", (x, y[:, None]), "features[1]"),
        ("not a pair", (x,), "features"),
    ]
    return [
        Case(
            "labels" if "label" in name else "NaN / inf" if "NaN" in name or "inf" in name else "rank / shape",
            "maccal",
            f"maccal_stage(features=...): {name}",
            stage(features),
            (expect,),
        )
        for name, features, expect in bad
    ]


def diagram_cases(tmp: Path) -> list[Case]:
    """Item 14: the diagram's options are checked, and its per-bin intervals are Wilson's (scipy)."""
    from scipy.stats import binomtest

    p = softmax(Z)
    cases = [
        Case(
            "hyper-parameters",
            "metrics",
            "reliability_diagram(count_scale='logarithmic')",
            lambda: metrics.reliability_diagram(Z, Y, count_scale="logarithmic"),
            ("count_scale",),
        ),
        Case(
            "hyper-parameters",
            "metrics",
            "reliability_diagram(min_count=-1)",
            lambda: metrics.reliability_diagram(Z, Y, min_count=-1),
            ("min_count",),
        ),
        Case(
            "hyper-parameters",
            "metrics",
            "reliability_table(ci=95)",
            lambda: metrics.reliability_table(Z, Y, 15, ci=95),
            ("ci",),
        ),
    ]
    conf, hit = p.max(1), (p.argmax(1) == Y)
    index = _bins(conf, 15)

    def wilson():
        out = []
        for b in range(15):
            n = int((index == b).sum())
            if n:
                interval = binomtest(int(hit[index == b].sum()), n).proportion_ci(0.95, method="wilson")
                out.append([interval.low, interval.high])
        return np.array(out)

    def ours():
        table = metrics.reliability_table(Z, Y, 15, ci=0.95)
        keep = np.asarray(table.count) > 0
        return np.stack([np.asarray(table.accuracy_low)[keep], np.asarray(table.accuracy_high)[keep]], axis=1)

    cases.append(
        Case(
            "extreme values",
            "metrics",
            "reliability_table(ci=0.95): per-bin Wilson intervals (scipy binomtest)",
            ours,
            reference=wilson,
            atol=1e-9,
        )
    )
    return cases


def demo_log_cases(tmp: Path) -> list[Case]:
    """Item 15: the demo run with stderr that is not a terminal writes no progress-bar frames (no carriage returns)."""
    from hf_calibration.demo import DemoConfig, run_demo

    def frames() -> int:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            run_demo(
                DemoConfig(
                    output_dir=str(tmp / "demo"),
                    epochs=2,
                    train_size=100,
                    calibration_size=60,
                    test_size=80,
                    maccal_epochs=2,
                    pipeline_images=2,
                    progress=True,
                )
            )
        return err.getvalue().count("\r")

    return [
        Case(
            "processes",
            "CLI",
            "demo with stderr not a terminal: carriage-return frames written",
            frames,
            reference=lambda: 0,
        )
    ]


# ----------------------------------------------------------------------------- the fourth sweep (issue 29)


def _small_draws(k: int, n: int, seed: int, test_size: int = 20_000):
    """The generator of ``benchmarks/small_sample_selection.py``: (calibration logits, labels, test logits, labels)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import small_sample_selection

    _, z, y, zt, yt = small_sample_selection.configuration(k, n, seed, test_size)
    return z, y, zt, yt


def _test_nll(calibrator, zt, yt) -> float:
    with torch.no_grad():
        return ref_nll(softmax(calibrator(torch.from_numpy(zt), from_logits=True).double().numpy()), yt)


def _warned(call: Callable[[], Any], category) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return any(issubclass(w.category, category) for w in caught)


def small_sample_cases(tmp: Path) -> list[Case]:
    """Items 1, 2 and 7: small calibration sets never end worse than uncalibrated in silence; SMART on separable logits."""
    from hf_calibration.calibrators import (
        AutoCalibrator,
        HeldOutWorseWarning,
        SMARTCalibrator,
        compare_calibrators,
        create_calibrator,
    )
    from hf_calibration.training.eval_calibration import fit_eval_calibration

    cases: list[Case] = []
    add = cases.append
    # configurations where main's AutoCalibrator made the test NLL worse (benchmarks/results/small_sample_selection.md)
    for k, n, seed in ((2, 20, 2), (2, 20, 4), (2, 20, 7), (2, 50, 3), (2, 50, 6), (10, 20, 7), (10, 50, 0)):

        def no_worse(k=k, n=n, seed=seed):
            z, y, zt, yt = _small_draws(k, n, seed)
            return bool(
                _test_nll(AutoCalibrator().fit(z, y, progress_bar=False), zt, yt) <= ref_nll(softmax(zt), yt) + 1e-12
            )

        add(
            Case(
                "small calibration sets",
                "calibrators",
                f"AutoCalibrator, K = {k}, N = {n}, seed {seed}: test NLL no worse than uncalibrated",
                no_worse,
                reference=lambda: True,
            )
        )
    for cls_name, k, n, seed in (("smart", 2, 200, 4), ("pts", 10, 50, 3), ("pts", 10, 50, 0)):

        def warns_when_worse(cls_name=cls_name, k=k, n=n, seed=seed):
            z, y, zt, yt = _small_draws(k, n, seed)
            holder = {}
            warned = _warned(
                lambda: holder.setdefault("c", create_calibrator(cls_name).fit(z, y, progress_bar=False)),
                HeldOutWorseWarning,
            )
            return warned == (_test_nll(holder["c"], zt, yt) > ref_nll(softmax(zt), yt))

        add(
            Case(
                "small calibration sets",
                "calibrators",
                f"{cls_name} alone, K = {k}, N = {n}, seed {seed}: warns exactly when the test NLL is worse",
                warns_when_worse,
                reference=lambda: True,
            )
        )
    rng = np.random.default_rng(3)
    yc = rng.integers(0, 2, 200)
    zc = 2.2 * (rng.normal(size=(200, 2)) + 1.1 * np.eye(2)[yc])  # calibrated by construction

    def eval_keeps_identity():
        result = fit_eval_calibration(zc, yc, "smart")
        return bool(result.calibrator.is_identity and result.reason is not None and "not kept" in result.card_section())

    add(
        Case(
            "small calibration sets",
            "CLI",
            "calibrate_on_eval='smart' on a calibrated model: the identity is kept, and said",
            eval_keeps_identity,
            reference=lambda: True,
        )
    )
    zs, ys = Z.copy(), Y.copy()
    zs[np.arange(len(Y)), Y] += 50

    def separable():
        smart = SMARTCalibrator().fit(zs, ys, progress_bar=False)
        table = compare_calibrators(zs, ys, ["smart"], race=False, progress_bar=False)
        return smart.fit_info_.get("fallback"), len(table["smart"].errors)

    add(
        Case(
            "extreme values",
            "calibrators",
            "SMART on separable logits (true class + 50): fallback, no fold failure",
            separable,
            reference=lambda: ("temperature_scaling", 0),
        )
    )
    return cases


def conformal_cases(tmp: Path) -> list[Case]:
    """Items 3, 4, 5, 6, 11 and 12: conformal prediction sets."""
    from hf_calibration.calibrators import TemperatureScaling
    from hf_calibration.conformal import ConformalPredictor

    cases: list[Case] = []
    add = cases.append
    rng = np.random.default_rng(3)
    y2 = rng.integers(0, 2, 400)
    z2 = (3 * rng.normal(size=(400, 2)) + 4 * np.eye(2)[y2]).astype(np.float32)
    thr = ConformalPredictor("thr", allow_empty=True).fit(z2, y2, alpha=0.1)
    thr.q_hat.fill_(0.509)  # between the two readings of the row: as logits {0, 1}, as probabilities {0}
    row = np.array([[0.5078, 0.4828]], dtype=np.float32)
    add(
        Case(
            "probabilities vs logits",
            "conformal",
            "predict_sets([[0.5078, 0.4828]]) alone, fitted on logits: the logits' set",
            lambda: thr.predict_sets(row)[0].tolist(),
            reference=lambda: (softmax(row)[0] >= 1 - float(thr.q_hat)).tolist(),
        )
    )
    add(
        Case(
            "probabilities vs logits",
            "conformal",
            "predict_sets: the same row alone and in a batch of 6",
            lambda: thr.predict_sets(row)[0].tolist() == thr.predict_sets(np.vstack([row, z2[:5]]))[0].tolist(),
            reference=lambda: True,
        )
    )
    add(
        Case(
            "rank / shape",
            "conformal",
            "predict_sets(nested list), as fit takes: the array's sets",
            lambda: thr.predict_sets(z2[:5].tolist()).tolist(),
            reference=lambda: (softmax(z2[:5]) >= 1 - float(thr.q_hat)).tolist(),
        )
    )
    # item 4: a tampered conformal/config.json
    zc, yc = make_data(1200, 10, seed=2)
    ConformalPredictor("aps", seed=1).fit(zc, yc, calibrator=TemperatureScaling()).save_pretrained(tmp / "cp")
    for label, edit in (
        ("fit.alpha 0.1 -> 0.2", lambda c: c["fit"].__setitem__("alpha", 0.2)),
        ("fit.q_hat edited", lambda c: c["fit"].__setitem__("q_hat", 0.5)),
        ("randomized: false", lambda c: c.__setitem__("randomized", False)),
        ("calibrator: null (calibrator/ kept)", lambda c: c["fit"].__setitem__("calibrator", None)),
        ("fit.coverage edited (shown in the card)", lambda c: c["fit"].__setitem__("coverage", 0.99)),
    ):
        folder = tmp / f"cp_{len(cases)}"
        shutil.copytree(tmp / "cp", folder)
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
        add(
            Case(
                "corrupted / tampered checkpoints",
                "conformal",
                f"ConformalPredictor.from_pretrained: config.json {label}",
                lambda folder=folder: ConformalPredictor.from_pretrained(folder),
                ("does not match its weights",),
            )
        )
    folder = tmp / "cp_nocal"
    shutil.copytree(tmp / "cp", folder)
    shutil.rmtree(folder / "calibrator")
    add(
        Case(
            "corrupted / tampered checkpoints",
            "conformal",
            "ConformalPredictor.from_pretrained: calibrator/ deleted",
            lambda: ConformalPredictor.from_pretrained(folder),
            ("folder is missing", "calibrator"),
        )
    )
    junk = tmp / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("x")
    add(
        Case(
            "corrupted / tampered checkpoints",
            "conformal",
            "ConformalPredictor.from_pretrained(a folder of junk)",
            lambda: ConformalPredictor.from_pretrained(junk),
            ("conformal predictor checkpoint",),
        )
    )
    # item 5: ties at cumulative mass 1
    yw = rng.integers(0, 2, 1000)
    zw = (rng.normal(size=(1000, 2)) + np.eye(2)[yw]).astype(np.float32)

    def ties():
        from hf_calibration.conformal.card import card_values

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            predictor = ConformalPredictor("aps", randomized=False, allow_empty=True).fit(zw, yw, alpha=0.1)
        return predictor.fit_info_["ties_at_threshold"], "does not hold here" in card_values(predictor)["guarantee"]

    def ties_by_hand():
        pw = softmax(zw)
        scores = np.where(pw.argmax(1) == yw, pw.max(1), 1.0)
        q = np.sort(scores)[math.ceil(1001 * 0.9) - 1]
        return int((scores == q).sum()), True

    add(
        Case(
            "extreme values",
            "conformal",
            "non-randomised APS, K = 2, allow_empty: ties at q_hat counted, no ceiling claimed",
            ties,
            reference=ties_by_hand,
        )
    )
    # item 6: one image, one set
    pipe, images = tiny_pipeline()
    predictor = ConformalPredictor("raps", allow_empty=True, seed=2).fit(
        rng.normal(scale=0.05, size=(1000, K)).astype(np.float32), rng.integers(0, K, 1000), alpha=0.4
    )
    predictor.attach(pipe)
    from PIL import Image

    pictures = [
        Image.fromarray((255 * (images[i].permute(1, 2, 0).numpy().clip(-1, 1) + 1) / 2).astype(np.uint8))
        for i in range(4)
    ]

    def sets(results):
        return [sorted(r["label"] for r in rows if r["in_set"]) for rows in results]

    add(
        Case(
            "processes",
            "conformal",
            "pipeline: the same 4 images, two calls and one at a time: the same sets",
            lambda: (
                sets(pipe(pictures, top_k=1))
                == sets(pipe(pictures, top_k=1))
                == [sets([pipe(p, top_k=1)])[0] for p in pictures]
            ),
            reference=lambda: True,
        )
    )
    # item 12: conformal --dry-run
    np.savez(tmp / "cp.npz", logits=zc, labels=yc)
    before = set(Path(tempfile.gettempdir()).glob("hf_calibration_push_*"))

    def dry_run():
        out = cli("conformal", "--logits", tmp / "cp.npz", "--method", "thr", "--push-to-hub", "me/vit", "--dry-run")
        left = set(Path(tempfile.gettempdir()).glob("hf_calibration_push_*")) - before
        return (
            "would receive README.md (" in out
            and "config.json (" in out
            and not left
            and str(tempfile.gettempdir()) not in out
        )

    add(
        Case(
            "existing output files",
            "CLI",
            "conformal --dry-run: lists the files, prints no folder that is gone, leaves none",
            dry_run,
            reference=lambda: True,
        )
    )
    return cases


def loading_cases(tmp: Path) -> list[Case]:
    """Items 10 and 11: load_calibrated_model / pipeline name the folder or argument and the cause."""
    from hf_calibration import load_calibrated_model, pipeline
    from hf_calibration.calibrators import TemperatureScaling, VectorScaling

    cases: list[Case] = []
    add = cases.append
    model = tiny_model_folder(tmp / "model")
    z5, y5 = make_data(300, K + 2, seed=4)
    TemperatureScaling().fit(Z, Y, progress_bar=False).save_pretrained(tmp / "ts_k")
    for name, setup in (
        (
            "calibrator/ without config.json",
            lambda f: (shutil.copytree(tmp / "ts_k", f / "calibrator"), (f / "calibrator" / "config.json").unlink()),
        ),
        ("a file named calibrator", lambda f: (f / "calibrator").write_text("x")),
        (
            "temperature scaling fitted for K + 2",
            lambda f: TemperatureScaling().fit(z5, y5, progress_bar=False).save_pretrained(f / "calibrator"),
        ),
        (
            "vector scaling fitted for K + 2",
            lambda f: VectorScaling().fit(z5, y5, progress_bar=False).save_pretrained(f / "calibrator"),
        ),
    ):
        folder = tmp / f"model_{len(cases)}"
        shutil.copytree(model, folder)
        setup(folder)
        add(
            Case(
                "Hub and attach",
                "calibrators",
                f"load_calibrated_model: {name}",
                lambda folder=folder: load_calibrated_model(folder),
                ("calibrator",),
                untouched=_unchanged(folder),
            )
        )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "load_calibrated_model('./no/such/folder')",
            lambda: load_calibrated_model("./no/such/folder"),
            ("model",),
        )
    )
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "pipeline(model=<the weights file>)",
            lambda: pipeline("image-classification", model=model / "model.safetensors"),
            ("model",),
        )
    )
    return cases


def friction_cases(tmp: Path) -> list[Case]:
    """Items 9, 11, 13, 14 and 15: the JSON report, merge, calibrated=, the compare table, exports, notices, options."""
    import types

    import hf_calibration
    from hf_calibration.calibrators import compare_calibrators
    from hf_calibration.metrics import CalibrationAccumulator

    cases: list[Case] = []
    add = cases.append

    # item 8
    def trainer_with(labels):
        import datasets
        from transformers import TrainingArguments

        from hf_calibration import CalibrationTrainer

        table = datasets.Dataset.from_dict(
            {"pixel_values": np.zeros((len(labels), 3, 8, 8), np.float32).tolist(), "labels": labels}
        )
        args = TrainingArguments(
            output_dir=str(tmp / "trainer"), report_to=[], use_cpu=True, save_strategy="no", max_steps=1
        )
        return CalibrationTrainer(
            model=tiny_vit(), args=args, train_dataset=table, eval_dataset=table, calibrate_on_eval=True
        )

    add(
        Case(
            "labels",
            "CLI",
            "CalibrationTrainer(calibrate_on_eval): 60 eval rows, 55 labelled -100 (before training)",
            lambda: trainer_with([0, 1, 2, 3, 4] + [-100] * 55),
            ("labelled",),
        )
    )
    # item 9
    p = P.copy()
    p[0] = 0.0
    p[0, (Y[0] + 1) % K] = 1.0  # the true class at probability 0: NLL inf
    np.savez(tmp / "inf.npz", logits=p, labels=Y)

    def json_inf():
        data = json.loads(
            cli("report", "--logits", tmp / "inf.npz", "--probs", "--json", "--ci", "0.9", "--n-boot", "50")
        )
        return data["nll"], data["intervals"]["nll"]["high"], data["non_finite"]["nll.high"]

    add(
        Case(
            "extreme values",
            "CLI",
            "report --json --ci with an infinite NLL: null ends, listed in non_finite",
            json_inf,
            reference=lambda: (None, None, "inf"),
        )
    )
    # item 11
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "CalibrationAccumulator(ci=0.9).merge(no interval): names ci / n_boot / seed",
            lambda: CalibrationAccumulator(ci=0.9, n_boot=50).merge(CalibrationAccumulator()),
            ("ci=",),
        )
    )
    for shape in ((len(Y), K - 1), (len(Y), K + 1)):
        add(
            Case(
                "rank / shape",
                "metrics",
                f"reliability_diagram(calibrated=<{shape}>) for (N, {K}) preds",
                lambda shape=shape: metrics.reliability_diagram(Z, Y, calibrated=np.zeros(shape)),
                ("calibrated",),
            )
        )
    # item 13
    table = compare_calibrators(
        Z, Y, ["temperature_scaling", "isotonic"], cv=3, keep_predictions=True, progress_bar=False
    )
    add(
        Case(
            "hyper-parameters",
            "calibrators",
            "print(compare table): the rule and the pick",
            lambda: f"lowest ece: {table.best()}" in str(table),
            reference=lambda: True,
        )
    )

    def wins_agree():
        paired = table.paired_bootstrap("ece", n_boot=200)
        return all(paired.wins[m] <= 0.5 for m in paired.pooled if float(paired.difference[m]) > 0)

    add(
        Case(
            "hyper-parameters",
            "calibrators",
            "paired bootstrap: a worse pooled Δ never 'beats' the best in most resamples",
            wins_agree,
            reference=lambda: True,
        )
    )
    # item 14
    add(
        Case(
            "Hub and attach",
            "calibrators",
            "hf_calibration.calibrators.attached_calibrator (named in the docs)",
            lambda: (
                hf_calibration.calibrators.attached_calibrator is hf_calibration.calibrators.attach.attached_calibrator
            ),
            reference=lambda: True,
        )
    )

    def identity_notice():
        from hf_calibration.calibrators.selection import identity_calibrator
        from hf_calibration.conformal import ConformalPredictor

        pipe, _ = tiny_pipeline()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            identity_calibrator(Z, Y, None, "nothing helped", who="test").attach(pipe.model)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        log = logging.getLogger("hf_calibration")
        log.addHandler(handler)
        level = log.level
        log.setLevel(logging.WARNING)
        try:
            ConformalPredictor("thr").fit(Z, Y).attach(pipe)
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
        return [r.getMessage() for r in records if "calibrator is attached" in r.getMessage()]

    add(
        Case(
            "Hub and attach",
            "conformal",
            "conformal attach beside an identity calibrator (T = 1): no 'calibrator is attached' notice",
            identity_notice,
            reference=lambda: [],
        )
    )
    loader = types.SimpleNamespace(
        batch_sampler=types.SimpleNamespace(even_batches=True),
        total_batch_size=100,
        end_of_dataloader=True,
        remainder=97,
    )

    class GradientState:
        _shared_state = {"ready": True}
        in_dataloader, active_dataloader, end_of_dataloader, remainder = True, loader, True, 97

    class PartialState:
        num_processes, process_index = 2, 0

    def slices_on_rank0():
        saved = sys.modules.get("accelerate.state")
        sys.modules["accelerate.state"] = types.SimpleNamespace(GradientState=GradientState, PartialState=PartialState)
        try:
            acc = CalibrationAccumulator(confidence_dtype="float64")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for i in range(0, 50, 20):
                    acc.update(Z[i : min(i + 20, 50)], Y[i : min(i + 20, 50)])
            warned = any(
                "counted twice" in str(w.message) for w in caught
            )  # the issue's false positive, not any warning
            return np.array([float(warned), acc.compute().ece])
        finally:
            if saved is None:
                sys.modules.pop("accelerate.state", None)
            else:
                sys.modules["accelerate.state"] = saved

    add(
        Case(
            "processes",
            "metrics",
            "even_batches: rank 0's last batch (no repeats) fed in 3 slices: no warning, all rows",
            slices_on_rank0,
            reference=lambda: np.array([0.0, ref_ece(P[:50], Y[:50])]),
        )
    )
    # item 15
    np.savez(tmp / "z.npz", logits=Z, labels=Y)
    add(
        Case(
            "hyper-parameters",
            "CLI",
            "report --n-boot 100 without --ci",
            lambda: cli("report", "--logits", tmp / "z.npz", "--n-boot", "100"),
            ("n_boot", "--n-boot"),
        )
    )
    add(
        Case(
            "hyper-parameters",
            "metrics",
            "ece(ci=0.95, seed=2**64)",
            lambda: metrics.ece(Z, Y, ci=0.95, seed=2**64),
            ("seed",),
        )
    )
    add(
        Case(
            "dtype",
            "metrics",
            "ece(ci=np.float32(0.95)).level",
            lambda: metrics.ece(Z, Y, ci=np.float32(0.95), n_boot=20).level,
            reference=lambda: 0.95,
            atol=0,
        )
    )
    spaces = tmp / "spaces"
    cli(
        "push-metrics",
        "--namespace",
        "org",
        "--dry-run",
        "--out",
        spaces,
        "--requirement",
        "hf-calibration==0.1.0",
        "--metrics",
        "ece",
    )
    card = spaces / "ece" / "README.md"
    card.write_text(card.read_text() + "\nmy notes\n")
    add(
        Case(
            "existing output files",
            "CLI",
            "push-metrics --dry-run --overwrite over a README edited after the first dry run",
            lambda: cli(
                "push-metrics",
                "--namespace",
                "org",
                "--dry-run",
                "--out",
                spaces,
                "--requirement",
                "hf-calibration==0.1.0",
                "--metrics",
                "ece",
                "--overwrite",
            ),
            ("README.md",),
            untouched=_unchanged(spaces),
        )
    )
    return cases


def _maccal_folder(folder: Path) -> Path | None:
    """A tiny ViT after a one-epoch MaC-Cal stage on random features, saved (None when the stage cannot run here)."""
    from hf_calibration.maccal import MaCCalConfig, maccal_stage

    model = tiny_vit()
    g = torch.Generator().manual_seed(0)
    features, labels = torch.randn(64, model.config.hidden_size, generator=g), torch.randint(0, K, (64,), generator=g)
    maccal_stage(model, features=(features, labels), config=MaCCalConfig(epochs=1, batch_size=32, progress=False))
    model.save_pretrained(folder)
    return folder


def classify(case: Case) -> tuple[str, str]:
    from hf_calibration._core.checkpoints import HubUnreachableError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = case.call()
    except (ValueError, TypeError, HubUnreachableError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if case.untouched is not None and not case.untouched():
            return BAD, f"{type(err).__name__}, but a user's file changed: {message}"
        if case.names and any(n in message for n in case.names):
            return ERROR, message
        return BAD, f"{type(err).__name__} naming none of {list(case.names)}: {message}"
    except Exception as err:  # noqa: BLE001 - everything else is a crash
        return BAD, f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
    if case.untouched is not None and not case.untouched():
        return BAD, "a user's file changed"
    if case.reference is None:
        return BAD, f"accepted, returned {_short(value)}"
    expected = case.reference()
    if _close(value, expected, case.atol):
        return CORRECT, f"= {_short(value)}"
    off = _max_difference(value, expected)
    return BAD, f"returned {_short(value)}, expected {_short(expected)}" + (
        f" (off by {off:.2g}, tolerance {case.atol:g})" if off is not None else ""
    )


def _close(a, b, atol) -> bool:
    if isinstance(a, (dict, list, str, bool, tuple)) or isinstance(b, (dict, list, str, bool, tuple)):
        return a == b
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= atol))


def _max_difference(a, b) -> float | None:
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        return float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else None
    except (TypeError, ValueError):
        return None


def _short(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    if isinstance(v, (np.ndarray, torch.Tensor)):
        return f"array{tuple(v.shape)}"
    text = repr(v)
    return text if len(text) < 80 else text[:77] + "..."


def run(verbose: bool) -> tuple[list[tuple[Case, str, str]], float]:
    from transformers.utils import logging as hf_logging

    logging.getLogger("hf_calibration").setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bad_inputs_") as tmpdir:
        tmp = Path(tmpdir)
        for build in (
            metric_cases,
            calibrator_cases,
            registry_cases,
            checkpoint_cases,
            output_cases,
            cli_cases,
            hub_cases,
            loss_cases,
            new_surface_cases,
            detection_cases,
            per_class_cases,
            image_cases,
            cache_cases,
            user_file_cases,
            accumulator_cases,
            model_route_cases,
            smaller_cases,
            maccal_feature_cases,
            diagram_cases,
            demo_log_cases,
            small_sample_cases,
            conformal_cases,
            loading_cases,
            friction_cases,
        ):
            sub = tmp / build.__name__
            sub.mkdir()
            for case in build(sub):
                case.source = build.__name__
                outcome, detail = classify(case)
                results.append((case, outcome, detail))
                if verbose or outcome == BAD:
                    print(f"[{outcome:>20}] {case.category} / {case.area}: {case.name} -> {detail}", flush=True)
    return results, time.perf_counter() - start


def summary(results) -> str:
    categories: dict[str, dict] = {}
    for case, outcome, _ in results:
        row = categories.setdefault(
            case.category, {"cases": 0, ERROR: 0, CORRECT: 0, BAD: 0, "areas": set(), "bad_areas": set()}
        )
        row["cases"] += 1
        row[outcome] += 1
        row["areas"].add(case.area)
        if outcome == BAD:
            row["bad_areas"].add(case.area)
    lines = [
        "| category | cases | clear error | correct value | SILENT WRONG / crash | areas | not yet right in |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    total = {ERROR: 0, CORRECT: 0, BAD: 0}
    for name, row in categories.items():
        for key in total:
            total[key] += row[key]
        lines.append(
            f"| {name} | {row['cases']} | {row[ERROR]} | {row[CORRECT]} | {row[BAD]} | {', '.join(sorted(row['areas']))} | "
            f"{', '.join(sorted(row['bad_areas'])) or '-'} |"
        )
    lines.append(f"| **all** | {len(results)} | {total[ERROR]} | {total[CORRECT]} | {total[BAD]} | | |")
    return "\n".join(lines)


def write_markdown(results, seconds: float, note: str = "") -> str:
    from hf_calibration import __version__

    bad = [(c, d) for c, o, d in results if o == BAD]
    by_area: dict[str, int] = {}
    for case, _ in bad:
        by_area[case.area] = by_area.get(case.area, 0) + 1
    text = [
        "## Bad-input matrix (`benchmarks/bad_inputs.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}, "
        f"hf_calibration {__version__}. Command: `python benchmarks/bad_inputs.py` ({len(results)} calls, {seconds:.0f} s).",
        "",
        "Each call is classified by what it did: a `ValueError`/`TypeError` naming the argument (the CLI: one line, exit 1/2; "
        "the Hub: one sentence) with no user file changed; a value equal to an independent computation (numpy/scipy "
        "formulas in the script, relplot for smECE); or **SILENT WRONG / crash** (a wrong value, bad input accepted, a raw "
        "library exception, a user's file replaced).",
        "",
        summary(results),
        "",
        *([note, ""] if note else []),
    ]
    per_source: dict[str, list[str]] = {}
    for case, outcome, _ in results:
        per_source.setdefault(case.source, []).append(outcome)
    third = [
        f"`{name}` (item{'s' if ',' in items else ''} {items}): {len(per_source.get(name, []))} calls, "
        f"{per_source.get(name, []).count(BAD)} wrong"
        for name, items in ISSUE_23_ITEMS.items()
    ]
    text += ["Calls of the third sweep (issue 23), by the items they probe: " + "; ".join(third) + ".", ""]
    fourth = [
        f"`{name}` (item{'s' if ',' in items else ''} {items}): {len(per_source.get(name, []))} calls, "
        f"{per_source.get(name, []).count(BAD)} wrong"
        for name, items in ISSUE_29_ITEMS.items()
    ]
    text += ["Calls of the fourth sweep (issue 29, section 3), by the items they probe: " + "; ".join(fourth) + ".", ""]
    guarded = [(c, o) for c, o, _ in results if c.untouched is not None]
    touched = [c for c, o, d in results if o == BAD and "user's file changed" in d]
    if bad:
        text += [
            f"Not yet right ({len(bad)}; by area: {', '.join(f'{a} {n}' for a, n in sorted(by_area.items()))}):",
            "",
        ]
        text += [f"- {c.category} / {c.area}: {c.name} — {d}" for c, d in bad]
    else:
        text.append("No call gave a silent wrong number or a crash.")
    text += [
        "",
        f"{len(guarded)} calls also check, after the call, that the user's files around them (a README.md, notes, "
        "figures, a model's folder, the input files) are byte for byte as before, or that nothing was created: "
        + ("none touched a user's file." if not touched else f"{len(touched)} did (listed above)."),
    ]
    return "\n".join(text) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case, not only the bad ones")
    parser.add_argument(
        "--out", type=Path, default=OUT, help=f"markdown section to write (default {OUT.relative_to(ROOT)})"
    )
    parser.add_argument("--note", default="", help="a sentence to print under the table (what this run is of)")
    args = parser.parse_args()
    results, seconds = run(args.verbose)
    print()
    print(summary(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(write_markdown(results, seconds, args.note))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
