"""Bad and tricky input to the metric functions, the accumulator and the evaluate scripts (one case a test; see
``tests/_bad_inputs.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _bad_inputs import (
    DEFECTS,
    MIXED,
    P5,
    Y5,
    Z5,
    Case,
    K,
    P,
    Y,
    Z,
    _binned_gaps,
    _bins,
    case_params,
    check,
    cli,
    malformed,
    ref_adaece,
    ref_brier,
    ref_classwise_ece,
    ref_ece,
    ref_mce,
    ref_nll,
    ref_nll_logits,
    ref_smece,
    shared,
    softmax,
    warns_user,
)

from hf_calibration import metrics


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

        from hf_calibration.hub import metric_path

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
    s1 = 1.0 / (1.0 + np.exp(-Z[:, 0]))  # an (N, 1) logit column is a binary head's: ECE of sigmoid(z) vs y == 1
    add(
        Case(
            "rank / shape",
            "metrics",
            "ece((N, 1) logits): binary, on sigmoid(z)",
            lambda: m.ece(Z[:, :1], Y * 0),
            reference=lambda: _binned_gaps(s1, np.zeros(len(Y)), _bins(s1, 15), 15)[1].sum() / len(Y),
        )
    )
    add(Case("rank / shape", "metrics", "ece(2-D target)", lambda: m.ece(Z, Y[:, None]), ("target",)))
    add(Case("rank / shape", "metrics", "ragged list preds", lambda: m.ece([[0.1, 0.2], [0.3]], [0, 1]), ("preds",)))

    add(Case("dtype", "metrics", "ece(int preds)", lambda: m.ece(Z.astype(np.int64), Y), ("preds",)))
    add(
        Case(
            "dtype",
            "metrics",
            "ece(float labels holding whole numbers)",
            lambda: m.ece(Z, Y.astype(np.float32)),
            reference=lambda: ref_ece(P, Y),
        )
    )
    add(Case("dtype", "metrics", "ece(float labels 0.5 off)", lambda: m.ece(Z, Y + 0.5), ("target",)))
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


def _fit_unchecked(calibrator, z, y):
    """``calibrator`` fitted without the held-out check (its own tests'): SMART and PTS would cross-fit five times more."""
    from hf_calibration.calibrators import held_out_checked

    with held_out_checked():
        return calibrator.fit(z, y, progress_bar=False)


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
            bad = malformed(row, defect)
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

    bad = malformed(4500, "row x 1.02")
    for kind in list_calibrators("multiclass"):
        kw = {"smart": {"max_steps": 100}, "pts": {"max_iter": 50}}.get(kind, {})
        fitted = shared(lambda kind=kind, kw=kw: _fit_unchecked(create_calibrator(kind, **kw), Z5[:600], Y5[:600]))
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind}.predict_proba(probabilities, row 4500 x 1.02)",
                lambda fitted=fitted: fitted().predict_proba(bad),
                ("logits", "row 4500 is not"),
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind}(probabilities then logits)",
                lambda fitted=fitted: fitted()(MIXED["probabilities then logits"]),
                ("logits", "row 100 is not"),
            )
        )
        add(
            Case(
                "probabilities vs logits",
                "calibrators",
                f"{kind}.fit(probabilities, row 5 x 1.02)",
                lambda kind=kind, kw=kw: create_calibrator(kind, **kw).fit(
                    malformed(5, "row x 1.02"), Y5, progress_bar=False
                ),
                ("logits", "row 5 is not"),
            )
        )

    def evaluate_two_batches(name, first, second):
        import evaluate

        from hf_calibration.hub import metric_path

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


def accumulator_cases(tmp: Path) -> list[Case]:
    """Items 8, 12 (a failed first batch) and 13 (accelerate's even_batches): the accumulator."""
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
        ("malformed probabilities", (malformed(5, "row x 1.02")[:, :4], Y5)),
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
            lambda: as_rank(1, lambda: warns_user(lambda: CalibrationAccumulator().update(Z[:49], Y[:49]).n)),
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
    # accelerate's even_batches across two real processes (torchrun): tests/metrics/test_accumulator.py runs the same worker
    return cases


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


@pytest.mark.parametrize(
    "case", case_params(metric_cases, new_surface_cases, detection_cases, accumulator_cases, diagram_cases)
)
def test_bad_input(case: Case) -> None:
    check(case)
