"""Streaming calibration metrics: ``CalibrationAccumulator`` takes batches, merges, syncs across processes.

The whole :func:`~hf_calibration.metrics.calibration_report` without holding the (N, K) logits:

* ECE, MCE, O-/U-ECE and accuracy (Guo et al. 2017, eqs. 3 and 5; FeDLaS Table 4) need only the
  per-bin count and sums of top-label confidence and correctness: ``3·B`` numbers.
* Classwise ECE needs the signed per-(class, bin) sums ``sum_i [p_ik in bin b] (p_ik - [y_i = k])``:
  ``K·B`` numbers. Brier (``sum_k (p_ik - [y_i = k])^2``) and NLL (``-log p_iy``) are two sums.
* AdaECE (equal-count bins over the sorted confidences), smCE (an LP over them) and smECE (a kernel
  bandwidth fixed point) depend on every ``(confidence, correctness)`` pair, so those pairs are kept:
  5 bytes a sample (float32 + uint8) by default, 9 with ``confidence_dtype="float64"``.

Every sum is the one the batch functions form, computed from the same float64 confidences and
probabilities, so ``compute()`` equals ``calibration_report`` on the concatenated batches up to the
order of float64 additions (1e-12 in the tests). The exception, stated precisely: with float32 pairs
(the default) AdaECE, smCE and smECE are those of the float32-rounded confidences — equal to 1e-12 to
the batch functions applied to ``confidence.astype(float32)``. Rounding moves each confidence by at most
2^-25 (about 3e-8): smCE moves by at most twice that (for each 1-Lipschitz witness ``w``, each term
``w(p)(a - p)`` moves by at most ``2|dp|``); AdaECE by as much, plus at most 2/N for each sample that
rounding makes equal to a bin's edge (one within a float32 step of it), which then changes bin; smECE
by about as much, unless rounding flips one of the ten comparisons of its bandwidth bisection, which
moves the bandwidth by one bisection step. (Measured on the tests' data: all three within 1e-9.)
``confidence_dtype="float64"`` removes the exception, and is the default with ``ci``: the intervals are then
the functions' and the report's own, bit for bit (from float32 pairs they moved by ~1e-8 relative).

Numpy arrays and CPU tensors go through the batch functions' own float64 helpers plus one compiled pass
over the rows (classwise sums, Brier, NLL). CUDA (any non-CPU) tensors are reduced on their device in
float64 — per row, only the confidence and the correctness leave it, with the K·B classwise sums and two
scalars; float32 logits there take a float32 exp, as the CPU path does, so the confidences agree with
the CPU's to float32 precision (~1e-7), float64 logits to 1e-15.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

import numba
import numpy as np
import torch

from hf_calibration._core.checks import (
    IGNORE_INDEX,
    PROBABILITY_DETECTION_TOLERANCE,
    check_choice,
    check_classification_shapes,
    check_labels_in_range,
    resolve_from_logits,
    to_numpy,
)
from hf_calibration._core.inputs import whole_labels
from hf_calibration.metrics._binned import _ece_compute, _ece_split_compute, _mce_compute
from hf_calibration.metrics._format import prepare, top_label
from hf_calibration.metrics.binning import (
    BinSums,
    _bin_means,
    _bin_sums,
    _calibration_gaps,
    _check_n_bins,
    _uniform_bin_index,
    uniform_bin,
    uniform_edges,
)
from hf_calibration.metrics.bootstrap import (
    SMOOTH_N_BOOT,
    check_bootstrap,
    flat_intervals,
)
from hf_calibration.metrics.ece import _classwise_ece_compute
from hf_calibration.metrics.multilabel_accumulator import kind_as_before
from hf_calibration.metrics.report import CalibrationReport, _report, top_label_intervals
from hf_calibration.metrics.scores import _row_scores
from hf_calibration.metrics.table import get_metric, list_metrics

__all__ = ["CalibrationAccumulator", "METRICS"]


def _streamed(state: str) -> tuple[str, ...]:
    """The report's metrics an accumulator keeps as ``state`` (the metric table's ``state`` column): ``"bins"``, the
    3·B top-label sums give them all (always computed); ``"probabilities"``, the streamed probability rows;
    ``"pairs"``, every (confidence, correct) pair."""
    return list_metrics(head="multiclass", report=True, state=state)


def _all_metrics() -> tuple[str, ...]:
    return _streamed("bins") + _streamed("probabilities") + _streamed("pairs")


METRICS = _all_metrics()  # the package's own; metrics registered later are accepted too
_PAIR_DTYPES = {"float32": np.float32, "float64": np.float64}


class _Rows(NamedTuple):
    """What one batch contributes, after ignored rows are dropped."""

    confidence: np.ndarray  # (n,) float64
    correct: np.ndarray  # (n,) float64 in {0, 1}
    classwise: np.ndarray | None  # (K, B) signed sums, or None when not needed
    brier: float
    nll: float
    scores: np.ndarray | None = None  # (n, 2) each row's Brier and NLL terms, kept for bootstrap intervals


@numba.njit(cache=True, nogil=True)
def _probability_sums(preds, target, from_logits, edges, classwise):  # pragma: no cover - compiled
    """One pass over validated rows: add the signed classwise sums into ``classwise`` (K, B); return (Brier sum, NLL sum).

    Per row, in float64: ``p = softmax(z)`` (or the probabilities themselves), bin ``b`` of each ``p_k`` with
    ``edges[b] < p <= edges[b + 1]`` (0 → first bin), ``classwise[k, b] += p_k``, ``classwise[y, b(p_y)] -= 1``,
    Brier ``sum_k p_k^2 - 2 p_y + 1`` and NLL ``-(z_y - max z - log sum_k exp(z_k - max z))``.
    """
    n, k = preds.shape
    p = np.empty(k)
    brier = 0.0
    nll = 0.0
    for i in range(n):
        y = target[i]
        if from_logits:
            top = np.float64(preds[i, 0])
            for j in range(1, k):
                v = np.float64(preds[i, j])
                if v > top:
                    top = v
            s = 0.0
            for j in range(k):
                e = np.exp(np.float64(preds[i, j]) - top)
                p[j] = e
                s += e
            for j in range(k):
                p[j] = p[j] / s
            nll -= np.float64(preds[i, y]) - top - np.log(s)
        else:
            for j in range(k):
                p[j] = np.float64(preds[i, j])
            nll -= np.log(p[y])
        squares = 0.0
        for j in range(k):
            q = p[j]
            squares += q * q
            b = uniform_bin(q, edges)
            classwise[j, b] += q
            if j == y:
                classwise[j, b] -= 1.0
        brier += squares - 2.0 * p[y] + 1.0
    return brier, nll


def _rows_numpy(
    preds,
    target,
    from_logits: bool | None,
    ignore_index,
    n_bins: int,
    with_probabilities: bool,
    with_scores: bool = False,
) -> tuple[_Rows, bool]:
    """The batch functions' own path: ``prepare`` + ``top_label`` (same float64 confidences), then the compiled pass.
    Returns the rows and what ``from_logits`` resolved to on the kept rows."""
    inputs = prepare(preds, target, from_logits=from_logits, ignore_index=ignore_index)
    top = top_label(inputs)
    classwise, brier, nll = None, 0.0, 0.0
    if with_probabilities:
        classwise = np.zeros((inputs.preds.shape[1], n_bins))
        preds = inputs.preds  # the compiled pass reads native float32 / float64 (float16 → float32 is exact)
        work = np.float64 if preds.dtype.itemsize >= 8 else np.float32
        brier, nll = _probability_sums(
            np.ascontiguousarray(preds, dtype=work), inputs.target, inputs.from_logits, uniform_edges(n_bins), classwise
        )
    scores = _row_scores(inputs) if with_scores else None
    return _Rows(top.confidence, top.correct, classwise, brier, nll, scores), inputs.from_logits


def _rows_torch(
    preds: torch.Tensor,
    target,
    from_logits: bool | None,
    ignore_index,
    n_bins: int,
    with_probabilities: bool,
    with_scores: bool = False,
) -> tuple[_Rows, bool]:
    """The same quantities reduced on ``preds.device``; only per-row values and the K·B sums leave it."""
    target = torch.as_tensor(target, device=preds.device)
    check_classification_shapes(preds, target, "preds", "target")
    check_labels_in_range(target, preds.shape[1], "target", ignore_index)
    if ignore_index is not None:
        keep = target != ignore_index
        if not bool(keep.all()):
            preds, target = preds[keep], target[keep]
    preds = preds.detach()
    if not bool(torch.isfinite(preds).all()):
        raise ValueError("Expected `preds` to be finite, but it contains NaN or inf.")
    from_logits = resolve_from_logits(preds, from_logits, "preds")  # on the kept rows, as the batch functions
    n, k = preds.shape
    rows = torch.arange(n, device=preds.device)
    target = target.long()
    z64 = preds.double()
    if from_logits:
        work = z64 if preds.dtype == torch.float64 else preds.float()  # as top_label: float32 exp below float64
        top, prediction = work.max(dim=1)
        confidence = 1.0 / torch.exp(work - top[:, None]).sum(dim=1, dtype=torch.float64)
        shifted = z64 - z64.max(dim=1, keepdim=True).values
        e = torch.exp(shifted)
        s = e.sum(dim=1, keepdim=True)
        probs, log_py = e / s, (shifted - torch.log(s))[rows, target]
    else:
        probs = z64
        if bool((probs < 0).any() | (probs > 1).any()):
            raise ValueError(
                "Expected `preds` to hold probabilities in [0, 1] (from_logits=False), but found values outside."
            )
        if float((probs.sum(dim=1) - 1).abs().max()) > PROBABILITY_DETECTION_TOLERANCE:
            raise ValueError(
                f"Expected each row of `preds` to sum to 1 within {PROBABILITY_DETECTION_TOLERANCE:g} (from_logits=False), but some rows do not."
            )
        confidence, prediction = probs.max(dim=1)
        log_py = torch.log(probs[rows, target])
    correct = (prediction == target).double()
    classwise, brier, nll, scores = None, 0.0, 0.0, None
    if with_scores:
        p_true = probs[rows, target]
        scores = torch.stack([(probs * probs).sum(dim=1) - 2.0 * p_true + 1.0, -log_py], dim=1).cpu().numpy()
    if with_probabilities:
        interior = torch.from_numpy(uniform_edges(n_bins)[1:-1]).to(preds.device)
        index = torch.bucketize(
            probs, interior, right=False
        )  # edges[b] < p <= edges[b + 1], as searchsorted(side="left")
        flat = (torch.arange(k, device=preds.device) * n_bins + index).reshape(-1)
        sums = torch.bincount(flat, weights=probs.reshape(-1), minlength=k * n_bins)
        sums -= torch.bincount(target * n_bins + index[rows, target], minlength=k * n_bins).double()
        classwise = sums.reshape(k, n_bins).cpu().numpy()
        p_true = probs[rows, target]
        brier = float((probs * probs).sum() - 2.0 * p_true.sum() + n)
        nll = float(-log_py.sum())
    return _Rows(confidence.cpu().numpy(), correct.cpu().numpy(), classwise, brier, nll, scores), from_logits


def _on_device(preds: Any) -> bool:
    return isinstance(preds, torch.Tensor) and preds.device.type != "cpu"


class CalibrationAccumulator:
    """Calibration metrics over batches: ``update(logits, labels)`` per batch, ``compute()`` at the end.

    ``compute()`` returns the same :class:`~hf_calibration.metrics.CalibrationReport` as
    ``calibration_report`` on all batches at once (see the module docstring for the one precision
    caveat), while holding only ``O(n_bins · K)`` numbers plus, for AdaECE / smCE / smECE, one
    ``(confidence, correct)`` pair per sample — never the logits.

    Args:
        n_bins: equal-width bins (and AdaECE's equal-count bins), as the batch functions.
        from_logits: ``None`` detects probabilities (rows in [0, 1] summing to 1) on the first batch
            and holds later batches to the same answer; ``True`` / ``False`` force it.
        ignore_index: labels equal to it are skipped (Trainer pads with -100).
        metrics: the report's metrics to compute (default all of :data:`METRICS`); accuracy, ECE, MCE,
            O-ECE and U-ECE are always computed. Leaving out ``adaece``, ``smce`` and ``smece`` keeps no
            per-sample state at all (memory independent of N); leaving out ``classwise_ece``, ``brier``
            and ``nll`` skips the full-probability pass. Metrics left out are None in the report.
        confidence_dtype: ``"float32"`` (5 bytes a sample) or ``"float64"`` (9 bytes, exact); None (default):
            float32, and float64 with ``ci`` (its intervals are then the functions' own, bit for bit).
        task: ``"multiclass"``, ``"binary"`` or ``"multilabel"``; None (default) reads it from the first batch's shapes
            (:func:`hf_calibration._core.tasks.resolve_task`: ``(n, L)`` 0/1 targets are multi-label, one score column
            binary). A sigmoid head's batches are accumulated per label (:mod:`hf_calibration.metrics.multilabel_accumulator`)
            and ``compute()`` gives a ``SigmoidCalibrationReport``; in a Trainer the macro values are logged under the
            metric's name and the pooled ones as ``<metric>_micro``.
        ci, n_boot, seed: bootstrap intervals, as :func:`~hf_calibration.metrics.calibration_report` (the same
            interval per metric, from the same resamples, bit for bit; ECE, MCE, O-/U-ECE and accuracy are then
            computed from the kept rows, as the functions compute them):
            ``compute()`` then gives :class:`~hf_calibration.metrics.MetricInterval` values and a Trainer gets
            ``<metric>_ci_low`` / ``<metric>_ci_high`` too. The accumulator then keeps every
            ``(confidence, correct)`` pair and, with Brier / NLL, each row's two terms (16 more bytes a
            sample). Classwise ECE keeps no interval: it would need each row's K probabilities, the very
            thing the accumulator exists not to hold.

    Three ways to use it::

        acc = CalibrationAccumulator()
        for batch in loader:                          # 1. any loop, any number of batches
            acc.update(model(**batch).logits, batch["labels"])
        acc.sync()                                    # 2. several processes: everyone now holds the total
        report = acc.compute()                        #    (in a single process sync() does nothing)

        Trainer(..., compute_metrics=CalibrationAccumulator(),   # 3. the Trainer: batch by batch, reset after
                args=TrainingArguments(..., batch_eval_metrics=True))

    (Inside the Trainer do not call ``sync()``: the Trainer already gathers every process's predictions.)
    """

    def __init__(
        self,
        n_bins: int = 15,
        *,
        from_logits: bool | None = None,
        ignore_index: int | None = IGNORE_INDEX,
        metrics: Iterable[str] | None = None,
        confidence_dtype: str | None = None,
        ci: float | None = None,
        n_boot: int | None = None,
        seed: int = 0,
        task: str | None = None,
    ):
        self.n_bins = _check_n_bins(n_bins)
        if task is not None:
            from hf_calibration._core.tasks import check_task

            check_task(task)
        self.task = task
        if from_logits is not None and not isinstance(from_logits, bool):
            raise TypeError(
                f"Expected argument `from_logits` to be None (detect), True or False, but got {from_logits!r}."
            )
        self.from_logits = from_logits
        if ignore_index is not None and (
            isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer))
        ):
            raise TypeError(f"Expected argument `ignore_index` to be an integer or None, but got {ignore_index!r}.")
        self.ignore_index = ignore_index
        known = _all_metrics()
        if metrics is None:
            chosen = set(known)
        else:
            if isinstance(metrics, str):
                raise TypeError(
                    f"Expected argument `metrics` to be a list of metric names, but got the string {metrics!r}."
                )
            chosen = set(metrics)
            unknown = sorted(chosen - set(known))
            if unknown:
                raise ValueError(f"Expected argument `metrics` to hold names from {list(known)}, but got {unknown}.")
        self.metrics = tuple(m for m in known if m in chosen | set(_streamed("bins")))
        if confidence_dtype is None:  # with ci, float64 pairs: the functions' own confidences, so their intervals
            confidence_dtype = "float32" if ci is None else "float64"
        self.confidence_dtype = check_choice(confidence_dtype, "confidence_dtype", _PAIR_DTYPES)
        self._with_probabilities = bool(set(_streamed("probabilities")) & set(self.metrics))
        self._boot = check_bootstrap(ci, n_boot, seed)
        self._smooth_boot = check_bootstrap(ci, n_boot, seed, default_n_boot=SMOOTH_N_BOOT)
        self._pair_metrics = tuple(m for m in _streamed("pairs") if m in self.metrics)
        self._with_pairs = bool(self._pair_metrics) or self._boot is not None
        self._with_scores = self._boot is not None and bool({"brier", "nll"} & set(self.metrics))
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> CalibrationAccumulator:
        """Forget every sample (the settings stay)."""
        self.num_classes: int | None = None
        self.from_logits_: bool | None = None  # what from_logits resolved to on the first batch
        self.n = 0
        self._count = np.zeros(self.n_bins, dtype=np.int64)
        self._confidence_sum = np.zeros(self.n_bins)
        self._accuracy_sum = np.zeros(self.n_bins)
        self._classwise: np.ndarray | None = None  # (K, B) once K is known
        self._brier = 0.0
        self._nll = 0.0
        self._confidence: list[np.ndarray] = []
        self._correct: list[np.ndarray] = []
        self._scores: list[np.ndarray] = []  # (n, 2) Brier / NLL terms per row, with ci
        self._local: dict[str, Any] | None = None  # this process's own state while a synced total is held
        self._sigmoid = None  # a binary / multi-label head's state (metrics.multilabel_accumulator), once seen
        return self

    def _sigmoid_for(self, preds: Any, target: Any):
        """The sigmoid state when this batch (or ``task``) is a binary / multi-label head's, else None."""
        from hf_calibration._core.inputs import read_task
        from hf_calibration._core.tasks import resolve_task

        if self._sigmoid is not None:
            return self._sigmoid
        if self.n:  # the head type was read with the first batch (multi-class): later ones are checked against it
            task = resolve_task(self.task, preds=preds, target=target)
        else:
            task = read_task(self.task, preds, target, ignore_index=self.ignore_index, from_logits=self.from_logits)
        if task == "multiclass":
            return None
        if self.n:
            raise ValueError(f"Expected a multi-class batch like the earlier ones, but this one is a {task} head's.")
        from hf_calibration.metrics.multilabel_accumulator import SigmoidState

        self._sigmoid = SigmoidState(
            task, self.n_bins, self.metrics, _PAIR_DTYPES[self.confidence_dtype], self._boot, self._smooth_boot
        )
        return self._sigmoid

    def _snapshot(self) -> dict[str, Any]:
        return {
            "num_classes": self.num_classes,
            "from_logits_": self.from_logits_,
            "n": self.n,
            "_count": self._count.copy(),
            "_confidence_sum": self._confidence_sum.copy(),
            "_accuracy_sum": self._accuracy_sum.copy(),
            "_classwise": None if self._classwise is None else self._classwise.copy(),
            "_brier": self._brier,
            "_nll": self._nll,
            "_confidence": list(self._confidence),
            "_correct": list(self._correct),
            "_scores": list(self._scores),
        }

    def _unsync(self) -> None:
        """Back to this process's own samples before adding more (a later sync() then counts them once)."""
        if self._local is not None:
            local, self._local = self._local, None
            self.__dict__.update(local)

    def _settle(self, num_classes: int, from_logits: bool | None, what: str, *, check_only: bool = False) -> None:
        """Fix K and the resolved from_logits on first sight; later batches / states must agree (checked before any
        change). ``check_only``: check, fix nothing (a batch that may still fail)."""
        if self.num_classes is not None and num_classes != self.num_classes:
            raise ValueError(
                f"Expected {what} to have K = {self.num_classes} classes as before, but got K = {num_classes}."
            )
        if from_logits is not None and self.from_logits_ is not None and from_logits != self.from_logits_:
            seen, now = ("logits" if x else "probabilities" for x in (self.from_logits_, from_logits))
            raise ValueError(
                f"Expected {what} to hold {seen} like the earlier batches, but it holds {now}; "
                "pass `from_logits=True` or `False` to the accumulator if the detection is wrong."
            )
        if check_only:
            return
        if self.num_classes is None:
            self.num_classes = num_classes
            if self._with_probabilities:
                self._classwise = np.zeros((num_classes, self.n_bins))
        if self.from_logits_ is None:
            self.from_logits_ = from_logits

    def _add(self, rows: _Rows) -> None:
        index = _uniform_bin_index(rows.confidence, self.n_bins)
        sums = _bin_sums(index, rows.confidence, rows.correct, self.n_bins)
        pairs = (
            ([rows.confidence.astype(_PAIR_DTYPES[self.confidence_dtype])], [rows.correct.astype(np.uint8)])
            if self._with_pairs
            else ([], [])
        )
        self._accumulate(
            sums,
            rows.classwise,
            rows.brier,
            rows.nll,
            rows.confidence.shape[0],
            *pairs,
            [rows.scores] if self._with_scores else [],
        )

    def _accumulate(
        self,
        sums: BinSums,
        classwise,
        brier: float,
        nll: float,
        n: int,
        confidence: list,
        correct: list,
        scores: list | None = None,
    ) -> None:
        """Add sums (of a batch, or of another accumulator) and pair arrays to the state."""
        self._count += sums.count
        self._confidence_sum += sums.confidence
        self._accuracy_sum += sums.accuracy
        if self._classwise is not None and classwise is not None:
            self._classwise += classwise
        self._brier += brier
        self._nll += nll
        self.n += n
        self._confidence += confidence
        self._correct += correct
        self._scores += scores or []
        if len(self._confidence) >= 1024:  # keep the lists short: one array per 1024 batches
            self._confidence, self._correct = [np.concatenate(self._confidence)], [np.concatenate(self._correct)]
            self._scores = [np.concatenate(self._scores)] if self._scores else []

    # ------------------------------------------------------------------ API
    def update(self, preds: Any, target: Any) -> CalibrationAccumulator:
        """Add a batch: ``preds`` ``(n, K)`` logits or probabilities (torch on any device, or numpy), ``target`` ``(n,)``.

        Rows whose label is ``ignore_index`` are skipped; a batch with no other rows (or no rows) adds nothing. In an
        ``accelerate`` loop with ``even_batches=True`` (its default), the samples a process's last batch repeats to
        even out the processes are dropped, as ``Accelerator.gather_for_metrics`` drops them
        (:func:`hf_calibration._core.distributed.even_batches_padding`); where they cannot be located a warning says so once.
        """
        return self._update(preds, target, loader_batch=True)

    def _update(self, preds: Any, target: Any, *, loader_batch: bool) -> CalibrationAccumulator:
        """``update``; ``loader_batch``: the batch is this process's own from a DataLoader (not the Trainer's gathered
        predictions, which accelerate has already trimmed)."""
        self._unsync()
        if loader_batch:
            preds, target = self._drop_even_batches_padding(preds, target)
        if _on_device(preds):
            target = (
                torch.as_tensor(target, device=preds.device)
                if isinstance(target, torch.Tensor)
                else torch.as_tensor(to_numpy(target, "target"), device=preds.device)
            )
        else:
            preds, target = to_numpy(preds, "preds"), to_numpy(target, "target")
        sigmoid = self._sigmoid_for(preds, target)
        if sigmoid is None and not isinstance(target, torch.Tensor):
            target = whole_labels(target, "target")  # class indices stored as floats: 2.0 is class 2, 1.7 is refused
        elif sigmoid is None and target.is_floating_point():
            target = torch.as_tensor(whole_labels(target, "target"), device=target.device)
        if sigmoid is not None:
            if preds.shape[0]:
                sigmoid.update(
                    preds if not _on_device(preds) else preds.detach().cpu(),
                    target if not isinstance(target, torch.Tensor) else target.cpu(),
                    self.from_logits,
                    self.ignore_index,
                )
                self.n, self.num_classes, self.from_logits_ = sigmoid.n, sigmoid.num_labels, sigmoid.from_logits
            return self
        if preds.ndim == 2 and target.ndim == 1 and preds.shape[0] == target.shape[0] == 0:
            return self
        check_classification_shapes(preds, target, "preds", "target")
        self._settle(preds.shape[1], None, "`preds`", check_only=True)  # K first: a changed K would read as bad labels
        if self.ignore_index is not None and bool((target == self.ignore_index).all()):
            self._settle(preds.shape[1], None, "`preds`")  # a valid batch with nothing to count (Trainer padding)
            return self
        compute_rows = _rows_torch if _on_device(preds) else _rows_numpy
        # the kind is read once: an explicit from_logits, else what the first batch was (a row alone reads as in a batch)
        recorded = self.from_logits is None and self.from_logits_ is not None
        kind = self.from_logits if self.from_logits is not None else self.from_logits_
        with kind_as_before(recorded, "every row in [0, 1] summing to 1"):
            rows, from_logits = compute_rows(
                preds, target, kind, self.ignore_index, self.n_bins, self._with_probabilities, self._with_scores
            )
        self._settle(preds.shape[1], from_logits, "`preds`")
        self._add(rows)
        return self

    def _drop_even_batches_padding(self, preds: Any, target: Any) -> tuple[Any, Any]:
        from hf_calibration._core import distributed

        n = getattr(preds, "shape", (0,))[0] if getattr(preds, "ndim", 0) else 0
        if not n:
            return preds, target
        padding = distributed.even_batches_padding(n)
        if padding is None:
            if not self.__dict__.get("_warned_padding"):
                self._warned_padding = True
                warnings.warn(
                    "CalibrationAccumulator.update under accelerate with even_batches=True: the last batch may repeat "
                    "samples to even out the processes, and this one cannot be matched to the DataLoader's batches "
                    f"(n = {n}), so any repeated sample is counted twice. Prepare the DataLoader with "
                    "DataLoaderConfiguration(even_batches=False), or update with each batch as the loader gives it.",
                    UserWarning,
                    stacklevel=3,
                )
            return preds, target
        if padding:
            keep = n - padding
            return preds[:keep], target[:keep]
        return preds, target

    def merge(self, other: CalibrationAccumulator) -> CalibrationAccumulator:
        """Add ``other``'s samples to this accumulator (same settings required); ``other`` is unchanged."""
        if not isinstance(other, CalibrationAccumulator):
            raise TypeError(
                f"Expected argument `other` to be a CalibrationAccumulator, but got {type(other).__name__}."
            )
        for name in ("n_bins", "metrics", "confidence_dtype", "ignore_index"):
            if getattr(other, name) != getattr(self, name):
                raise ValueError(
                    f"Expected argument `other` to have {name} = {getattr(self, name)!r}, but got {getattr(other, name)!r}."
                )
        if other._boot != self._boot:  # the constructor's ci / n_boot / seed, by their public names

            def asked(boot):
                return (
                    "no interval (ci=None)"
                    if boot is None
                    else f"ci={boot.level!r}, n_boot={boot.n_boot!r}, seed={boot.seed!r}"
                )

            raise ValueError(
                f"Expected argument `other` to have the same bootstrap settings, {asked(self._boot)}, but got {asked(other._boot)}."
            )
        if self._sigmoid is not None or other._sigmoid is not None:
            if (self.n and self._sigmoid is None) or (other.n and other._sigmoid is None):
                raise ValueError(
                    "Expected argument `other` to hold the same kind of head (binary / multi-label or multi-class)."
                )
            if self._sigmoid is None:
                from hf_calibration.metrics.multilabel_accumulator import SigmoidState

                self._sigmoid = SigmoidState(
                    other._sigmoid.task,
                    self.n_bins,
                    self.metrics,
                    _PAIR_DTYPES[self.confidence_dtype],
                    self._boot,
                    self._smooth_boot,
                )
            if other._sigmoid is not None:
                self._unsync()
                self._sigmoid.merge(other._sigmoid)
                self.n, self.num_classes, self.from_logits_ = (
                    self._sigmoid.n,
                    self._sigmoid.num_labels,
                    self._sigmoid.from_logits,
                )
            return self
        self._unsync()
        if other.num_classes is None:
            return self
        self._settle(other.num_classes, other.from_logits_, "argument `other`")
        sums = BinSums(other._count, other._confidence_sum, other._accuracy_sum)
        self._accumulate(
            sums,
            other._classwise,
            other._brier,
            other._nll,
            other.n,
            list(other._confidence),
            list(other._correct),
            list(other._scores),
        )
        return self

    def sync(self) -> CalibrationAccumulator:
        """Replace this process's state by the total over all processes (``torch.distributed``, as set up by
        ``torchrun`` / ``accelerate launch``); every process must call it. Shards may differ in size, and a
        process may have seen no sample at all. Returns self; in a single process it does nothing.

        A later ``update`` continues from this process's own samples, and every ``sync()`` sums the processes'
        own samples afresh, so each sample is counted once however often it is called.
        """
        from hf_calibration._core import distributed

        if not distributed.is_distributed():
            return self
        conflict = distributed.accelerate_disagrees()  # the same answer on every process: all raise, or none
        if conflict is not None:
            raise RuntimeError(
                f"Cannot sync: {conflict}, so summing them would count samples several times. "
                "Launch so that both agree (on CPUs: Accelerator(cpu=True) under torchrun), or shard yourself."
            )
        self._unsync()  # a repeated sync() starts again from this process's own samples: every process joins every collective
        if self._sigmoid is not None or self.task in ("binary", "multilabel"):
            if self._sigmoid is None:
                from hf_calibration.metrics.multilabel_accumulator import SigmoidState

                self._sigmoid = SigmoidState(
                    self.task,
                    self.n_bins,
                    self.metrics,
                    _PAIR_DTYPES[self.confidence_dtype],
                    self._boot,
                    self._smooth_boot,
                )
            import copy

            local = {
                "_sigmoid": copy.deepcopy(self._sigmoid),
                "n": self.n,
                "num_classes": self.num_classes,
                "from_logits_": self.from_logits_,
            }
            self._sigmoid.sync(distributed)
            self.n, self.num_classes, self.from_logits_ = (
                self._sigmoid.n,
                self._sigmoid.num_labels,
                self._sigmoid.from_logits,
            )
            self._local = local  # a later update / sync() starts again from this process's own samples
            return self
        headers = distributed.all_gather_object((self.num_classes, self.from_logits_))
        local = self._snapshot()
        for num_classes, from_logits in headers:  # every process checks the same list: all raise, or none
            if num_classes is not None:
                self._settle(num_classes, from_logits, "another process's batches")
        k = self.num_classes
        classwise = (
            self._classwise if self._classwise is not None else np.zeros((0, self.n_bins))
        )  # (K, B) on every process, or none
        packed = np.concatenate(
            [
                self._count.astype(np.float64),
                self._confidence_sum,
                self._accuracy_sum,
                classwise.reshape(-1),
                [self._brier, self._nll, float(self.n)],
            ]
        )
        total = distributed.all_reduce_sum(torch.from_numpy(packed)).numpy()
        b = self.n_bins
        self._count = np.rint(total[:b]).astype(np.int64)
        self._confidence_sum, self._accuracy_sum = total[b : 2 * b].copy(), total[2 * b : 3 * b].copy()
        if self._with_probabilities and k is not None:
            self._classwise = total[3 * b : 3 * b + k * b].reshape(k, b).copy()
        self._brier, self._nll, self.n = float(total[-3]), float(total[-2]), int(round(total[-1]))
        if self._with_pairs:
            confidence, correct = self._pairs()
            self._confidence = [distributed.all_gather_rows(torch.from_numpy(confidence)).numpy()]
            self._correct = [distributed.all_gather_rows(torch.from_numpy(correct)).numpy()]
        if self._with_scores:
            self._scores = [distributed.all_gather_rows(torch.from_numpy(self._score_rows())).numpy()]
        self._local = local
        return self

    def _pairs(self) -> tuple[np.ndarray, np.ndarray]:
        dtype = _PAIR_DTYPES[self.confidence_dtype]
        if not self._confidence:
            return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.uint8)
        if len(self._confidence) > 1:
            self._confidence, self._correct = [np.concatenate(self._confidence)], [np.concatenate(self._correct)]
        return self._confidence[0], self._correct[0]

    def _score_rows(self) -> np.ndarray:
        if len(self._scores) != 1:
            self._scores = [np.concatenate(self._scores) if self._scores else np.zeros((0, 2))]
        return self._scores[0]

    def compute(self) -> CalibrationReport:
        """The metrics of every sample added so far (fractions; metrics left out are None). A binary or multi-label
        head's batches give a :class:`~hf_calibration.metrics.SigmoidCalibrationReport` (per label, macro, pooled)."""
        if self._sigmoid is not None:
            return self._sigmoid.compute()
        if self.n == 0:
            raise ValueError(
                "Expected at least one sample with a label other than ignore_index, but the accumulator is empty."
            )
        n, chosen = self.n, set(self.metrics)
        sums = BinSums(self._count, self._confidence_sum, self._accuracy_sum)
        gaps = _calibration_gaps(sums, n)
        conf, acc = _bin_means(sums)
        filled = self._count > 0
        values: dict[str, Any] = {
            "n": n,
            "accuracy": float(self._accuracy_sum.sum() / n),
            "ece": float(np.abs(gaps).sum()),
            "mce": float(np.abs(acc[filled] - conf[filled]).max()),
            "o_ece": float(np.clip(gaps, 0, None).sum()),
            "u_ece": float(np.clip(-gaps, 0, None).sum()),
            "classwise_ece": _classwise_ece_compute(self._classwise, n) if "classwise_ece" in chosen else None,
            "brier": self._brier / n if "brier" in chosen else None,
            "nll": self._nll / n if "nll" in chosen else None,
            **dict.fromkeys(_streamed("pairs")),
        }
        if self._with_pairs:
            confidence, correct = self._pairs()
            confidence, correct = confidence.astype(np.float64), correct.astype(np.float64)
            for name in self._pair_metrics:  # from the kept pairs, by the table's point form
                values[name] = get_metric(name).top_label(confidence, correct, self.n_bins)
            if self._boot is not None:  # the binned values from the rows too: the functions' interval centres
                split = _ece_split_compute(confidence, correct, self.n_bins)
                values.update(
                    accuracy=float(correct.mean()),
                    ece=_ece_compute(confidence, correct, self.n_bins),
                    mce=_mce_compute(confidence, correct, self.n_bins),
                    o_ece=split.over,
                    u_ece=split.under,
                )
                scores = self._score_rows() if self._with_scores else None
                kept = {key: value for key, value in values.items() if key in self.metrics}
                values.update(
                    top_label_intervals(kept, confidence, correct, scores, self.n_bins, self._boot, self._smooth_boot)
                )
        return _report(values.pop("n"), values, self.n_bins, self.from_logits_)

    def __call__(self, eval_pred: Any, compute_result: bool = True) -> dict[str, float] | None:
        """``Trainer(compute_metrics=accumulator)``: add ``eval_pred``; with ``compute_result`` (the Trainer's last
        batch under ``batch_eval_metrics=True``, or its one call otherwise) return the metrics and reset."""
        preds = eval_pred.predictions
        if isinstance(preds, (tuple, list)):  # output_hidden_states & co.: the logits come first
            preds = preds[0]
        self._update(preds, eval_pred.label_ids, loader_batch=False)  # the Trainer gathered and trimmed them already
        if not compute_result:
            return None
        report = self.compute()
        self.reset()
        if not isinstance(
            report, CalibrationReport
        ):  # a sigmoid head: macro values under the metric's name, pooled as _micro
            values = {**report.macro, **{f"{key}_micro": value for key, value in report.micro.items()}}
            return flat_intervals({key: value for key, value in values.items() if value is not None})
        return flat_intervals({key: value for key, value in report.to_dict().items() if value is not None})

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as CPU tensors (``torch.save`` / safetensors ready); ``load_state_dict`` restores it."""
        if self._sigmoid is not None:
            return {f"sigmoid_{key}": value for key, value in self._sigmoid.state_dict().items()}
        confidence, correct = self._pairs()
        k = -1 if self.num_classes is None else self.num_classes
        scores = {"scores": torch.from_numpy(self._score_rows().copy())} if self._with_scores else {}  # with ci only
        return {
            "num_classes": torch.tensor(k, dtype=torch.int64),
            "from_logits": torch.tensor(-1 if self.from_logits_ is None else int(self.from_logits_), dtype=torch.int64),
            "n": torch.tensor(self.n, dtype=torch.int64),
            "count": torch.from_numpy(self._count.copy()),
            "confidence_sum": torch.from_numpy(self._confidence_sum.copy()),
            "accuracy_sum": torch.from_numpy(self._accuracy_sum.copy()),
            "classwise": torch.from_numpy(
                self._classwise.copy() if self._classwise is not None else np.zeros((0, self.n_bins))
            ),
            "brier_sum": torch.tensor(self._brier, dtype=torch.float64),
            "nll_sum": torch.tensor(self._nll, dtype=torch.float64),
            "confidence": torch.from_numpy(confidence.copy()),
            "correct": torch.from_numpy(correct.copy()),
            **scores,
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> CalibrationAccumulator:
        """Restore a :meth:`state_dict` written by an accumulator with the same settings."""
        if isinstance(state, dict) and "sigmoid_sums" in state:
            from hf_calibration.metrics.multilabel_accumulator import SigmoidState

            self.reset()
            task = "multilabel" if int(state["sigmoid_task"]) else "binary"
            self._sigmoid = SigmoidState(
                task, self.n_bins, self.metrics, _PAIR_DTYPES[self.confidence_dtype], self._boot, self._smooth_boot
            )
            self._sigmoid.load_state_dict({key[len("sigmoid_") :]: value for key, value in state.items()})
            self.n, self.num_classes, self.from_logits_ = (
                self._sigmoid.n,
                self._sigmoid.num_labels,
                self._sigmoid.from_logits,
            )
            return self
        expected = set(self.state_dict())
        if not isinstance(state, dict) or set(state) != expected:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"Expected argument `state` to be a CalibrationAccumulator.state_dict() with keys {sorted(expected)}, but got {got}."
            )
        k, n = int(state["num_classes"]), int(state["n"])
        b = self.n_bins
        checks = {
            "count": (b,),
            "confidence_sum": (b,),
            "accuracy_sum": (b,),
            "classwise": (k if (k > 0 and self._with_probabilities) else 0, b),
            "confidence": (n if self._with_pairs else 0,),
            "correct": (n if self._with_pairs else 0,),
            **({"scores": (n, 2)} if self._with_scores else {}),
        }
        for name, shape in checks.items():
            if tuple(state[name].shape) != shape:
                raise ValueError(
                    f"Expected state `{name}` to have shape {shape} for these settings, but got {tuple(state[name].shape)}."
                )
        dtype = _PAIR_DTYPES[self.confidence_dtype]
        if state["confidence"].numpy().dtype != dtype:
            raise ValueError(
                f"Expected state `confidence` to be {np.dtype(dtype)} (confidence_dtype), but got {state['confidence'].dtype}."
            )
        self.reset()
        self.num_classes = None if k < 0 else k
        self.from_logits_ = None if int(state["from_logits"]) < 0 else bool(int(state["from_logits"]))
        self.n = n
        self._count = state["count"].numpy().astype(np.int64).copy()
        self._confidence_sum = state["confidence_sum"].numpy().astype(np.float64).copy()
        self._accuracy_sum = state["accuracy_sum"].numpy().astype(np.float64).copy()
        if self._with_probabilities and k > 0:
            self._classwise = state["classwise"].numpy().astype(np.float64).copy()
        self._brier, self._nll = float(state["brier_sum"]), float(state["nll_sum"])
        if self._with_pairs and n:
            self._confidence = [state["confidence"].numpy().copy()]
            self._correct = [state["correct"].numpy().astype(np.uint8).copy()]
        if self._with_scores and n:
            self._scores = [state["scores"].numpy().astype(np.float64).copy()]
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_bins={self.n_bins}, n={self.n}, num_classes={self.num_classes}, metrics={list(self.metrics)})"
