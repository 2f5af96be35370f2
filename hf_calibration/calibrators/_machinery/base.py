"""The interface every calibrator shares: input handling, the calibrated forward, fitting, Hub persistence.

A calibrator maps (N, K) logits to calibrated logits (or log-probabilities: any row-wise map whose softmax
is the calibrated distribution). Subclasses implement ``_calibrate(z)`` and ``_fit(...)``; everything else
is here. Those that only divide each row by a positive temperature derive from
``TemperatureCalibrator`` (``_scaling.py``) and implement ``_temperature(z)`` instead of ``_calibrate``.
Every entry point takes logits or probabilities (``from_logits=None`` detects them; ``_core/inputs.py``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hf_calibration._core import checkpoints as hub
from hf_calibration._core import tensors as _inputs
from hf_calibration._core.checks import (
    IGNORE_INDEX,
    check_bool,
    check_classification_shapes,
    check_labels_in_range,
    resolve_from_logits,
)
from hf_calibration._core.disk_logits import as_disk_logits
from hf_calibration._core.finite import first_non_finite
from hf_calibration._core.inputs import logits_and_labels, read_multiclass, scores_kind, whole_labels
from hf_calibration._core.persistence import Saved
from hf_calibration._core.rowpass import TopLabel, raise_row_error, top_label, top_label_pass
from hf_calibration._core.tasks import (
    CLASSIFICATION_TASKS,
    IMAGE_TASK,
    SEGMENTATION_TASK,
    check_pipeline_task,
    dense_task_of_folder,
    pipeline_task_of_folder,
)
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration.calibrators import attach as _attach
from hf_calibration.calibrators._machinery.card import CALIBRATOR_CARD_TEMPLATE
from hf_calibration.calibrators._machinery.fitting import held_out as _held_out
from hf_calibration.calibrators._machinery.fitting import rows as _rows
from hf_calibration.calibrators._machinery.fitting.rows import FitRows
from hf_calibration.calibrators._machinery.forward import graph as _graph
from hf_calibration.calibrators.adaptation import atc_threshold
from hf_calibration.calibrators.objectives import get_objective, objective_kwargs

logger = logging.getLogger(__name__)


class NotFittedError(ValueError, RuntimeError):
    """The calibrator was used before ``fit`` (or ``from_pretrained``). A ``ValueError``, as scikit-learn's is (and a
    ``RuntimeError``, as it was)."""


class InsufficientMemoryError(MemoryError, ValueError):
    """A fit refused before it starts: it would need more memory than the machine has (the message says how much)."""


# forward passes over more values than this run a block of rows at a time, into one output: a map's temporaries
# (log-softmax, z - max z, float64 upcasts) stay block-sized, so calibrating 4 GB of logits needs 4 GB more, not 12
FORWARD_BLOCK_ELEMENTS = 1 << 22


class UncalibratedWarning(UserWarning):
    """A fitted calibrator leaves some or all predictions as the model gave them (the identity map); the message and
    ``fit_info_["uncalibrated"]`` say which predicted classes and why."""


# a predicted class is left uncalibrated when the fit moves none of its top-label confidences by more than this many
# units in the last place of the compute dtype (float32: ~8e-6, float64: ~1.4e-14)
IDENTITY_ULPS = 64
SATURATED = 0.999  # fit confidences all at least this: the identity is put down to a (nearly) saturated softmax
# how many fits enclose the current one: a fit inside another (CTS's and SMART's temperature scaling) does not warn
_FIT_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("hf_calibration_fit_depth", default=0)


_labels_of = logits_and_labels  # the name the calibrators use


def _next_up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, float("inf")))


LBFGS_VECTORS = (
    46  # parameter-sized float64 vectors of an LBFGS fit: 20 past steps and 20 gradient changes, and ~6 more
)


def k_squared_memory(num_samples: int, num_classes: int) -> int:
    """Bytes a fit with a full K x K matrix needs: ``LBFGS_VECTORS`` vectors of its K^2 + K float64 parameters, and three
    float64 (N, K) arrays (features, scores, residuals)."""
    parameters = num_classes * num_classes + num_classes
    return 8 * (LBFGS_VECTORS * parameters + 3 * num_samples * num_classes)


def k_squared_reason(num_samples: int, num_classes: int) -> str:
    parameters = num_classes * num_classes + num_classes
    return (
        f"K^2 + K = {parameters:,} float64 parameters, {parameters * 8 / 2**30:.2f} GiB each for the weights, the gradient and "
        f"each of LBFGS's 40 stored steps, plus three N x K float64 arrays"
    )


def _available_memory() -> int:
    """Bytes of memory available to a new allocation now (psutil when installed, else the physical memory)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        import os

        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _shift_card_text(info: dict) -> str:
    """The card's paragraph on shift: how the fit was made to survive it (``fit_for_shift``) and whether the calibrator
    was adapted without labels (``adapt``); empty for a plain fit."""
    parts = []
    recipe = info.get("shift_fit")
    if recipe:
        accuracies = ", ".join(f"{100 * a:.1f} %" for a in recipe.get("accuracies", []))
        strengths = ", ".join(f"{s:g}" for s in recipe.get("strengths", []))
        parts.append(
            f"Fitted to survive shift ({recipe.get('reference', 'Tomani et al., CVPR 2021')}): the {recipe.get('num_images')} "
            f"held-out images perturbed by `{recipe.get('perturbation')}` at {recipe.get('levels')} strengths ({strengths}; "
            f"seed {recipe.get('seed')}), where the model's accuracy was {accuracies}; the calibrator was fitted on all "
            "of them together."
        )
    adaptation = info.get("adaptation")
    if adaptation:
        parts.append(
            f"Adapted without labels ({adaptation.get('method', '').upper()}: {adaptation.get('reference')}) to "
            f"{adaptation.get('num_samples')} unlabeled samples of the deployment data: estimated accuracy "
            f"{100 * adaptation.get('estimated_accuracy', float('nan')):.2f} % against a mean calibrated confidence of "
            f"{100 * adaptation.get('mean_confidence_before', float('nan')):.2f} %, so the calibrated logits are divided by "
            f"T = {adaptation.get('temperature', float('nan')):.4f}. The fit numbers above are the calibrator's before the "
            "adaptation."
        )
    return "\n\n".join(parts)


def _block_classes() -> list[type]:
    from hf_calibration.calibrators._machinery.registry import get_calibrator_class, list_calibrators

    return [c for c in map(get_calibrator_class, list_calibrators()) if c.fits_in_blocks]


def _fit_state(calibrator: Calibrator) -> str:
    """The repr's word on the fit: a calibrator that leaves the model as it is (``is_identity``) says so, not "fitted"."""
    if not calibrator.is_fitted:
        return "not fitted"
    return "identity: the model left as it is" if calibrator.is_identity else "fitted"


class Calibrator(
    Saved,
    library_name="hf_calibration",
    tags=["calibration", "hf_calibration"],  # and the model's pipeline task, per card (generate_model_card)
    model_card_template=CALIBRATOR_CARD_TEMPLATE,
):
    """Base class: ``fit``, ``forward``/``__call__``, ``predict_proba``, ``attach``/``detach``,
    ``save_pretrained``/``from_pretrained``/``push_to_hub``.

    Calibrated logits keep the input's dtype and device; inside, float64 inputs are computed in float64 and
    everything else in float32. A calibrator with ``preserves_argmax = True`` never changes the argmax: where
    rounding would merge the top two calibrated logits, the top one is raised by one ulp. Low-precision (fp16)
    outputs that would overflow are shifted by their row maximum (the softmax is unchanged) and saturated at the
    dtype's finite minimum, so the output is never inf or NaN. Non-finite input logits raise ``ValueError``.

    Inputs may be logits or probabilities: ``fit(from_logits=None)`` takes rows all in [0, 1] and summing to 1 as
    probabilities and works on ``log(p)``, and records which in ``fit_info_["input"]``; ``forward`` and
    ``predict_proba`` read their input as that kind (a row alone as in a batch) unless ``from_logits`` says otherwise.
    Logits and their softmax, each given as what it is, give the same calibrated probabilities.

    Class attributes a subclass sets: ``kind`` (its registry name), ``min_samples``, ``default_objective`` and
    ``objectives`` (the fit objectives it accepts), ``preserves_argmax`` (whether its predictions always equal the
    model's; methods such as vector scaling may move the argmax by design), ``shift_invariant`` (whether its map
    gives the same probabilities for ``z`` and ``z + c`` with a per-row constant ``c``; when False, ``_fit`` and
    ``_calibrate`` receive ``z - max_k z_k``, so that logits and log-probabilities of one prediction are calibrated
    alike) and ``paper_citation`` (the method's paper, as printed in it, for the model card).

    Saving and loading (``save_pretrained``, ``from_pretrained``, ``push_to_hub``, the card) are
    :class:`hf_calibration._core.persistence.Saved`'s: every parameter and buffer goes into ``model.safetensors``. An
    array whose size the fit decides (bin edges, a feature bank) is a buffer registered at any size whose name is
    listed in ``shaped_buffers``: a load gives it the checkpoint's shape. ``_check_state(where)`` refuses loaded
    weights no fit could give.
    """

    min_samples: ClassVar[int] = 2
    default_objective: ClassVar[str] = "nll"
    objectives: ClassVar[tuple[str, ...]] = ("nll",)
    preserves_argmax: ClassVar[bool] = True
    # a strictly increasing, smooth map of the scores; False: binning and isotonic regression, whose flat stretches tie
    # many scores to one value (AutoCalibrator prefers a smooth map on sigmoid heads unless a flat one is clearly better)
    smooth: ClassVar[bool] = True
    shift_invariant: ClassVar[bool] = False
    paper_citation: ClassVar[str] = ""
    # whether ``_fit_rows`` is implemented: the fit reads the logits a block of rows at a time (``_rows.FitRows``), so it
    # needs no (N, K) copy and also fits from disk (``hf_calibration._core.disk_logits``)
    fits_in_blocks: ClassVar[bool] = False
    held_out_check: ClassVar[bool] = (
        False  # cross-fit the fit set after a fit and warn if that is worse (fitting/held_out.py)
    )
    checkpoint_key: ClassVar[str] = "calibrator"
    checkpoint_what: ClassVar[str] = "calibrator"
    save_subfolder: ClassVar[str] = "calibrator"

    def __init__(self) -> None:
        super().__init__()
        self.fit_info_: dict[str, Any] | None = None
        self.history_: list[float] = []
        self.__dict__["_attached_to"] = None

    # ------------------------------------------------------------------ subclass hooks
    def _calibrate(self, z: torch.Tensor) -> torch.Tensor:
        """Calibrated logits for finite logits ``z`` (float32 or float64, any device), same shape and dtype, no grad.

        ``z`` has its row maxima at 0 unless the class is ``shift_invariant``. May return non-finite values only
        where the input rows are non-finite (the caller reports those).
        """
        raise NotImplementedError

    def _fit(self, logits: np.ndarray, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict:
        """Fit on finite float32/float64 logits (row maxima at 0 unless ``shift_invariant``); returns fit_info entries.
        A class that fits in blocks implements ``_fit_rows`` instead, and this reads the array through it."""
        if self.fits_in_blocks:
            return self._fit_rows(_rows.as_rows(logits), labels, objective, kw, progress_bar)
        raise NotImplementedError

    def _fit_rows(self, rows: FitRows, labels: np.ndarray, objective: str, kw: dict, progress_bar: bool) -> dict:
        """``_fit`` on rows read in blocks (``rows.blocks()`` yields them as the map sees them); set
        ``fits_in_blocks = True`` with it."""
        raise NotImplementedError

    def _memory_needed(self, num_samples: int, num_classes: int) -> int | None:
        """Bytes a fit on ``num_samples`` x ``num_classes`` logits needs beyond the logits, where that can exceed a
        machine's memory (methods with K^2 parameters); None: no up-front check."""
        return None

    def _check_memory(self, num_samples: int, num_classes: int) -> None:
        """Refuse, before any work, a fit that needs more memory than is available (``InsufficientMemoryError``)."""
        need = self._memory_needed(num_samples, num_classes)
        if need is None:
            return
        available = _available_memory()
        if need > available:
            raise InsufficientMemoryError(
                f"{type(self).__name__} on N = {num_samples:,} x K = {num_classes:,} logits needs about {need / 2**30:.1f} GiB "
                f"of memory ({self._memory_reason(num_samples, num_classes)}), but {available / 2**30:.1f} GiB are available. "
                "Use a method with O(K) parameters (temperature scaling, vector scaling, SVS, ETS, SMART, or a top-label map)."
            )

    def _memory_reason(self, num_samples: int, num_classes: int) -> str:
        return "its parameters and working arrays"

    def _identity_reason(self, classes: list[int]) -> str | None:
        """Why the fit left the predictions of ``classes`` unchanged (a subclass that knows says so); None: unknown."""
        return None

    def _check_state(self, where: str) -> None:
        """Raise ``ValueError`` when the weights cannot come from a fit (a subclass checks its own; ``where`` names
        the checkpoint in the message). Called on every loaded checkpoint."""

    def _forward_fused(self, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The whole forward (checks, map, argmax guard) in one fused pass, where a subclass has one; None otherwise."""
        return None

    def _calibrate_graph(self, z: torch.Tensor) -> torch.Tensor:
        """``_calibrate`` with tensor operations only (no branch on values, no numpy, no host sync), for
        :meth:`graph_forward`. The default is ``_calibrate`` itself, right for maps that are plain tensor programs."""
        return self._calibrate(z)

    # ------------------------------------------------------------------ state
    @property
    def is_identity(self) -> bool:
        """Whether it leaves every prediction as the model gave it (``fit_info_["uncalibrated"]`` covers all classes):
        ``AutoCalibrator`` or ``calibrate_on_eval`` left the model as it was, or the fit moved nothing."""
        return ((self.fit_info_ or {}).get("uncalibrated") or {}).get("classes") == "all"

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(
                f"This {type(self).__name__} is not fitted yet: call fit(logits, labels) or load one with from_pretrained() first."
            )

    # ------------------------------------------------------------------ inputs
    def _check_logits(self, logits: Any) -> torch.Tensor:
        logits = _inputs.as_tensor(logits, "logits")
        if logits.ndim != 2:
            raise ValueError(
                f"Expected `logits` to have shape (N, K) (rank 2), but got rank {logits.ndim} with shape {tuple(logits.shape)}."
            )
        if not logits.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating tensor, but got {logits.dtype}.")
        if logits.shape[1] < 2:
            raise ValueError(f"Expected `logits` to have K >= 2 classes, but got K = {logits.shape[1]}.")
        expected = (self.fit_info_ or {}).get("num_classes")
        warned = self.__dict__.setdefault("_warned_num_classes", set())
        if isinstance(expected, int) and logits.shape[1] != expected and logits.shape[1] not in warned:
            warned.add(logits.shape[1])  # once per K, not once per call
            logger.warning(
                "Calibrating logits with K = %d classes; the calibrator was fitted on K = %d.",
                logits.shape[1],
                expected,
            )
        return logits

    def _input_kind(self, z: Any, from_logits: bool | None) -> bool:
        """Whether ``z`` holds logits: ``from_logits`` when given, else the kind the fit recorded (``fit_info_["input"]``:
        a row alone reads as the same row in a batch), detected only when there is no fit record."""
        return scores_kind(z, from_logits, recorded=(self.fit_info_ or {}).get("input"), name="logits")

    def _prepare(self, logits: Any, from_logits: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(z, zc)``: the checked input, and what the map sees (log-probabilities for probabilities; row maxima at
        0 unless ``shift_invariant``) in the compute dtype (float64 for float64 input, else float32)."""
        z = self._check_logits(logits)
        cdtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        if self._input_kind(z, from_logits):
            zc = z.to(cdtype)
        else:
            zc = _inputs.log_probabilities(z, cdtype)
        return z, zc if self.shift_invariant else _inputs.canonical(zc)

    def _fit_rows_inputs(self, logits: Any, labels: Any, from_logits: bool | None) -> tuple[FitRows, np.ndarray, bool]:
        """``_fit_inputs`` for a block fit: the same checks, one pass over the rows, and no copy of them."""
        logits, labels = _labels_of(logits, labels)
        source = _rows.as_source(logits)
        y = whole_labels(labels, "labels")  # class indices stored as floats: 2.0 is class 2, 1.7 is refused
        check_classification_shapes(source, y, "logits", "labels")
        check_labels_in_range(y, source.shape[1], "labels", IGNORE_INDEX)
        keep = y != IGNORE_INDEX
        if not keep.any():
            raise ValueError(f"Expected at least one label in `labels` that is not ignore_index={IGNORE_INDEX}.")
        rows = FitRows(source, keep)
        with np.errstate(over="ignore"):
            is_logits = resolve_from_logits(rows, from_logits, "logits")
        if is_logits:
            bad = rows.first_non_finite()
            if bad >= 0:
                raise ValueError(f"Expected `logits` to be finite, but row {bad} contains NaN or inf.")
        else:
            for start, block in rows.raw_blocks():  # in [0, 1], rows summing to 1 (the rule every entry point applies)
                found = top_label_pass(
                    np.ascontiguousarray(block, dtype=rows.compute_dtype), None, False, arrays=False
                )[3]
                if found is not None:
                    raise_row_error(rows, (start + found[0], found[1]), "logits")
        y = np.ascontiguousarray(y[keep] if rows.keep is not None else y, dtype=np.int64)
        self._check_fit_labels(y, source.shape[1])
        return rows.view(log_probabilities=not is_logits, canonical=not self.shift_invariant), y, is_logits

    def _check_fit_labels(self, labels: np.ndarray, num_classes: int) -> None:
        """Warn about the fit labels where a subclass needs to (per-class parameters without samples)."""

    def _fit_inputs(self, logits: Any, labels: Any, from_logits: bool | None) -> tuple[np.ndarray, np.ndarray, bool]:
        """Validated, finite fit inputs as the map sees them (see ``_prepare``), and whether they were logits."""
        logits, labels = _labels_of(logits, labels)
        inputs = read_multiclass(logits, labels, from_logits=from_logits, preds_name="logits", target_name="labels")
        logits, labels, is_logits = inputs.preds, inputs.target, inputs.from_logits
        logits = _inputs.native_array(logits)
        if logits.dtype not in (np.float32, np.float64):
            logits = logits.astype(np.float32)  # fp16 (bf16 is already float32 here): exact
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():
            raise ValueError(
                f"Expected `logits` to be finite, but row {int(np.flatnonzero(bad)[0])} contains NaN or inf."
            )
        z = torch.from_numpy(logits)
        if not is_logits:
            z = _inputs.log_probabilities(z, z.dtype)
        if not self.shift_invariant:
            z = _inputs.canonical(z)
        return np.ascontiguousarray(z.numpy()), np.ascontiguousarray(labels), is_logits

    # ------------------------------------------------------------------ public API
    def fit(
        self,
        logits: Any,
        labels: Any = None,
        *,
        objective: str | None = None,
        from_logits: bool | None = None,
        progress_bar: bool = True,
        **objective_options: Any,
    ) -> Calibrator:
        """Fit on held-out logits (or probabilities) and labels; returns ``self``.

        Args:
            logits: (N, K) logits or probabilities (torch tensor, numpy array), or a transformers
                ``PredictionOutput`` / ``EvalPrediction`` (then ``labels`` may be omitted; tuple predictions: the
                first element).
            labels: (N,) integer class indices; rows labelled -100 are ignored.
            objective: one of ``"nll"``, ``"brier"``, ``"soft_ece"``, ``"charbonnier_soft_ece"``
                (default: the class's ``default_objective``).
            from_logits: ``None`` (default) detects probabilities (every row in [0, 1] summing to 1 within 1e-2),
                which are fitted as ``log(p)``; ``True``/``False`` says which they are. ``fit_info_["input"]``
                records ``"logits"`` or ``"probabilities"``.
            progress_bar: show a tqdm bar when fitting takes longer than a second (see ``hf_calibration._core.progress``
                for the global off switches).
            **objective_options: ``n_bins``, ``sigma``, ``delta`` for the soft-binned objectives.
        """
        objective, kw = self._resolve_objective(objective, objective_options)
        check_bool(progress_bar, "progress_bar")
        logits, labels = _labels_of(logits, labels)
        shape = getattr(logits, "shape", None)
        if shape is not None and len(shape) == 2:
            self._check_memory(int(shape[0]), int(shape[1]))
        if self.fits_in_blocks:
            z, y, is_logits = self._fit_rows_inputs(logits, labels, from_logits)
        else:
            if as_disk_logits(logits) is not None:
                blocks = ", ".join(sorted(c.kind for c in _block_classes()))
                raise TypeError(
                    f"{type(self).__name__} fits on logits in memory only, but `logits` are read from disk "
                    f"({str(as_disk_logits(logits).path)!r}): load them (np.asarray) if they fit, or use a method that "
                    f"fits from disk ({blocks})."
                )
            z, y, is_logits = self._fit_inputs(logits, labels, from_logits)
        return self._fit_checked(z, y, objective, kw, progress_bar, is_logits=is_logits)

    def _fit_checked(
        self,
        z: np.ndarray,
        y: np.ndarray,
        objective: str,
        kw: dict,
        progress_bar: bool,
        *,
        is_logits: bool = True,
        report: bool = True,
        check_size: bool = True,
    ) -> Calibrator:
        """``fit`` on inputs already checked and prepared as ``_fit_inputs`` returns them (finite float32/float64 logits
        with their row maxima at 0, int64 labels). ``report=False`` skips the fit-set report, the identity check and
        the held-out check (cross-validation scores each fit on its held-out fold instead); ``check_size=False``
        allows fewer than ``min_samples`` (the held-out check's fits)."""
        if check_size and z.shape[0] < self.min_samples:
            raise ValueError(
                f"Expected at least {self.min_samples} labelled samples to fit {type(self).__name__}, but got {z.shape[0]}."
            )
        self._check_memory(int(z.shape[0]), int(z.shape[1]))
        was_attached = self._attached_to
        self.fit_info_ = None
        self.__dict__["_warned_num_classes"] = set()
        depth = _FIT_DEPTH.set(_FIT_DEPTH.get() + 1)
        try:
            if hasattr(z, "blocks"):  # FitRows / MappedRows
                info = self._fit_rows(z, y, objective, kw, progress_bar)
            else:
                info = self._fit(z, y, objective, kw, progress_bar)
        except BaseException:
            self.__dict__.pop("_fit_features", None)
            raise
        finally:
            _FIT_DEPTH.reset(depth)
        self.fit_info_ = {
            "task": "multiclass",
            "objective": objective,
            "objective_options": kw,
            "input": "logits" if is_logits else "probabilities",
            "num_samples": int(z.shape[0]),
            "num_classes": int(z.shape[1]),
            **info,
        }
        try:
            if report:
                fit_set, views = self._fit_set_report(z, y)
                self.fit_info_.update(fit_set)
                # ATC's threshold on the calibrated fit set, for a label-free adapt() later (adaptation.py)
                self.fit_info_["atc_threshold"] = atc_threshold(views[1].confidence, views[1].correct)
                unchanged, predicted, saturated = self._unchanged_classes(*views, z.shape[1])
                if unchanged and _FIT_DEPTH.get() == 0:
                    self._warn_uncalibrated(unchanged, predicted, saturated)
                if _FIT_DEPTH.get() == 0 and _held_out.wanted(self, z.shape[0]):
                    self.fit_info_["held_out_check"] = _held_out.run(self, z, y, objective, kw)
        finally:
            self.__dict__.pop("_fit_features", None)  # what a fit kept for its report (SVS's features) ends here
        if was_attached is not None:
            logger.info("Refitted while attached: the model now uses the new fit.")
        return self

    def _warn_uncalibrated(self, classes: list[int], predicted: int, saturated: bool = False) -> None:
        """Record in ``fit_info_["uncalibrated"]`` and warn (``UncalibratedWarning``) that the fit left ``classes``'
        predictions unchanged (all of them when they are the ``predicted`` classes of the fit set); ``saturated``: their
        fit confidences are all at least ``SATURATED``."""
        everything = len(classes) == predicted
        reason = (
            self._identity_reason(classes)
            or (
                f"every one of their fit confidences is {SATURATED} or more (a saturated softmax), and the fitted map moves "
                "none of them beyond float rounding"
                if saturated
                else None
            )
            or (
                "its fitted map leaves their confidences as they were, within rounding (for instance a temperature applied to "
                "logits that are equal in every row, or a model already calibrated on these samples)"
            )
        )
        self.fit_info_["uncalibrated"] = {"classes": "all" if everything else classes, "reason": reason}
        which = (
            "every prediction"
            if everything
            else (
                f"the predictions of {len(classes)} of the {predicted} predicted classes ({', '.join(map(str, classes[:10]))}"
                + (", ..." if len(classes) > 10 else "")
                + ")"
            )
        )
        warnings.warn(
            f"{type(self).__name__} leaves {which} uncalibrated (as the model gave them): {reason}.",
            UncalibratedWarning,
            stacklevel=4,
        )

    def _resolve_objective(
        self, objective: str | None, objective_options: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The objective ``fit`` minimises (None: ``default_objective``) and its checked options. A subclass whose
        method has no objective to choose overrides this (``_piecewise.PiecewiseCalibrator``)."""
        objective = self.default_objective if objective is None else objective
        get_objective(objective)
        if objective not in self.objectives:
            raise ValueError(
                f"Expected argument `objective` to be one of {list(self.objectives)} for {type(self).__name__}, but got {objective!r}."
            )
        unknown = set(objective_options) - {"n_bins", "sigma", "delta"}
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) for fit: {sorted(unknown)}.")
        return objective, objective_kwargs(objective, **objective_options)

    def _fit_set_report(self, z: np.ndarray | FitRows, y: np.ndarray):
        """Accuracy and 15-bin ECE on the fit set before and after (``accuracy_after`` too when the map may move the
        argmax), with the top-label views ``(before, after)`` they came from: one forward pass, a block of rows at a
        time (no (N, K) output), on one thread (a parallel region over a small array stalls on a busy machine)."""
        from hf_calibration.metrics.ece import _ece_compute

        rows = _rows.as_rows(z)
        n = rows.shape[0]
        views = [(np.empty(n), np.empty(n, dtype=np.int64)) for _ in range(2)]
        dtype = np.dtype(np.float32)
        with torch.no_grad(), torch_single_threaded():
            for (start, block), calibrated in zip(_rows.uncentred(rows).blocks(), self._calibrated_blocks(rows)):
                dtype = calibrated.dtype
                for (conf, pred), v in zip(views, (block, calibrated)):
                    c, p, _, _ = top_label_pass(v, None, True)  # finite: checked at the fit's boundary
                    conf[start : start + v.shape[0]], pred[start : start + v.shape[0]] = c, p
        before, after = (TopLabel(conf, (pred == y).astype(np.float64), pred) for conf, pred in views)
        report = {
            "accuracy": float(before.correct.mean()),
            "ece_before": _ece_compute(before.confidence, before.correct, 15),
            "ece_after": _ece_compute(after.confidence, after.correct, 15),
        }
        if not self.preserves_argmax:
            report["accuracy_after"] = float(after.correct.mean())
        return report, (before, after, dtype)

    def _calibrated_blocks(self, rows):
        """The fit set's calibrated logits (numpy), a block at a time in the order of ``rows.blocks()``: the fit-set
        report's forward pass. A subclass that kept its fit's own intermediates may compute them from those."""
        for _, block in rows.blocks():
            yield self(torch.from_numpy(block), from_logits=True).numpy()

    @staticmethod
    def _unchanged_classes(before, after, dtype, num_classes: int) -> tuple[list[int], int, bool]:
        """The predicted classes none of whose fit confidences the map moved beyond ``IDENTITY_ULPS`` (or whose argmax
        it kept), how many classes were predicted at all, and whether the unchanged ones' confidences were all at
        least ``SATURATED``."""
        tolerance = IDENTITY_ULPS * np.finfo(dtype).eps
        moved = (np.abs(after.confidence - before.confidence) > tolerance) | (after.prediction != before.prediction)
        predicted = np.bincount(before.prediction, minlength=num_classes) > 0
        changed = np.bincount(before.prediction, weights=moved, minlength=num_classes) > 0
        unchanged = np.flatnonzero(predicted & ~changed)
        saturated = bool(unchanged.size) and bool(
            (before.confidence[np.isin(before.prediction, unchanged)] >= SATURATED).all()
        )
        return unchanged.tolist(), int(predicted.sum()), saturated

    def forward(self, logits: Any, from_logits: bool | None = None) -> torch.Tensor:
        """Calibrated logits: same shape, dtype and device as the input (same argmax when ``preserves_argmax``).

        ``logits`` may be probabilities (``from_logits=None`` detects them, as in ``fit``): the result is then the
        calibrated logits of ``log(p)``. Large CPU inputs are calibrated a block of rows at a time into the output, so
        the map's temporaries stay small (the result is the same: every map is row by row).
        """
        return self._adapted(self._forward_calibrated(logits, from_logits))

    def _forward_calibrated(self, logits: Any, from_logits: bool | None) -> torch.Tensor:
        """``forward`` before an adaptation (:meth:`adapt`): the map fitted on the calibration set."""
        self._check_fitted()
        z = self._check_logits(logits)
        is_logits = self._input_kind(z, from_logits)
        n, k = z.shape
        if z.device.type != "cpu" or n * k <= FORWARD_BLOCK_ELEMENTS or n < 2:
            return self._forward_rows(z, is_logits)
        zn = z.detach().numpy() if not (z.requires_grad and torch.is_grad_enabled()) else None
        if zn is not None and z.dtype in (torch.float32, torch.float64):
            bad = first_non_finite(np.ascontiguousarray(zn))
            if bad >= 0:
                raise ValueError(f"Expected `logits` to be finite, but row {bad} contains NaN or inf.")
        out = torch.empty(z.shape, dtype=z.dtype)
        step = max(1, FORWARD_BLOCK_ELEMENTS // k)
        for start in range(0, n, step):
            block = out[start : start + step]
            result = self._forward_rows(z[start : start + step], is_logits, out=block)
            if result is not block:  # a fused kernel writes into ``block``; the torch path returns a new tensor
                block.copy_(result)
        return out

    def _forward_rows(self, z: torch.Tensor, is_logits: bool, out: torch.Tensor | None = None) -> torch.Tensor:
        """``forward`` of checked logits ``z`` (``is_logits``: resolved already). ``out``: a contiguous tensor of
        ``z``'s shape and dtype a fused kernel may write into (and return), so no block-sized temporary is made."""
        cdtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        zc = z.to(cdtype) if is_logits else _inputs.log_probabilities(z, cdtype)
        if not self.shift_invariant:
            zc = _inputs.canonical(zc)
        fused = self._forward_fused(zc, out) if z.dtype == cdtype else None
        if fused is not None:
            return fused
        # one cheap reduction (NaN, inf, or a huge total land here), before the map: a map need not carry a NaN
        # through to its output (a binning of the confidence puts it in some bin)
        if not bool(torch.isfinite(zc.sum())):
            bad = ~torch.isfinite(zc).all(dim=1)
            if bool(bad.any()):
                raise ValueError(
                    f"Expected `logits` to be finite, but row {int(bad.nonzero()[0])} contains NaN or inf."
                )
        out = self._calibrate(zc)
        if not bool(torch.isfinite(out.sum())):
            out = out.clamp(
                min=torch.finfo(cdtype).min, max=torch.finfo(cdtype).max
            )  # log(0) = -inf of a top-label map
        if z.dtype != cdtype:
            limit = torch.finfo(z.dtype).max
            big = out.abs().amax(dim=1) > limit
            if bool(big.any()):
                out[big] = (out[big] - out[big].amax(dim=1, keepdim=True)).clamp_min(-limit)
            out = out.to(z.dtype)
        if self.preserves_argmax:
            top = z.argmax(dim=1)
            moved = (out.argmax(dim=1) != top).nonzero()[:, 0]
            if moved.numel():  # rounding merged the top logits: keep the original winner strictly on top
                out[moved, top[moved]] = _next_up(out[moved, top[moved]])
        return out

    def graph_forward(self, logits: torch.Tensor) -> torch.Tensor:
        """``forward`` for a tracer: ``torch.compile`` (no graph break), ``torch.export`` and the ONNX exporter.

        The same calibrated logits (to rounding: the fused CPU kernels and numpy maps of ``forward`` become tensor
        operations) for a floating (N, K) tensor of logits, without ``forward``'s checks, which depend on the values:
        non-finite logits give non-finite outputs instead of a ``ValueError``, and probabilities are not detected
        (the input is taken as logits, which is what a model returns). The argmax guard of ``preserves_argmax`` holds.
        ``attach`` uses it whenever a tracer runs the model (``attach.tracing``)."""
        self._check_fitted()
        cdtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        zc = logits.to(cdtype)
        if not self.shift_invariant:
            zc = _inputs.canonical(zc)
        info = torch.finfo(cdtype)
        out = self._calibrate_graph(zc).clamp(info.min, info.max)  # log(0) = -inf of a top-label map, as forward
        if logits.dtype != cdtype:  # low precision: rows beyond its range shifted by their maximum, then saturated
            limit = torch.finfo(logits.dtype).max
            big = out.abs().amax(dim=1, keepdim=True) > limit
            out = torch.where(big, (out - out.amax(dim=1, keepdim=True)).clamp_min(-limit), out).to(logits.dtype)
        adaptation = (self.fit_info_ or {}).get("adaptation")
        if adaptation:  # the label-free adaptation's temperature (adapt), a constant of the graph
            out = out / float(adaptation["temperature"])
        if self.preserves_argmax:
            top = logits.argmax(dim=1, keepdim=True)
            moved = _graph.one_hot_of(top, logits.shape[1]) & (out.argmax(dim=1, keepdim=True) != top)
            out = torch.where(moved, _graph.next_up(out), out)
        return out

    # ------------------------------------------------------------------ label-free adaptation
    def _adapted(self, out: torch.Tensor) -> torch.Tensor:
        """``out / T_a`` when the calibrator was adapted (:meth:`adapt`); the argmax of ``out`` is kept."""
        adaptation = (self.fit_info_ or {}).get("adaptation")
        if not adaptation:
            return out
        adapted = out / float(adaptation["temperature"])
        if self.preserves_argmax:
            top = out.argmax(dim=1)
            moved = (adapted.argmax(dim=1) != top).nonzero()[:, 0]
            if moved.numel():  # rounding merged the top logits: keep the winner strictly on top
                adapted[moved, top[moved]] = _next_up(adapted[moved, top[moved]])
        return adapted

    def adapt(self, unlabeled_logits: Any, *, from_logits: bool | None = None, source: Any = None) -> Calibrator:
        """A copy adapted, without labels, to logits of the deployment data (ATC, then one temperature).

        The accuracy on ``unlabeled_logits`` is estimated by Average Thresholded Confidence (Garg et al., ICLR 2022,
        eq. 1: the share of calibrated confidences above the threshold that matches the accuracy on the labelled fit
        set); the copy divides its calibrated logits by the temperature whose mean confidence on ``unlabeled_logits``
        equals that estimate (:mod:`hf_calibration.calibrators.adaptation`, which says when this cannot help: label
        shift, or data the model cannot classify). The copy's ``fit_info_["adaptation"]`` (saved in its config and
        named on its card) records the method, the estimate, the temperature and the number of samples; it saves,
        loads, attaches and exports like any calibrator. Adapting an adapted copy starts again from the fitted map.

        At least ``MIN_SAMPLES`` (10) rows are needed (``ValueError``); a temperature that ends at its search range's
        bound (1e-3 or 1e3: the estimate cannot be reached, as when every row is above the threshold or none is) warns.

        Args:
            unlabeled_logits: ``(N, K)`` logits (or probabilities) of deployment inputs, N >= 10; no labels.
            from_logits: their kind; None reads them as the kind the fit recorded.
            source: ``(logits, labels)`` of labelled source data for the threshold, when the fit predates the threshold
                being recorded (``fit_info_["atc_threshold"]``); by default the fit set's.
        """
        import copy

        from hf_calibration.calibrators import adaptation as atc

        self._check_fitted()
        if getattr(self, "_sigmoid_head", False):
            raise ValueError(
                f"{type(self).__name__} calibrates a sigmoid head; adapt() estimates the accuracy of a softmax "
                "head's top label (ATC), which a multi-label or binary head does not have."
            )
        if source is not None:
            logits, labels = (
                logits_and_labels(*source) if isinstance(source, tuple) else logits_and_labels(source, None)
            )
            inputs = read_multiclass(logits, labels, from_logits=from_logits, preds_name="source", target_name="labels")
            with torch.no_grad():
                calibrated = self._forward_calibrated(
                    torch.from_numpy(np.ascontiguousarray(inputs.preds)), inputs.from_logits
                )
            top = top_label(inputs._replace(preds=calibrated.double().numpy(), from_logits=True))
            threshold = atc.atc_threshold(top.confidence, top.correct)
        else:
            threshold = (self.fit_info_ or {}).get("atc_threshold")
            if threshold is None:
                raise ValueError(
                    "Expected argument `source` = (logits, labels) of labelled source data: this calibrator's "
                    "fit did not record the ATC threshold (it was fitted by an earlier version)."
                )
        z = self._check_logits(unlabeled_logits)
        if z.shape[0] < atc.MIN_SAMPLES:
            raise ValueError(
                f"Expected at least {atc.MIN_SAMPLES} rows in `unlabeled_logits` to adapt {type(self).__name__}, but got "
                f"{z.shape[0]}: ATC's accuracy estimate is the share of those rows above a threshold."
            )
        with torch.no_grad():
            calibrated = self._forward_calibrated(z, from_logits).double().cpu()
        confidence = torch.softmax(calibrated, dim=1).amax(dim=1).numpy()
        estimate = atc.estimated_accuracy(confidence, threshold)
        temperature = atc.temperature_for_mean_confidence(calibrated, estimate)
        if atc.temperature_at_bound(temperature):
            warnings.warn(
                f"adapt(): ATC estimated an accuracy of {estimate:.3f} on these {z.shape[0]} rows (their mean calibrated "
                f"confidence: {float(confidence.mean()):.3f}), which no temperature in [1e-3, 1e3] reaches; the temperature "
                f"stopped at its bound, T = {temperature:.4g}, and the adapted confidences are pushed towards "
                f"{'uniform' if temperature > 1 else 'one-hot'}. Adapt on more rows of the deployment data, or keep the "
                "fitted calibrator.",
                UserWarning,
                stacklevel=2,
            )
        adapted = copy.deepcopy(self)
        adapted.__dict__["_attached_to"] = None
        adapted.fit_info_ = {
            **{k: v for k, v in self.fit_info_.items() if k != "adaptation"},
            "adaptation": {
                "method": "atc",
                "reference": atc.ATC_REFERENCE,
                "num_samples": int(z.shape[0]),
                "threshold": float(threshold),
                "estimated_accuracy": estimate,
                "mean_confidence_before": float(confidence.mean()),
                "temperature": float(temperature),
            },
        }
        return adapted

    def predict_proba(self, logits: Any, from_logits: bool | None = None) -> torch.Tensor:
        """Calibrated probabilities (softmax of ``forward``), float32 (float64 for float64 input); ``logits`` may be
        probabilities, as in ``forward``."""
        out = self(logits, from_logits=from_logits)
        return torch.softmax(out.to(torch.float64 if out.dtype == torch.float64 else torch.float32), dim=1)

    def attach(self, model: Any) -> Any:
        """Calibrate ``model``'s logits with a forward hook, so its pipelines' scores are calibrated too; ``model`` may
        also be a transformers ``pipeline`` (its ``.model`` is calibrated). Returns ``model``. Warns when
        ``preserves_argmax`` is False (predictions may change)."""
        return _attach.attach(self, model)

    def detach(self) -> nn.Module:
        """Undo ``attach``: the model's outputs are bit-for-bit what they were. Returns the model."""
        return _attach.detach(self)

    def extra_repr(self) -> str:
        return _fit_state(self)

    # ------------------------------------------------------------------ Hub (save / load: _core/persistence.py)
    @classmethod
    def _wrong_kind_hint(cls, config: dict) -> str:
        return ". Use hf_calibration.calibrators.load_calibrator to load any kind."

    def fingerprint(self) -> str:
        """The SHA-256 (hex) of what decides the map: the kind, the fit record and every weight's name, dtype, shape and
        bytes. Equal for a calibrator and its saved-and-loaded copy; a conformal
        predictor records it to refuse serving its sets beside other scores (``scores_fingerprint``)."""
        import hashlib

        self._check_fitted()
        digest = hashlib.sha256()
        record = {"kind": self.kind, "fit": self.fit_info_}
        digest.update(json.dumps(record, sort_keys=True, default=str).encode())
        for name, tensor in sorted(self.state_dict().items()):
            t = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(f"\n{name}:{t.dtype}:{tuple(tensor.shape)}:".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return digest.hexdigest()

    def _card_values(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        info = self.fit_info_ or {}

        def pct(x):
            return "n/a" if x is None else f"{100 * x:.2f}%"

        values = {
            "title": f"{type(self).__name__} calibrator",
            "kind": self.kind,
            "objective": info.get("objective", "n/a"),
            "num_samples": info.get("num_samples", "n/a"),
            "num_classes": info.get("num_classes", "n/a"),
            "accuracy": pct(info.get("accuracy")),
            "ece_before": pct(info.get("ece_before")),
            "ece_after": pct(info.get("ece_after")),
            "format_version": hub.CHECKPOINT_FORMAT_VERSION,
            "method_description": self._card_description()
            if not self.is_identity
            else (
                "No calibrator qualified, so this is the identity map: the model's confidences are kept exactly as they "
                f"are ({(info.get('uncalibrated') or {}).get('reason', 'see fit.uncalibrated in config.json')})."
            ),
            "argmax_statement": (
                "The predicted class never changes, only the confidences do."
                if self.preserves_argmax
                else "It may change the predicted class of some inputs (it is not a monotone map of each row)."
            ),
            "citation": self.paper_citation,
            "shift": _shift_card_text(info),
        }
        values.update(kwargs)
        task = values.get("pipeline_task")
        if task == SEGMENTATION_TASK:  # fitted on a semantic segmenter's pixel rows (``pixel_rows``)
            values.setdefault("model_kind", "a semantic segmenter's pixels")
            return values  # the usage: hf_calibration.pipeline, below the Auto-class block the card leaves out
        if task is not None:
            check_pipeline_task(task, "model_card_kwargs['pipeline_task']")
        auto_class, argument = CLASSIFICATION_TASKS[task][:2] if task else (None, None)
        kinds = {IMAGE_TASK: "an image", "text-classification": "a text", "audio-classification": "an audio"}
        values.setdefault("model_kind", f"{kinds.get(task, 'a video' if task else 'a')} classifier")
        values.setdefault("auto_class", auto_class)
        values.setdefault("processor_argument", argument)
        values.setdefault("processor_class", CLASSIFICATION_TASKS[task][2][0] if task else None)
        return values

    def _card_description(self) -> str:
        """One sentence for the model card: what the calibrator does to the logits."""
        return "It maps the classifier's logits to calibrated ones."

    def _before_save(self, folder, overwrite: bool, card: dict[str, Any]) -> None:
        # the card names the model's pipeline task, Auto class and preprocessor: model_card_kwargs["pipeline_task"],
        # else the task of the model saved in the parent folder (its config.json, hf_calibration._core.tasks)
        # (a semantic segmenter's folder: "image-segmentation", the calibrator fitted on its pixel rows)
        if card.get("pipeline_task") is None:
            parent = folder.parent
            segmenter = dense_task_of_folder(parent) == SEGMENTATION_TASK
            card["pipeline_task"] = SEGMENTATION_TASK if segmenter else pipeline_task_of_folder(parent)
        elif card["pipeline_task"] != SEGMENTATION_TASK:  # refused before anything is written
            check_pipeline_task(card["pipeline_task"], "model_card_kwargs['pipeline_task']")
        super()._before_save(folder, overwrite, card)

    @classmethod
    def _check_config(cls, config: dict, where) -> None:
        super()._check_config(config, where)
        fit = config["fit"]
        task = fit.get("task", "multiclass")  # checkpoints older than the record are multi-class
        expected = ("binary", "multilabel") if getattr(cls, "_sigmoid_head", False) else ("multiclass",)
        if task not in expected:
            raise ValueError(
                f"Expected a checkpoint fitted for a {' or '.join(expected)} head (the model's config.problem_type), but "
                f"{str(where)!r} records task={task!r} in its config's fit.task: it is not a {cls.__name__} checkpoint."
            )
        for key, minimum in (("num_classes", 2), ("num_samples", 1)):
            value = fit.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
                raise ValueError(
                    f"The checkpoint in {str(where)!r} is corrupted: its config's fit.{key} must be an integer >= {minimum}, but is {value!r}."
                )

    def _check_loaded(self, path: str) -> None:
        super()._check_loaded(path)
        self._check_state(path)


def scores_fingerprint(calibrator: Calibrator | None) -> str | None:
    """The fingerprint of the scores ``calibrator`` serves: None for the model's own (no calibrator, or one that leaves
    the model as it is), else ``calibrator.fingerprint()``. Sets and scores agree when their fingerprints are equal."""
    if calibrator is None or calibrator.is_identity:
        return None
    return calibrator.fingerprint()
