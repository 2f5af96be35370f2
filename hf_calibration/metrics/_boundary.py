"""The opening every metric function shares, written once: its hyper-parameters checked before any work, the inputs
read once, and a binary or multi-label head handed to its per-label form (:mod:`hf_calibration.metrics.multilabel`).
What a metric accepts (its heads, whether it is binned, its default resamples) is its row of the metric table."""

from __future__ import annotations

from typing import Any, NamedTuple

from hf_calibration._core.checks import IGNORE_INDEX
from hf_calibration.metrics._format import Inputs, prepare, read_metric_inputs
from hf_calibration.metrics.binning import _check_n_bins
from hf_calibration.metrics.bootstrap import Bootstrap, check_bootstrap
from hf_calibration.metrics.multilabel import sigmoid_metric
from hf_calibration.metrics.table import get_metric


class MetricCall(NamedTuple):
    """A metric function's checked call: ``inputs`` (read once), ``n_bins`` (None for an unbinned metric), ``boot``
    (None without ``ci``) and, for a binary or multi-label head, ``head_value``: the result, already computed."""

    inputs: Inputs
    n_bins: int | None
    boot: Bootstrap | None
    head_value: Any = None

    @property
    def done(self) -> bool:
        """A sigmoid head's value is computed: return ``head_value``."""
        return self.inputs.task != "multiclass"


_CALL_ARGUMENTS = ("ci", "n_boot", "seed", "task", "average", "from_logits", "ignore_index")


def metric_call(name: str, preds: Any, target: Any, n_bins: Any, arguments: dict[str, Any]) -> MetricCall:
    """Check and read the call of table metric ``name``: ``n_bins`` (binned metrics), the bootstrap request (the row's
    default resamples), then the inputs: the head type read from them where the metric supports more than the
    multi-class one (``task`` / ``average``), multi-class inputs otherwise. ``arguments``: the function's arguments
    (its ``locals()`` on entry); those of ``ci``, ``n_boot``, ``seed``, ``task``, ``average``, ``from_logits`` and
    ``ignore_index`` it has are read, the others take their usual defaults."""
    kw = {"seed": 0, "average": "macro", "ignore_index": IGNORE_INDEX} | {
        key: arguments[key] for key in _CALL_ARGUMENTS if key in arguments
    }
    row = get_metric(name)
    n_bins = _check_n_bins(n_bins) if row.binned else None
    boot = check_bootstrap(kw.get("ci"), kw.get("n_boot"), kw["seed"], default_n_boot=row.n_boot)
    read = {"from_logits": kw.get("from_logits"), "ignore_index": kw["ignore_index"]}
    if row.heads == ("multiclass",):
        return MetricCall(prepare(preds, target, **read), n_bins, boot)
    inputs = read_metric_inputs(preds, target, task=kw.get("task"), average=kw["average"], **read)
    if inputs.task == "multiclass":
        return MetricCall(inputs, n_bins, boot)
    value = sigmoid_metric(name, inputs, 15 if n_bins is None else n_bins, average=kw["average"], boot=boot)
    return MetricCall(inputs, n_bins, boot, value)
