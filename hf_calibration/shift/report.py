"""``shift_report``: does a calibrator fitted on clean data keep its advantage under corruption and on OOD inputs?

The functional core takes logits: the clean calibration set (to fit the calibrators), the clean test set,
the test set under each (corruption, severity), and optionally OOD logits. Every calibrator is fitted once,
on the clean calibration logits only, then applied to every shifted set: the setting of SMART's ImageNet-C
rows (Guo et al. 2026, Table 1) and of Ovadia et al. (2019, "Can you trust your model's uncertainty?").
The model route (a model and a dataset in, logits out, corruptions applied on the fly and cached) is a thin
adapter over this function.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hf_calibration._core.checks import check_choice, check_classification_shapes, looks_like_probabilities, to_numpy
from hf_calibration.metrics.table import get_metric, list_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "ece", "adaece", "smce", "nll")  # the report's columns; labels and units: the metric table
_OOD_PERCENT = {"auroc", "aupr_in", "aupr_out", "fpr95"}
UNCALIBRATED = "uncalibrated"
CLEAN = "clean"
_ALIASES = {"ts": "temperature_scaling", "temperature": "temperature_scaling"}


def _pair(value: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"Expected `{name}` to be a (logits, labels) pair, but got {type(value).__name__}.")
    logits, labels = to_numpy(value[0], f"{name}[0]"), to_numpy(value[1], f"{name}[1]")
    check_classification_shapes(logits, labels, f"{name} logits", f"{name} labels")
    if looks_like_probabilities(logits):
        raise ValueError(
            f"Expected `{name}` to hold logits, but its rows are probability vectors: calibrators and the energy score need logits."
        )
    return logits, labels


def _calibrator_specs(calibrators: Sequence[Any] | Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``[(row label, registered kind or Calibrator)]``, checked without fitting anything (so a model route can
    refuse a bad list before it spends any time on logits). A mapping gives the labels; otherwise a name is its
    own label and a Calibrator is labelled by its kind."""
    from hf_calibration.calibrators import Calibrator, list_calibrators

    items = list(calibrators.items()) if isinstance(calibrators, Mapping) else [(None, item) for item in calibrators]
    specs: list[tuple[str, Any]] = []
    for label, item in items:
        if label is not None and not isinstance(label, str):
            raise TypeError(f"Expected the keys of `calibrators` to be row labels (str), but got {label!r}.")
        if isinstance(item, str):
            kind = _ALIASES.get(item.lower(), item.lower())
            if kind not in list_calibrators():
                raise ValueError(
                    f"Expected each of `calibrators` to be one of {['ts', *list_calibrators()]} or a Calibrator, but got {item!r}."
                )
            spec, name = kind, item
        elif isinstance(item, Calibrator):
            spec, name = item, getattr(item, "kind", type(item).__name__)
        else:
            raise TypeError(
                f"Expected each of `calibrators` to be a name or a Calibrator, but got {type(item).__name__}."
            )
        name = name if label is None else label
        if name == UNCALIBRATED or name in (n for n, _ in specs):
            raise ValueError(
                f"Expected distinct calibrators, but {name!r} appears twice; "
                "pass a mapping {label: calibrator} to tell them apart."
            )
        specs.append((name, spec))
    return specs


def _fit_calibrators(
    calibrators: Sequence[Any] | Mapping[str, Any], val: tuple[np.ndarray, np.ndarray]
) -> dict[str, Any]:
    from hf_calibration.calibrators import create_calibrator

    fitted: dict[str, Any] = {}
    for name, spec in _calibrator_specs(calibrators):
        if isinstance(spec, str):
            fitted[name] = create_calibrator(spec).fit(*val, progress_bar=False)
        else:
            fitted[name] = spec if spec.is_fitted else spec.fit(*val, progress_bar=False)
    return fitted


def _apply(calibrator: Any, logits: np.ndarray) -> np.ndarray:
    import torch

    if calibrator is None:
        return logits
    with torch.no_grad():
        return calibrator(torch.from_numpy(np.ascontiguousarray(logits))).numpy()


def _keeps_logit_level(calibrator) -> bool:
    """Whether the energy and max-logit scores mean anything on ``calibrator``'s outputs.

    They read each row's logit level, which a temperature keeps (``(z + c) / T``). The other maps see
    ``z - max z`` or ``log p`` (the level is gone) or return log-probabilities (logsumexp = 0 for every input):
    scored on their outputs, both would rank inputs by something other than the model's evidence (CTS's
    energy AUROC came out at 2.6 % on CIFAR-10 against 98.7 % uncalibrated).
    """
    from hf_calibration.calibrators import TemperatureCalibrator

    return calibrator is None or isinstance(calibrator, TemperatureCalibrator)


CHECK_POINTS = 0.05  # |mean confidence - ATC's accuracy estimate| beyond which the label-free check flags a set


def _atc_threshold(calibrator: Any, val: tuple[np.ndarray, np.ndarray]) -> float:
    """ATC's threshold (Garg et al., ICLR 2022) of ``calibrator``'s confidences on the labelled calibration set."""
    from hf_calibration.calibrators.adaptation import atc_threshold

    recorded = None if calibrator is None else (calibrator.fit_info_ or {}).get("atc_threshold")
    if recorded is not None:
        return float(recorded)
    z = _apply(calibrator, val[0])
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return atc_threshold((p / p.sum(axis=1, keepdims=True)).max(axis=1), z.argmax(axis=1) == val[1])


def _label_free_check(calibrated: np.ndarray, threshold: float) -> dict[str, Any]:
    """Without labels: the mean calibrated confidence, ATC's estimate of the accuracy (the share of confidences above
    the calibration set's threshold) and whether they differ by more than ``CHECK_POINTS``: a calibrator whose mean
    confidence is far from the estimated accuracy on a deployment set is likely wrong there."""
    p = np.exp(calibrated - calibrated.max(axis=1, keepdims=True))
    confidence = (p / p.sum(axis=1, keepdims=True)).max(axis=1)
    estimate = float(np.mean(confidence > threshold))
    gap = float(confidence.mean()) - estimate
    return {
        "confidence": float(confidence.mean()),
        "estimated_accuracy": estimate,
        "check_flags": abs(gap) > CHECK_POINTS,
    }


def _metrics(logits: np.ndarray, labels: np.ndarray, n_bins: int) -> dict[str, float]:
    from hf_calibration.metrics import calibration_report

    report = calibration_report(logits, labels, n_bins, from_logits=True)
    return {key: float(report[key]) for key in METRICS}


@dataclass
class ShiftReport:
    """Calibration by method × corruption × severity (``rows``; ``corruption="clean"``, ``severity=0`` for the
    clean test set) and OOD detection by method × OOD set × score (``ood``). Values are fractions (NLL in nats).
    The energy and max-logit scores read each row's logit level, which only a temperature keeps: for the other
    calibrators (log-probability outputs, maps of ``z - max z`` or of ``log p``) their OOD values are None ("-").

    ``str(report)`` prints the clean table, the mean over corruptions at each severity, and the OOD table;
    ``report.table(full=True)`` adds every corruption × severity row; ``report.plot()`` draws a metric against
    severity, one line per method.
    """

    rows: list[dict[str, Any]]
    ood: list[dict[str, Any]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    n_bins: int = 15

    def severity_means(self, metric: str = "ece") -> dict[str, list[float]]:
        """``{method: [clean, mean over corruptions at severity 1, ..., 5]}`` (only severities present)."""
        check_choice(metric, "metric", METRICS)
        out: dict[str, list[float]] = {}
        for method in self.methods:
            values = []
            for severity in self.severities:
                cell = [r[metric] for r in self.rows if r["method"] == method and r["severity"] == severity]
                values.append(float(np.mean(cell)))
            out[method] = values
        return out

    @property
    def severities(self) -> list[int]:
        return sorted({r["severity"] for r in self.rows})

    @property
    def corruptions(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.rows:
            if r["corruption"] != CLEAN:
                seen.setdefault(r["corruption"], None)
        return list(seen)

    def table(self, full: bool = False) -> str:
        """The report as text, percentages with two decimals (NLL as a number), one block per metric set."""
        lines = [f"Calibration under shift ({self.n_bins} bins; calibrators fitted on clean data; % except NLL)", ""]
        header = ["method", "corruption", "severity", *METRICS]
        body = []
        for r in self.rows:
            if full or r["corruption"] == CLEAN:
                body.append([r["method"], r["corruption"], str(r["severity"]), *(_fmt(m, r[m]) for m in METRICS)])
        for severity in self.severities[1:] if self.severities and self.severities[0] == 0 else self.severities:
            for method in self.methods:
                cells = [r for r in self.rows if r["method"] == method and r["severity"] == severity]
                if cells:
                    body.append(
                        [
                            method,
                            f"mean of {len(cells)}",
                            str(severity),
                            *(_fmt(m, np.mean([c[m] for c in cells])) for m in METRICS),
                        ]
                    )
        lines += _grid(header, body)
        if self.rows and "check_flags" in self.rows[0]:
            lines += ["", "Label-free check (no labels used: mean confidence against ATC's accuracy estimate; the true "
                      "accuracy beside it): sets flagged, where the method is likely wrong"]  # fmt: skip
            body = []
            for method in self.methods:
                for severity in self.severities:
                    cells = [r for r in self.rows if r["method"] == method and r["severity"] == severity]
                    body.append([method, str(severity), f"{sum(c['check_flags'] for c in cells)} of {len(cells)}",
                                 *(_fmt("accuracy", np.mean([c[k] for c in cells])) for k in ("confidence", "estimated_accuracy", "accuracy"))])  # fmt: skip
            lines += _grid(["method", "severity", "flagged", "confidence", "est. accuracy", "accuracy"], body)
        if self.ood:
            lines += ["", "OOD detection (in-distribution = clean test set, positive; %)"]
            keys = ["auroc", "aupr_in", "aupr_out", "fpr95"]
            body = [[o["method"], o["ood"], o["score"], *(_fmt(k, o[k]) for k in keys)] for o in self.ood]
            lines += _grid(["method", "ood set", "score", *keys], body)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        return {"n_bins": self.n_bins, "methods": list(self.methods), "rows": list(self.rows), "ood": list(self.ood)}

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def plot(self, metric: str = "ece") -> Figure:
        """``metric`` (mean over corruptions) against severity, 0 = clean, one line per method (matplotlib)."""
        from matplotlib.figure import Figure

        means = self.severity_means(metric)
        fig = Figure(figsize=(4.8, 3.6), layout="constrained")
        ax = fig.add_subplot()
        scale = 100 if _percent(metric) else 1
        for method, values in means.items():
            ax.plot(self.severities, [scale * v for v in values], marker="o", label=method)
        label = get_metric(metric).label
        ax.set(
            xlabel="severity (0 = clean)",
            ylabel=label + (" (%)" if scale == 100 else ""),
            xticks=self.severities,
            title=f"{label}, mean of {len(self.corruptions)} corruptions",
        )
        ax.legend(fontsize="small")
        return fig


def _percent(metric: str) -> bool:
    return metric in _OOD_PERCENT or (metric in list_metrics() and get_metric(metric).percent)


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}" if _percent(metric) else f"{value:.4f}"


def _grid(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]

    def fmt(row):
        return "  ".join(c.ljust(w) if not c[:1].isdigit() else c.rjust(w) for c, w in zip(map(str, row), widths))

    return [fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1)), *(fmt(r) for r in body)]


def shift_report(
    val: tuple[Any, Any],
    test: tuple[Any, Any],
    shifted: Mapping[tuple[str, int], tuple[Any, Any]],
    *,
    calibrators: Sequence[Any] | Mapping[str, Any] = ("ts", "smart"),
    ood_logits: Any = None,
    ood_scores: Sequence[str] = ("msp", "energy"),
    n_bins: int = 15,
) -> ShiftReport:
    """Accuracy, ECE, AdaECE, smCE and NLL of the uncalibrated model and of each calibrator (fitted on
    ``val`` only), on the clean test set and on every shifted set; OOD AUROC / AUPR / FPR95 when
    ``ood_logits`` is given.

    Args:
        val: ``(logits, labels)`` of the clean calibration set; each calibrator is fitted on it once.
        test: ``(logits, labels)`` of the clean test set (also the in-distribution side of the OOD table).
        shifted: ``{(corruption, severity): (logits, labels)}``, e.g. the test set under each corruption.
        calibrators: registered names (``"ts"``, ``"smart"``, ...; see ``list_calibrators()``) or ``Calibrator``
            instances (fitted ones are used as they are), each row labelled by its name or kind; or a mapping
            ``{label: name or Calibrator}`` (e.g. a saved SMART beside a freshly fitted one).
        ood_logits: ``(N_ood, K)`` logits on out-of-distribution inputs, a mapping ``{name: logits}`` of several
            OOD sets, or None.
        ood_scores: scores of :func:`hf_calibration.metrics.ood_metrics` for the OOD table.
        n_bins: bins of ECE / AdaECE.

    Inputs are logits (calibrators act on logits). Returns a :class:`ShiftReport`.
    """
    from hf_calibration.metrics import ood_metrics

    val, test = _pair(val, "val"), _pair(test, "test")
    if not isinstance(shifted, Mapping):
        raise TypeError(
            f"Expected `shifted` to be a mapping {{(corruption, severity): (logits, labels)}}, but got {type(shifted).__name__}."
        )
    sets = {(CLEAN, 0): test}
    for key, value in shifted.items():
        if not (
            isinstance(key, tuple)
            and len(key) == 2
            and isinstance(key[0], str)
            and isinstance(key[1], (int, np.integer))
        ):
            raise TypeError(f"Expected the keys of `shifted` to be (corruption, severity) pairs, but got {key!r}.")
        sets[(key[0], int(key[1]))] = _pair(value, f"shifted[{key!r}]")
    k = val[0].shape[1]
    for key, (z, _) in sets.items():
        if z.shape[1] != k:
            raise ValueError(f"Expected every set to have K = {k} classes (as `val`), but {key} has {z.shape[1]}.")
    if ood_logits is None:
        ood_sets = {}
    elif isinstance(ood_logits, Mapping):
        ood_sets = {str(name): to_numpy(z, f"ood_logits[{name!r}]") for name, z in ood_logits.items()}
    else:
        ood_sets = {"ood": to_numpy(ood_logits, "ood_logits")}
    for name, z in ood_sets.items():
        if z.ndim != 2 or z.shape[1] != k:
            raise ValueError(f"Expected `ood_logits` ({name}) to have shape (N, {k}), but got {tuple(z.shape)}.")
        if looks_like_probabilities(z):  # scored as logits they would be softmax-ed twice: a wrong AUROC, not an error
            raise ValueError(
                f"Expected `ood_logits` ({name}) to hold logits, but its rows are probability vectors: the OOD "
                "scores are computed on the logits (and on each calibrator's outputs), as for `test`."
            )
    for score in ood_scores:
        check_choice(score, "ood_scores", ("msp", "max_logit", "energy"))

    methods = {UNCALIBRATED: None, **_fit_calibrators(calibrators, val)}
    rows, ood = [], []
    for method, calibrator in methods.items():
        threshold = _atc_threshold(calibrator, val)
        for (corruption, severity), (z, y) in sets.items():  # clean first, then in the order given
            calibrated = _apply(calibrator, z)
            rows.append(
                {
                    "method": method,
                    "corruption": corruption,
                    "severity": severity,
                    **_metrics(calibrated, y, n_bins),
                    **_label_free_check(calibrated, threshold),
                }
            )
        z_in = _apply(calibrator, test[0]) if ood_sets else None
        logit_level = _keeps_logit_level(calibrator)
        for name, z in ood_sets.items():
            z_out = _apply(calibrator, z)
            for score in ood_scores:
                if score in ("energy", "max_logit") and not logit_level:
                    values = dict.fromkeys(("auroc", "aupr_in", "aupr_out", "fpr95"))
                else:
                    values = ood_metrics(z_in, z_out, score, from_logits=True)
                ood.append({"method": method, "ood": name, "score": score, **values})
        logger.info("shift_report: %s done", method)
    return ShiftReport(rows=rows, ood=ood, methods=list(methods), n_bins=n_bins)
