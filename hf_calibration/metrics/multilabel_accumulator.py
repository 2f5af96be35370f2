"""The streaming state of a binary or multi-label head for ``CalibrationAccumulator`` (``task="binary"`` / ``"multilabel"``,
or read from the first batch's shapes).

Per label, the per-bin count and sums of the probability, the label and the hits at 0.5 (``3 * L * B + L * B``
numbers) give ECE, MCE, RMSCE, O-/U-ECE and accuracy, per label and pooled (the pooled bins are the sum of the labels'
bins, since a bin is a range of probabilities); two sums per label give Brier and NLL. AdaECE, smCE and smECE need
every (probability, label) pair, kept as the multi-class accumulator keeps its pairs (float32 by default); with
``ci`` the pairs are kept in float64 with each element's NLL term, and the intervals are the batch function's
(:func:`hf_calibration.metrics.multilabel._intervals`) on them. ``compute()`` equals
:func:`hf_calibration.metrics.calibration_report` on the concatenated batches up to the order of float64 additions.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from hf_calibration.metrics.binning import _uniform_bin_index
from hf_calibration.metrics.multilabel import (
    SigmoidCalibrationReport,
    SigmoidInputs,
    _binned_from_sums,
    _intervals,
    _values,
    prepare_sigmoid,
)
from hf_calibration.metrics.table import list_metrics

SUM_METRICS = ("accuracy", "ece", "mce", "rmsce", "o_ece", "u_ece", "brier", "nll")  # from the sums; the rest: pairs


@contextlib.contextmanager
def kind_as_before(recorded: bool, rule: str):
    """A later batch that is not probabilities while the first ``recorded`` batch was (read by ``rule``): the
    accumulator's error, saying so, in place of the reader's."""
    try:
        yield
    except ValueError as err:
        if not (recorded and "(from_logits=False)" in str(err)):
            raise
        detail = str(err).split(", but ", 1)[-1].rstrip(".")
        raise ValueError(
            f"Expected `preds` to hold probabilities like the earlier batches, but it holds logits or other scores "
            f"({detail}): the first batch was read as probabilities ({rule}), and the accumulator reads every batch "
            "the same way. Pass `from_logits=True` or `False` to the accumulator if that is wrong."
        ) from None


class SigmoidState:
    """Sums (and pairs where needed) of a sigmoid head's batches; see the module docstring."""

    def __init__(self, task: str, n_bins: int, metrics: tuple[str, ...], confidence_dtype, boot, smooth_boot):
        self.task, self.n_bins = task, n_bins
        self.metrics = tuple(m for m in list_metrics(head=task, report=True) if m in metrics or m in ("rmsce",))
        self.boot, self.smooth_boot = boot, smooth_boot
        self.dtype = np.float64 if boot is not None else confidence_dtype
        self.with_pairs = boot is not None or any(m not in SUM_METRICS for m in self.metrics)
        self.num_labels: int | None = None
        self.from_logits: bool | None = None
        self.n = 0
        self.sums: np.ndarray | None = None  # (4, L, B): count, sum p, sum y, sum hits
        self.scores: np.ndarray | None = None  # (3, L): Brier sum, NLL sum, kept count
        self.pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []

    # ------------------------------------------------------------------ batches
    def update(self, preds: Any, target: Any, from_logits: bool | None, ignore_index: int | None) -> None:
        recorded = from_logits is None and self.from_logits is not None  # the kind the first batch was read as
        with kind_as_before(recorded, "every value in [0, 1]"):
            inputs = prepare_sigmoid(
                preds,
                target,
                task=self.task,
                from_logits=from_logits if from_logits is not None else self.from_logits,
                ignore_index=ignore_index,
            )
        if self.num_labels is not None and inputs.num_labels != self.num_labels:
            raise ValueError(
                f"Expected `preds` to have L = {self.num_labels} labels as before, but got {inputs.num_labels}."
            )
        if self.from_logits is not None and inputs.from_logits != self.from_logits:
            raise ValueError(
                "Expected `preds` to hold " + ("logits" if self.from_logits else "probabilities") + " like the earlier "
                "batches; pass `from_logits=True` or `False` to the accumulator if the detection is wrong."
            )
        self._allocate(inputs.num_labels)
        self.from_logits = inputs.from_logits
        self._add(inputs)

    def _allocate(self, num_labels: int) -> None:
        if self.sums is None:
            self.num_labels = num_labels
            self.sums = np.zeros((4, num_labels, self.n_bins))
            self.scores = np.zeros((3, num_labels))

    def _add(self, inputs: SigmoidInputs) -> None:
        p, y, mask = inputs.probs, inputs.target, inputs.mask
        index = _uniform_bin_index(p, self.n_bins)
        flat = (np.arange(p.shape[1]) * self.n_bins + index)[mask]
        size = p.shape[1] * self.n_bins
        hits = ((p > 0.5) == (y > 0.5)).astype(np.float64)
        for row, weights in enumerate((None, p[mask], y[mask], hits[mask])):
            self.sums[row] += np.bincount(flat, weights=weights, minlength=size).reshape(p.shape[1], self.n_bins)
        nll = np.where(mask, -np.where(y > 0.5, inputs.log_p, inputs.log_q), 0.0)
        self.scores[0] += np.where(mask, (p - y) ** 2, 0.0).sum(axis=0)
        self.scores[1] += nll.sum(axis=0)
        self.scores[2] += mask.sum(axis=0)
        self.n += p.shape[0]
        if self.with_pairs:
            self.pairs.append(
                (p.astype(self.dtype), y.astype(np.uint8), mask.copy(), nll if self.boot is not None else None)
            )

    def merge(self, other: SigmoidState) -> None:
        if other.sums is None:
            return
        if self.num_labels is not None and other.num_labels != self.num_labels:
            raise ValueError(
                f"Expected argument `other` to have L = {self.num_labels} labels, but got {other.num_labels}."
            )
        self._allocate(other.num_labels)
        self.sums += other.sums
        self.scores += other.scores
        self.n += other.n
        self.pairs += list(other.pairs)
        self.from_logits = self.from_logits if self.from_logits is not None else other.from_logits

    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Every kept pair: (p, y, mask, nll terms or None), concatenated."""
        if not self.pairs:
            empty = np.zeros((0, self.num_labels or 0))
            return empty.astype(self.dtype), empty.astype(np.uint8), empty.astype(bool), None
        if len(self.pairs) > 1:
            nll = None if self.pairs[0][3] is None else np.concatenate([q[3] for q in self.pairs])
            self.pairs = [tuple(np.concatenate([q[i] for q in self.pairs]) for i in range(3)) + (nll,)]
        return self.pairs[0]

    # ------------------------------------------------------------------ result
    def _binned(self, name: str, count, p_sum, y_sum, hit_sum) -> np.ndarray:
        total = count.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            gap = (p_sum - y_sum) / total[..., None]
            return {
                "ece": lambda: _binned_from_sums(count, p_sum, y_sum, "l1"),
                "mce": lambda: _binned_from_sums(count, p_sum, y_sum, "max"),
                "rmsce": lambda: _binned_from_sums(count, p_sum, y_sum, "l2"),
                "o_ece": lambda: np.clip(gap, 0, None).sum(axis=-1),
                "u_ece": lambda: np.clip(-gap, 0, None).sum(axis=-1),
                "accuracy": lambda: hit_sum.sum(axis=-1) / total,
            }[name]()

    def compute(self, label_names=None) -> SigmoidCalibrationReport:
        import warnings

        if self.n == 0 or self.sums is None or self.scores[2].sum() == 0:
            raise ValueError("Expected at least one label other than ignore_index, but the accumulator is empty.")
        macro, micro, per_label = {}, {}, {}
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a label never kept: NaN, left out of the macro mean
            for name in self.metrics:
                if name in ("brier", "nll"):
                    row = 0 if name == "brier" else 1
                    per = self.scores[row] / self.scores[2]
                    pooled = self.scores[row].sum() / self.scores[2].sum()
                elif name not in SUM_METRICS:
                    continue
                else:
                    per = self._binned(name, *self.sums)
                    pooled = float(self._binned(name, *self.sums.sum(axis=1)))
                per_label[name], macro[name], micro[name] = (
                    np.asarray(per, dtype=np.float64),
                    float(np.nanmean(per)),
                    float(pooled),
                )
        notes: list[str] = []
        if self.with_pairs:
            inputs = self._inputs()
            for name in self.metrics:
                if name not in SUM_METRICS:
                    per_label[name], macro[name], micro[name] = _values(inputs, name, self.n_bins)
            if self.boot is not None:
                found = _intervals(inputs, self.metrics, self.n_bins, self.boot, self.smooth_boot)
                for name, (labels, mac, mic) in found.items():
                    per_label[name], macro[name], micro[name] = labels, mac, mic
                missing = [name for name in self.metrics if name not in found]
                if missing:
                    notes.append(f"{', '.join(missing)}: no interval (some labels are ignored for some samples)")
        order = [m for m in self.metrics if m in macro]
        return SigmoidCalibrationReport(
            self.task,
            self.n,
            self.num_labels,
            {k: macro[k] for k in order},
            {k: micro[k] for k in order},
            {k: per_label[k] for k in order},
            self.n_bins,
            self.from_logits,
            None if label_names is None else tuple(label_names),
            tuple(notes),
        )

    def _inputs(self) -> SigmoidInputs:
        p, y, mask, nll = self.packed()
        p = p.astype(np.float64)
        if nll is None:
            with np.errstate(divide="ignore"):
                log_p, log_q = np.log(p), np.log1p(-p)
        else:  # the exact NLL terms: only the one of each element's label is read
            log_p = log_q = -nll
        return SigmoidInputs(
            p, log_p, log_q, y.astype(np.float64), mask.astype(bool), self.task, bool(self.from_logits)
        )

    # ------------------------------------------------------------------ processes and persistence
    def sync(self, distributed) -> None:
        headers = distributed.all_gather_object((self.num_labels, self.from_logits))
        labels = {h[0] for h in headers if h[0] is not None}
        if len(labels) > 1:
            raise ValueError(f"Expected every process to see the same number of labels, but got {sorted(labels)}.")
        if labels:
            self._allocate(labels.pop())
        packed = np.concatenate([self.sums.reshape(-1), self.scores.reshape(-1), [float(self.n)]])
        total = distributed.all_reduce_sum(torch.from_numpy(packed)).numpy()
        size = self.sums.size
        self.sums = total[:size].reshape(self.sums.shape).copy()
        self.scores = total[size : size + self.scores.size].reshape(self.scores.shape).copy()
        self.n = int(round(total[-1]))
        self.from_logits = next((h[1] for h in headers if h[1] is not None), None)
        if self.with_pairs:
            p, y, mask, nll = self.packed()
            gathered = [
                distributed.all_gather_rows(torch.from_numpy(np.ascontiguousarray(a))).numpy()
                for a in (p, y, mask.astype(np.uint8))
            ]
            nll = None if nll is None else distributed.all_gather_rows(torch.from_numpy(nll)).numpy()
            self.pairs = [(gathered[0], gathered[1], gathered[2].astype(bool), nll)]

    def state_dict(self) -> dict[str, torch.Tensor]:
        p, y, mask, nll = self.packed() if self.num_labels is not None else (np.zeros((0, 0)),) * 3 + (None,)
        out = {
            "task": torch.tensor(1 if self.task == "multilabel" else 0),
            "n": torch.tensor(self.n),
            "from_logits": torch.tensor(-1 if self.from_logits is None else int(self.from_logits)),
            "sums": torch.from_numpy(self.sums.copy() if self.sums is not None else np.zeros((4, 0, self.n_bins))),
            "scores": torch.from_numpy(self.scores.copy() if self.scores is not None else np.zeros((3, 0))),
            "probs": torch.from_numpy(np.ascontiguousarray(p)),
            "labels": torch.from_numpy(np.ascontiguousarray(y).astype(np.uint8)),
            "mask": torch.from_numpy(np.ascontiguousarray(mask).astype(bool)),
        }
        if nll is not None:
            out["nll_terms"] = torch.from_numpy(np.ascontiguousarray(nll))
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        sums = state["sums"].numpy().astype(np.float64)
        if sums.shape[0] != 4 or sums.shape[2] != self.n_bins:
            raise ValueError(f"Expected state `sums` of shape (4, L, {self.n_bins}), but got {tuple(sums.shape)}.")
        self.num_labels = sums.shape[1] or None
        self.sums = sums.copy() if self.num_labels else None
        self.scores = state["scores"].numpy().astype(np.float64).copy() if self.num_labels else None
        self.n = int(state["n"])
        self.from_logits = None if int(state["from_logits"]) < 0 else bool(int(state["from_logits"]))
        self.pairs = []
        if self.with_pairs and self.n:
            nll = state["nll_terms"].numpy().copy() if "nll_terms" in state else None
            self.pairs = [
                (
                    state["probs"].numpy().astype(self.dtype).copy(),
                    state["labels"].numpy().copy(),
                    state["mask"].numpy().astype(bool).copy(),
                    nll,
                )
            ]
