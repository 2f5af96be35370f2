"""One ``evaluate`` metric for every metric of the table (:mod:`hf_calibration.metrics.table`).

A bundled script (``metric_scripts/<name>/<name>.py``) is :func:`metric_class` with its name; its prose is its card's:
features, arguments, results and the call are read from the table row, and ``_compute`` calls the row's function
(``calibration``: :func:`~hf_calibration.metrics.calibration_report`). The script hands the function what the function
would get from the batches put together: the values exactly (float64 features, no float32 cast) back in the dtype they
were given in (float32 logits stay float32, boolean labels stay boolean), so it returns the function's numbers bit for
bit and refuses what the function refuses, with the function's message; empty predictions are refused at
``add_batch``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import datasets
import evaluate
import numpy as np

from hf_calibration._core.checks import to_numpy
from hf_calibration.hub.metric_scripts import list_metric_scripts, metric_path
from hf_calibration.metrics import calibration_report
from hf_calibration.metrics.bootstrap import flat_intervals
from hf_calibration.metrics.table import HEADS, get_metric, list_metrics

__all__ = ["REPORT", "metric_class"]

REPORT = "calibration"  # the script of the whole report; its keys start with "calibration_"
_SHAPES = {
    "multiclass": ("(N, K) logits or probabilities", "the class index of each example, (N,)"),
    "multilabel": ("(N, L) scores", "(N, L) 0/1 labels"),
    "binary": ("(N,) scores", "(N,) 0/1 labels"),
}
_FEATURES = {  # multi-class (K scores, a class index), multi-label (L scores, L 0/1 labels), binary (one score)
    "multiclass": {
        "predictions": datasets.Sequence(datasets.Value("float64")),
        "references": datasets.Value("float64"),
    },
    "multilabel": {
        "predictions": datasets.Sequence(datasets.Value("float64")),
        "references": datasets.Sequence(datasets.Value("float64")),
    },
    "binary": {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")},
}
_INTERVALS = {
    "basic": "basic (bias-corrected)",
    "basic_plugin": "basic, with the plug-in as its pivot (Kumar et al.'s own bootstrap)",
    "percentile": "percentile",
    "none": "none (NaN ends)",
}


def _spec(name: str) -> dict[str, Any]:
    """What the script of ``name`` needs from the table: function, heads, binned, interval and resamples."""
    if name == REPORT:
        return dict(function=calibration_report, heads=HEADS, binned=True, interval="by metric", n_boot="1,000")
    row = get_metric(name)
    if row.fn is None:
        raise ValueError(f"Expected argument `name` to be a metric with a function of its own, but {name!r} has none.")
    return dict(
        function=row.fn,
        heads=row.heads,
        binned=row.binned,
        interval=_INTERVALS[row.interval.method],
        n_boot=f"{row.n_boot:,}",
    )


def _arguments(name: str, spec: dict[str, Any], extra_args: str) -> str:
    heads = spec["heads"]
    shapes = "; ".join(f"{_SHAPES[h][0]} ({h})" for h in heads)
    labels = "; ".join(f"{_SHAPES[h][1]} ({h})" for h in heads)
    keys = f"{name}_<metric>" if name == REPORT else name
    lines = [
        f"    predictions (`list` or array): {shapes}.",
        f"    references (`list` or array): {labels}; -100 is ignored.",
    ]
    if spec["binned"]:
        lines.append("    n_bins (`int`, defaults to 15): number of confidence bins.")
    lines += [extra_args.rstrip()] if extra_args.strip() else []
    lines += [
        "    from_logits (`bool` or `None`, defaults to `None`): `None` detects probabilities (every value in [0, 1],",
        "        rows summing to 1 within 1e-2), otherwise logits, as torchmetrics does; `True` / `False` win.",
        f"    ci (`float` or `None`, defaults to `None`): a level such as 0.95 adds a bootstrap interval ({keys}_ci_low,",
        f"        {keys}_ci_high), resampling the examples: {spec['interval']}.",
        f"    n_boot (`int` or `None`, defaults to `None`): resamples of that bootstrap (None: {spec['n_boot']}).",
        "    seed (`int`, defaults to 0): seed of the resamples.",
    ]
    if len(heads) > 1:
        lines += [
            '    task (`str` or `None`, defaults to `None`): "multiclass", "binary" or "multilabel" (also the',
            '        configuration name, `evaluate.load(path, "multilabel")`); None reads it from the shapes.',
        ]
    return "\n".join(lines)


def _results(name: str) -> str:
    if name == REPORT:
        keys = ", ".join(f"{REPORT}_{key}" for key in ("n", *list_metrics(head="multiclass", report=True)))
        return (
            f"    {keys}: the values of calibration_report (fractions; Brier and NLL plain numbers). A binary or\n"
            f"    multi-label head gives the macro values and the pooled ones as `{REPORT}_<metric>_micro`.\n"
            "    With `ci`, every metric also has `<key>_ci_low` and `<key>_ci_high`."
        )
    return (
        f"    {name} (`float`): {get_metric(name).label}, a fraction.\n"
        f"    {name}_ci_low, {name}_ci_high (`float`): with `ci`, the ends of the bootstrap interval."
    )


def _dtype(values: Any, name: str) -> np.dtype:
    """The dtype the function would see: numpy's for a scalar (``add``), ``to_numpy``'s for a batch."""
    return np.asarray(values).dtype if np.isscalar(values) else to_numpy(values, name).dtype


class _TableMetric(evaluate.Metric):
    """The script of table metric ``metric_name`` (set by :func:`metric_class`)."""

    metric_name: str = ""
    card: dict[str, Any] = {}

    def _info(self) -> evaluate.MetricInfo:
        heads = _spec(self.metric_name)["heads"]
        features = [datasets.Features(_FEATURES[h]) for h in ("multiclass", "multilabel", "binary") if h in heads]
        return evaluate.MetricInfo(
            description=self.card["description"],
            citation=self.card["citation"],
            inputs_description=self.card["inputs"],
            features=features[0] if len(features) == 1 else features,
            reference_urls=self.card["reference_urls"],
        )

    # the dtypes the batches came in, so that ``_compute`` hands the function what it would get from them
    def _remember(self, predictions: Any, references: Any) -> None:
        dtypes = self.__dict__.setdefault("_dtypes", [])
        dtypes.append((_dtype(predictions, "predictions"), _dtype(references, "references")))

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch of predictions and references (``evaluate.Metric.add_batch``); empty predictions are refused."""
        if predictions is not None and len(predictions) == 0:
            raise ValueError(f"Expected `predictions` to be non-empty (at least one example), but got {predictions!r}.")
        super().add_batch(predictions=predictions, references=references, **kwargs)
        if predictions is not None and references is not None:
            self._remember(predictions, references)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one prediction and its reference (``evaluate.Metric.add``)."""
        super().add(prediction=prediction, reference=reference, **kwargs)
        if prediction is not None and reference is not None:
            self._remember(prediction, reference)

    def _compute(self, predictions, references, **kwargs):
        dtypes = self.__dict__.pop("_dtypes", [])
        preds, target = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
        if dtypes:  # the batches' own dtypes (values came through float64 exactly)
            preds = preds.astype(np.result_type(*(d[0] for d in dtypes)), copy=False)
            target = target.astype(np.result_type(*(d[1] for d in dtypes)), copy=False)
        if len(_spec(self.metric_name)["heads"]) > 1 and kwargs.get("task") is None and self.config_name in HEADS:
            kwargs["task"] = self.config_name  # evaluate.load(path, "multilabel")
        value = _spec(self.metric_name)["function"](preds, target, **kwargs)
        if self.metric_name != REPORT:
            return flat_intervals({self.metric_name: value})
        if hasattr(value, "micro"):  # a binary / multi-label head: macro values, and the pooled ones as <metric>_micro
            value = {**value.macro, **{f"{key}_micro": v for key, v in value.micro.items()}}
        return flat_intervals({f"{REPORT}_{key}": v for key, v in value.items()})


def metric_card_prose(name: str) -> dict[str, str]:
    """The prose of the script of ``name`` from its metric card (``metric_scripts/<name>/README.md``, the one place it is
    written): the Metric Description section, the Examples block (a doctest) and the Citation's BibTeX."""
    if name not in list_metric_scripts():  # a metric of the table with no bundled script (yet): no card
        return dict(description="", examples="", citation="")
    text = (Path(metric_path(name)) / "README.md").read_text(encoding="utf-8")
    sections = dict(part.partition("\n")[::2] for part in re.split(r"^## ", text, flags=re.M)[1:])
    examples = re.search(r"^### Examples\n\n```python\n(.*?)^```", text, re.S | re.M)
    citation = re.search(r"```bibtex\n(.*?)^```", sections.get("Citation", ""), re.S | re.M)
    return dict(
        description=f"{sections['Metric Description'].strip()}\n" if "Metric Description" in sections else "",
        examples="".join(f"    {line}\n" for line in examples.group(1).splitlines()) if examples else "",
        citation=citation.group(1) if citation else "",
    )


def metric_class(
    name: str,
    module: str,
    *,
    extra_args: str = "",
    reference_urls: list[str] | None = None,
    class_name: str | None = None,
) -> type[evaluate.Metric]:
    """The ``evaluate.Metric`` class of table metric ``name`` (or ``"calibration"``: the whole report), defined in the
    script ``module`` (its ``__name__``, so ``evaluate`` and doctest find it there). Its description, example (a
    doctest) and citation are read from the metric card beside the script (a metric without one: its function's
    docstring); ``reference_urls`` complete it and ``extra_args`` documents arguments of its own."""
    spec = _spec(name)
    prose = metric_card_prose(name)
    inputs = f"Args:\n{_arguments(name, spec, extra_args)}\n\nReturns:\n{_results(name)}\n"
    if prose["examples"]:
        inputs += f"\nExamples:\n{prose['examples']}"
    card = dict(
        description=prose["description"] or (spec["function"].__doc__ or "").split("\n\n")[0],
        citation=prose["citation"],
        inputs=inputs,
        reference_urls=list(reference_urls or []),
    )
    attributes = {"metric_name": name, "card": card, "__module__": module, "__doc__": card["description"] + inputs}
    return type(class_name or "".join(part.title() for part in name.split("_")), (_TableMetric,), attributes)
