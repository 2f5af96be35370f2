"""``ConformalPredictor``: split-conformal prediction sets (THR, APS, RAPS) fitted on a calibration split, on the Hub.

The procedure (Angelopoulos, Bates, Malik & Jordan 2021, Algorithms 2-3): softmax probabilities (after an optional
calibrator), one conformity score per calibration sample at its true class (``scores.py``), the threshold ``q_hat`` =
the ``ceil((n+1)(1-alpha))``-th smallest of them (``quantile.py``), and for a new image the set of classes whose score
is at most ``q_hat``. Where this departs from the paper's reference code, and why:

* Non-randomised APS / RAPS give ``{y : s(x, y) <= q_hat}`` with the score of the paper's Algorithm 2. The paper's
  Algorithm 3 also keeps the class at which the cumulative mass crosses ``q_hat``; calibrated on the same scores, that
  set covers more than asked. Ours is the split-conformal set of that score (as TorchCP's), with the same guarantee;
  ``randomized=True`` (the default) is the paper's exactly.
* The non-randomised APS / RAPS score of the last-ranked class is the whole mass, 1, for every image (exactly: the
  cumulative sums are capped at 1), so those scores tie. Coverage is at least ``1 - alpha`` all the same, but the
  ceiling ``1 - alpha + 1/(n+1)`` holds only without ties at the threshold: ``fit_info_["ties_at_threshold"]`` counts
  the calibration scores equal to ``q_hat``, and the card states the ceiling only when there are none (at K = 2,
  ``allow_empty=True``, alpha = 0.1, ties at 1 gave coverage 0.993 against a ceiling of 0.901). The randomised score
  has no such ties.
* ``predict_sets`` treats its input as the kind the predictor was fitted on (logits or probabilities) unless
  ``from_logits`` says otherwise: detected per call, a single logits row such as ``[0.5078, 0.4828]`` reads as
  probabilities, and the same row got another set alone than in a batch.
* ``k_reg`` / ``lambda`` set to ``"auto"`` follow the paper's tuning (``tuning.py``) on a held-out fraction
  (``tune_fraction``, 0.3 as in the reference code) of the calibration data. An unfitted calibrator passed to ``fit`` is
  fitted on that same fraction, never on the samples that set ``q_hat`` (the paper fits Platt scaling on all of them,
  which leaves the guarantee only approximately true).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from hf_calibration._core import checkpoints as hub
from hf_calibration._core.checks import check_choice, check_float, check_int
from hf_calibration._core.inputs import logits_and_labels as _labels_of
from hf_calibration._core.inputs import read_multiclass, scores_kind
from hf_calibration._core.persistence import Saved, refuse_edited
from hf_calibration._core.tasks import check_pipeline_task
from hf_calibration._core.tensors import as_tensor, log_probabilities, native_array
from hf_calibration._core.threads import torch_single_threaded
from hf_calibration.calibrators import Calibrator, NotFittedError, load_calibrator, scores_fingerprint
from hf_calibration.conformal import metrics as _metrics
from hf_calibration.conformal._kernels import label_scores, set_rows
from hf_calibration.conformal.agreement import FINGERPRINT_KEY, check_calibrator_fingerprint
from hf_calibration.conformal.card import (
    CONFORMAL_CARD_TEMPLATE,
    card_values,
    task_only,
    with_pipeline_task,
)
from hf_calibration.conformal.draws import input_draws
from hf_calibration.conformal.quantile import check_alpha, check_enough_samples, conformal_quantile
from hf_calibration.conformal.scores import METHODS, conformity_scores, sets_from_scores
from hf_calibration.conformal.tuning import LAMBDA_GRID, choose_k_reg_rows, choose_penalty_rows

FORMAT_VERSION = 1
CALIBRATOR_SUBFOLDER = "calibrator"
AUTO = "auto"


def _seed_streams(seed: int) -> tuple[int, int]:
    """Two independent seeds from one: the fit's draws (split, tuning, calibration scores) and the predictions'."""
    fit, predict = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
    return int(fit >> 1), int(predict >> 1)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class SavedPredictor(Saved):
    """What both conformal predictors share on disk: the ``conformal`` key, and their calibrator (if any) saved and
    loaded in the ``calibrator/`` subfolder, checked against the fingerprint the fit recorded."""

    checkpoint_key: ClassVar[str] = "conformal"
    checkpoint_what: ClassVar[str] = "conformal predictor"
    save_subfolder: ClassVar[str] = "conformal"
    format_version: ClassVar[int] = FORMAT_VERSION

    @property
    def checkpoint_kind(self) -> str:
        return self.method

    @classmethod
    def _own_kinds(cls) -> Any:
        return list(METHODS)

    @classmethod
    def _wrong_kind_hint(cls, config: dict) -> str:
        return " (it is a calibrator: use load_calibrator)." if "calibrator" in config else "."

    def _before_save(self, folder: Path, overwrite: bool, card: dict[str, Any]) -> None:
        card.update(with_pipeline_task(card, folder))  # the model's task, for this card and the calibrator's
        held = check_save_folder(folder, overwrite=overwrite)
        sub = folder / CALIBRATOR_SUBFOLDER
        if self.calibrator is not None and sub.exists():  # checked before anything is written
            hub.check_save_folder(sub, overwrite=overwrite, what=f"the calibrator's folder {str(sub)!r}")
        if held == "conformal" and self.calibrator is None and sub.is_dir():  # the earlier predictor's calibrator
            hub.remove_owned_files(sub, tuple(hub.owned_files(sub)))  # only the files the package wrote there
            if not any(sub.iterdir()):
                sub.rmdir()

    def _after_save(self, folder: Path, overwrite: bool, card: dict[str, Any]) -> None:
        if self.calibrator is not None:
            self.calibrator.save_pretrained(
                folder / CALIBRATOR_SUBFOLDER, overwrite=overwrite, model_card_kwargs=task_only(card)
            )

    @classmethod
    def _after_load(cls, predictor, opened: dict[str, Any]):
        folder, config = opened["folder"], opened["config"]
        local = folder / CALIBRATOR_SUBFOLDER
        recorded = config["fit"].get("calibrator")
        if not recorded:
            if hub.read_config_or_none(local) is not None:
                raise ValueError(
                    f"The conformal predictor in {str(folder)!r} records no calibrator (its config's fit.calibrator is "
                    f"null), but {str(local)!r} holds one: its config.json was edited after the save, or the "
                    "folders were mixed up. Save the predictor again."
                )
            return predictor
        if not isinstance(recorded, dict) or not isinstance(recorded.get("kind"), str):
            raise ValueError(
                f"The checkpoint in {str(folder)!r} is corrupted: its config's fit.calibrator is {recorded!r}."
            )
        if Path(opened["name_or_path"]).is_dir() and not local.is_dir():
            raise ValueError(
                f"The conformal predictor in {str(folder)!r} was saved with a {recorded['kind']} calibrator in "
                f"{str(local)!r}, but that folder is missing: the sets need it. Copy the whole folder, or save the "
                "predictor again."
            )
        if local.is_dir():
            calibrator = load_calibrator(local, map_location=opened["map_location"])
        else:  # a Hub repo: the calibrator's files are downloaded from its own subfolder
            nested = "/".join(p for p in ((opened["subfolder"] or "").strip("/"), CALIBRATOR_SUBFOLDER) if p)
            calibrator = load_calibrator(opened["name_or_path"], subfolder=nested, **opened["download"])
        if calibrator.kind != recorded["kind"]:
            raise ValueError(
                f"The conformal predictor in {str(folder)!r} was saved with a {recorded['kind']} calibrator, but "
                f"{str(local)!r} holds a {calibrator.kind} one."
            )
        if calibrator.fit_info_.get("num_classes") not in (None, predictor.num_classes):
            raise ValueError(
                f"The calibrator saved with the predictor in {str(local)!r} was fitted on K = "
                f"{calibrator.fit_info_.get('num_classes')} classes, the predictor on K = {predictor.num_classes}."
            )
        check_calibrator_fingerprint(predictor, calibrator, local)
        predictor.__dict__["calibrator_"] = calibrator
        return predictor


class ConformalPredictor(
    SavedPredictor,
    library_name="hf_calibration",
    tags=["conformal-prediction", "hf_calibration"],  # and the model's pipeline task, per card (generate_model_card)
    model_card_template=CONFORMAL_CARD_TEMPLATE,
):
    """Prediction sets with a coverage guarantee, from a classifier's logits.

    Args:
        method: ``"thr"`` (LAC: the class's probability is at least ``1 - q_hat``), ``"aps"`` or ``"raps"`` (the most
            probable classes until their cumulated probability, plus RAPS's rank penalty, reaches ``q_hat``).
        randomized: the randomised APS / RAPS score (one uniform draw per image, as in the paper; the default for
            them). THR has no randomised form.
        allow_empty: keep empty sets (exact coverage: at most ``1 - alpha + 1/(n+1)``). The default, False, gives an
            empty set the most probable class, as the paper's code does: coverage stays at least ``1 - alpha`` and may
            exceed it when the model is more accurate than ``1 - alpha``.
        k_reg, penalty: RAPS's ``k_reg`` (an integer >= 0) and ``lambda`` (>= 0), or ``"auto"`` (the default for RAPS):
            chosen on a tuning split as in the paper. Only for ``method="raps"``.
        tune_fraction: the share of the calibration data held out for ``"auto"`` parameters or an unfitted calibrator.
        seed: seeds every random draw (the split, the randomised scores at fit and at prediction), so one seed gives
            the same sets; a predictor loaded with ``from_pretrained`` repeats the saved one's predictions.

    Example::

        predictor = ConformalPredictor("aps").fit(val_logits, val_labels, alpha=0.1)
        sets = predictor.predict_sets(test_logits)                   # (N, K) boolean
        predictor.coverage(sets, test_labels), predictor.set_size(sets)
        predictor.save_pretrained("vit/conformal")
    """

    default_randomized: ClassVar[dict[str, bool]] = {"thr": False, "aps": True, "raps": True}

    def __init__(
        self,
        method: str = "raps",
        *,
        randomized: bool | None = None,
        allow_empty: bool = False,
        k_reg: int | str | None = None,
        penalty: float | str | None = None,
        tune_fraction: float = 0.3,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.method = check_choice(method, "method", METHODS)
        if randomized is None:
            randomized = self.default_randomized[method]
        for name, value in (("randomized", randomized), ("allow_empty", allow_empty)):
            if not isinstance(value, bool):
                raise TypeError(f"Expected argument `{name}` to be a bool, but got {value!r}.")
        if randomized and method == "thr":
            raise ValueError(
                "Expected argument `randomized` to be False (or None) for method='thr': THR has no randomised form."
            )
        self.randomized, self.allow_empty = randomized, allow_empty
        if method != "raps":
            for name, value in (("k_reg", k_reg), ("penalty", penalty)):
                if value is not None:
                    raise ValueError(
                        f"Expected argument `{name}` to be None for method={method!r}: it is a RAPS parameter."
                    )
        self.k_reg = AUTO if k_reg in (None, AUTO) else check_int(k_reg, "k_reg", minimum=0)
        self.penalty = AUTO if penalty in (None, AUTO) else check_float(penalty, "penalty", minimum=0.0)
        self.tune_fraction = check_float(
            tune_fraction, "tune_fraction", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False
        )
        self.seed = check_int(seed, "seed", minimum=0)
        self.register_buffer("q_hat", torch.tensor(float("nan"), dtype=torch.float64))
        self.fit_info_: dict[str, Any] | None = None
        self.__dict__["calibrator_"] = None  # not a submodule: saved in its own subfolder, loaded by its own class
        self.__dict__["_attached_to"] = None
        self._reset_stream()

    # ------------------------------------------------------------------ state
    @property
    def calibrator(self) -> Calibrator | None:
        """The calibrator applied to the logits before the scores (None: plain softmax)."""
        return self.__dict__["calibrator_"]

    @property
    def num_classes(self) -> int | None:
        return (self.fit_info_ or {}).get("num_classes")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(
                "This ConformalPredictor is not fitted yet: call fit(logits, labels) or load one with from_pretrained() first."
            )

    def _reset_stream(self) -> None:
        """Restart the predictions' random stream from ``seed`` (after a fit or a load)."""
        self.__dict__["_predict_generator"] = _generator(_seed_streams(self.seed)[1])

    def _params(self) -> dict[str, Any]:
        info = self.fit_info_ or {}
        return {"k_reg": info.get("k_reg") or 0, "penalty": info.get("penalty") or 0.0}

    # ------------------------------------------------------------------ inputs
    def _probabilities(self, logits: Any, from_logits: bool | None) -> torch.Tensor:
        return _probabilities(
            logits, from_logits, self.calibrator, self.num_classes, fitted=(self.fit_info_ or {}).get("input")
        )

    def _draws(self, n: int, generator: torch.Generator, device) -> torch.Tensor | None:
        """The randomised score's uniform draws (one per row), or None when the scores are not randomised."""
        if not self.randomized:
            return None
        return torch.rand(n, generator=generator, dtype=torch.float64).to(device)

    def _scores(self, probs: torch.Tensor, u: torch.Tensor | None, k_reg: int, penalty: float) -> torch.Tensor:
        return conformity_scores(probs, self.method, u, k_reg=k_reg, penalty=penalty)

    # ------------------------------------------------------------------ fit
    def fit(
        self,
        logits: Any,
        labels: Any = None,
        *,
        alpha: float = 0.1,
        calibrator: Calibrator | None = None,
        from_logits: bool | None = None,
    ) -> ConformalPredictor:
        """Calibrate the threshold on held-out logits and labels (never the test split); returns ``self``.

        Args:
            logits: (N, K) logits or probabilities (torch or numpy), or a transformers ``PredictionOutput``.
            labels: (N,) class indices; -100 rows are left out.
            alpha: the miscoverage level in (0, 1): sets contain the true class with probability >= 1 - alpha. It needs
                ``n >= 1/alpha - 1`` calibration samples (19 at alpha = 0.05), else ``ValueError``.
            calibrator: an hf_calibration calibrator applied to the logits first, and saved with the predictor. A fitted
                one is used as it is (fit it on other data than these); an unfitted one is fitted here, in place, on
                the held-out ``tune_fraction`` of the data.
            from_logits: None detects probabilities (rows in [0, 1] summing to 1); True / False says which.
        """
        alpha = check_alpha(alpha)
        if calibrator is not None and not isinstance(calibrator, Calibrator):
            raise TypeError(
                f"Expected argument `calibrator` to be an hf_calibration Calibrator or None, but got {type(calibrator).__name__}."
            )
        logits, labels = _labels_of(logits, labels)
        logits, from_logits, one_logit = _two_columns(logits, from_logits)
        inputs = read_multiclass(logits, labels, from_logits=from_logits, preds_name="logits", target_name="labels")
        z = _kernel_input(inputs.preds)
        _check_rows(z, inputs.from_logits)
        y = inputs.target
        n, k = z.shape
        if calibrator is not None and calibrator.is_fitted and calibrator.fit_info_.get("num_classes") not in (None, k):
            raise ValueError(
                f"Expected argument `calibrator` to be fitted on K = {k} classes, but it was fitted on {calibrator.fit_info_['num_classes']}."
            )
        generator = _generator(_seed_streams(self.seed)[0])
        tuned = [
            f"choose RAPS's {name}"
            for name, value in (("k_reg", self.k_reg), ("lambda", self.penalty))
            if value == AUTO and self.method == "raps"
        ]
        if calibrator is not None and not calibrator.is_fitted:
            tuned.append(f"fit the {calibrator.kind} calibrator")
        if tuned:
            order = torch.randperm(n, generator=generator)
            n_tune = math.ceil(self.tune_fraction * n)
            tune, cal = order[:n_tune], order[n_tune:]
            if n - n_tune < 1:
                raise ValueError(
                    f"Expected more than {n_tune} samples: tune_fraction={self.tune_fraction} leaves none to calibrate on."
                )
        else:
            tune, cal = torch.arange(0), torch.arange(n)
        check_enough_samples(
            int(cal.numel()), alpha, "calibration samples" + (" after the tuning split" if tuned else "")
        )

        with torch_single_threaded():  # the kernels choose their own threads (by the machine's load)
            self._fit(z, y, inputs.from_logits, alpha, calibrator, generator, tune.numpy(), cal.numpy(), tuned)
        if one_logit:
            self.fit_info_["task"] = "binary"  # one sigmoid logit z, read as the two softmax logits [0, z]
        return self

    def _fit(self, z, y, is_logits, alpha, calibrator, generator, tune, cal, tuned) -> ConformalPredictor:
        given = "logits" if is_logits else "probabilities"
        if calibrator is not None and not calibrator.is_fitted:
            calibrator.fit(z[tune], y[tune], from_logits=is_logits, progress_bar=False)
        if calibrator is not None:
            z, is_logits = _calibrated(calibrator, z, is_logits), True
        from_probs = not is_logits
        k_reg, penalty, tuning = self._resolve_raps(z, tune, y[tune], alpha, generator, from_probs)
        u = self._draws(int(cal.shape[0]), generator, "cpu")
        u = None if u is None else u.numpy()
        scores, _ = label_scores(
            z, y[cal], self.method, rows=cal, u=u, k_reg=k_reg, penalty=penalty, from_probs=from_probs
        )
        q_hat = conformal_quantile(torch.from_numpy(scores), alpha)
        ties = int((scores == q_hat).sum())  # 1: the threshold itself; more: the coverage ceiling does not hold
        if ties > 1 and self.allow_empty:
            warnings.warn(
                f"{ties} of the {int(cal.shape[0])} calibration scores tie at the threshold q_hat = {q_hat:.6g}"
                + (
                    " (the non-randomised score of the last-ranked class is 1 for every image)"
                    if q_hat == 1.0 and self.method != "thr"
                    else ""
                )
                + ": coverage is still at least 1 - alpha, but the ceiling 1 - alpha + 1/(n+1) that allow_empty=True "
                "aims at does not hold. randomized=True breaks the ties.",
                UserWarning,
                stacklevel=3,
            )
        # the calibration data's sets, same draws: their coverage and mean size for the record
        _, sizes, covered = set_rows(
            z,
            self.method,
            q_hat,
            rows=cal,
            u=u,
            k_reg=k_reg,
            penalty=penalty,
            allow_empty=self.allow_empty,
            from_probs=from_probs,
            labels=y[cal],
            masks=False,
        )
        self.q_hat.fill_(q_hat)
        self.__dict__["calibrator_"] = calibrator
        self.fit_info_ = {
            "method": self.method,
            "alpha": alpha,
            "randomized": self.randomized,
            "allow_empty": self.allow_empty,
            "k_reg": k_reg if self.method == "raps" else None,
            "penalty": penalty if self.method == "raps" else None,
            "input": given,
            "num_samples": int(cal.shape[0]),
            "num_tune": int(tune.shape[0]),
            "tuned": tuned,
            "num_classes": int(z.shape[1]),
            "quantile_rank": check_enough_samples(int(cal.shape[0]), alpha),
            "q_hat": q_hat,
            "ties_at_threshold": ties,
            "coverage": float(covered.mean()),
            "mean_set_size": float(sizes.mean()),
            "calibrator": None
            if calibrator is None
            else {
                "kind": calibrator.kind,
                "fitted_on": "fitted on the tuning split"
                if any(t.startswith("fit the") for t in tuned)
                else "given fitted",
            },
            # the scores the sets were fitted on (None: the model's own): a served model is refused other scores
            FINGERPRINT_KEY: scores_fingerprint(calibrator),
            **({"lambda_set_sizes": tuning} if tuning else {}),
        }
        self._reset_stream()
        return self

    def _resolve_raps(
        self,
        z: np.ndarray,
        rows: np.ndarray,
        labels: np.ndarray,
        alpha: float,
        generator: torch.Generator,
        from_probs: bool,
    ):
        """``(k_reg, lambda, {lambda: tuning set size})`` for RAPS (``"auto"`` chosen on the tuning rows), zeros otherwise."""
        if self.method != "raps":
            return 0, 0.0, None
        if self.k_reg == AUTO:
            k_reg = choose_k_reg_rows(label_scores(z, labels, "thr", rows=rows, from_probs=from_probs)[1], alpha)
        else:
            k_reg = self.k_reg
        if self.penalty != AUTO:
            return k_reg, self.penalty, None
        draws = [self._draws(rows.shape[0], generator, "cpu") for _ in range(2)]
        u_calibrate, u_predict = (None if u is None else u.numpy() for u in draws)
        penalty, sizes = choose_penalty_rows(
            z,
            rows,
            labels,
            alpha,
            k_reg,
            u_calibrate,
            u_predict,
            allow_empty=self.allow_empty,
            from_probs=from_probs,
            grid=LAMBDA_GRID,
        )
        return k_reg, penalty, {str(lam): size for lam, size in sizes.items()}

    # ------------------------------------------------------------------ predict
    def predict_sets(
        self,
        logits: Any,
        *,
        from_logits: bool | None = None,
        generator: torch.Generator | int | None = None,
        draws_from: Any = None,
    ):
        """The prediction sets of (N, K) logits (or probabilities) as an (N, K) boolean mask: a torch tensor on the
        input's device for torch input, numpy otherwise (numpy arrays, nested lists).

        ``from_logits``: None treats the input as the kind the predictor was fitted on (``fit_info_["input"]``; rows
        that look like probabilities given to a predictor fitted on logits are treated as logits, with a warning);
        True / False says which.

        Randomised methods need one uniform draw per row. By default it comes from the predictor's stream (seeded by
        ``seed``, restarted by ``fit`` and ``from_pretrained``), so a sequence of calls is reproducible, but the same
        row gets a new draw on every call; ``generator`` (a ``torch.Generator`` or an int seed) draws from another
        stream instead. ``draws_from`` derives each row's draw from the input instead (``draws.input_draws``, keyed by
        ``seed``): ``"logits"`` (the rows given), or an (N, ...) tensor or array such as the images' pixel values, so
        that one input gets one set, alone or in any batch, call after call (what ``attach`` does by default).
        """
        self._check_fitted()
        if isinstance(logits, torch.Tensor) and logits.device.type != "cpu":
            return self._predict_sets(logits, from_logits, generator, draws_from)
        with torch_single_threaded():  # see fit
            return self._predict_sets(logits, from_logits, generator, draws_from)

    def _predict_sets_with_draws(self, logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The sets of a pipeline batch's (N, K) logits with each row's draw ``u`` (N,) given (``attach``: derived from
        each input alone, before the batch was padded)."""
        with torch_single_threaded():
            return self._predict_sets(logits, True, None, draws=u)

    def _predict_sets(self, logits, from_logits, generator, draws_from=None, draws=None):
        if isinstance(logits, torch.Tensor) and logits.device.type != "cpu":  # on its device, in torch
            probs = self._probabilities(logits, from_logits)
            u = draws.to(probs.device) if draws is not None else None
            u = self._prediction_draws(probs.shape[0], probs.device, logits, generator, draws_from) if u is None else u
            scores = self._scores(probs, u, **self._params())
            return sets_from_scores(scores, float(self.q_hat), allow_empty=self.allow_empty, probs=probs)
        z, is_logits = _checked(logits, from_logits, self.num_classes, fitted=(self.fit_info_ or {}).get("input"))
        u = (
            draws
            if draws is not None
            else self._prediction_draws(z.shape[0], torch.device("cpu"), logits, generator, draws_from)
        )
        if self.calibrator is not None:
            z, is_logits = _calibrated(self.calibrator, z, is_logits), True
        sets, _, _ = set_rows(
            z,
            self.method,
            float(self.q_hat),
            u=None if u is None else u.numpy(),
            allow_empty=self.allow_empty,
            from_probs=not is_logits,
            **self._params(),
        )
        return torch.from_numpy(sets) if isinstance(logits, torch.Tensor) else sets

    def _prediction_draws(
        self, n: int, device: Any, logits: Any, generator: Any, draws_from: Any
    ) -> torch.Tensor | None:
        """The randomised score's draws at prediction (None when the scores are not randomised); see ``predict_sets``."""
        if draws_from is not None:
            if generator is not None:
                raise ValueError("Expected at most one of arguments `generator` and `draws_from`, but got both.")
            if isinstance(draws_from, str):
                if draws_from != "logits":
                    raise ValueError(
                        f"Expected argument `draws_from` to be 'logits', an (N, ...) tensor or array, or None, but got {draws_from!r}."
                    )
                draws_from = (
                    as_tensor(logits, "logits")
                    if isinstance(logits, (torch.Tensor, np.ndarray))
                    else torch.as_tensor(np.asarray(logits, dtype=np.float64))
                )
            elif not isinstance(draws_from, (torch.Tensor, np.ndarray)):
                raise TypeError(
                    f"Expected argument `draws_from` to be 'logits', a torch.Tensor or numpy array, or None, but got {type(draws_from).__name__}."
                )
            if draws_from.shape[0] != n:
                raise ValueError(
                    f"Expected argument `draws_from` to have one row per row of `logits` ({n}), but got {draws_from.shape[0]}."
                )
            return input_draws(draws_from, self.seed).to(device) if self.randomized else None
        generator = self._stream(generator)
        return self._draws(n, generator, device)

    def _stream(self, generator: torch.Generator | int | None) -> torch.Generator:
        """The generator of the draws: ``generator`` (an int seeds a new one), else the predictor's own stream."""
        if isinstance(generator, int) and not isinstance(generator, bool):
            return _generator(generator)
        if generator is None:
            return self.__dict__["_predict_generator"]
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"Expected argument `generator` to be a torch.Generator, an int seed or None, but got {generator!r}."
            )
        return generator

    def draw_uniforms(self, n: int, *, generator: torch.Generator | int | None = None) -> torch.Tensor | None:
        """The (n,) float64 Uniform(0, 1) draws that ``predict_sets`` would use for its next ``n`` rows, taken from the
        predictor's stream (which they advance) or from ``generator``; None when the scores are not randomised. An
        exported graph (``hf_calibration.serving.export_onnx``) takes them as its input ``u``."""
        self._check_fitted()
        n = check_int(n, "n", minimum=0)
        generator = self._stream(generator)
        return self._draws(n, generator, torch.device("cpu"))

    def forward(self, logits: Any, from_logits: bool | None = None):
        """``predict_sets(logits)``."""
        return self.predict_sets(logits, from_logits=from_logits)

    coverage = staticmethod(_metrics.coverage)
    set_size = staticmethod(_metrics.set_size)

    def evaluate(self, logits: Any, labels: Any, *, from_logits: bool | None = None) -> dict[str, float]:
        """``{"coverage", "mean_set_size"}`` of this predictor's sets on held-out (test) logits and labels."""
        logits, labels = _labels_of(logits, labels)
        sets = self.predict_sets(logits, from_logits=from_logits)
        return {"coverage": _metrics.coverage(sets, labels), "mean_set_size": _metrics.set_size(sets)}

    def attach(self, pipe: Any, *, draws: str = "input") -> Any:
        """Make an image-classification ``pipeline``'s results carry their prediction sets (see ``pipeline.py``): each
        row gets ``"in_set"``, and every class of the set is listed even beyond ``top_k``. Returns ``pipe``.

        ``draws`` (randomised APS / RAPS): ``"input"`` (default) derives each image's draw from its pixel values, so
        one image gets one set, alone or in a batch, call after call; ``"stream"`` draws from the predictor's random
        stream, a new draw per image and call (as ``predict_sets`` does by default)."""
        from hf_calibration.conformal.pipeline import attach

        return attach(self, pipe, draws=draws)

    def detach(self) -> Any:
        """Undo ``attach``: the pipeline returns its usual results again. Returns the pipeline."""
        from hf_calibration.conformal.pipeline import detach

        return detach(self)

    def extra_repr(self) -> str:
        info = self.fit_info_
        return f"method={self.method!r}, " + (
            f"alpha={info['alpha']}, q_hat={info['q_hat']:.6g}" if info else "not fitted"
        )

    # ------------------------------------------------------------------ Hub (save / load: _core/persistence.py)
    def _card_values(self, values: dict[str, Any]) -> dict[str, Any]:
        task = values.get("pipeline_task")
        if task is not None:
            check_pipeline_task(task, "model_card_kwargs['pipeline_task']")
        return {**card_values(self, task), **values}

    def _check_loaded(self, path: str) -> None:
        super()._check_loaded(path)
        _check_fit_record(self, str(Path(path).parent))
        self._reset_stream()

    @classmethod
    def _check_config(cls, config: dict, where) -> None:
        super()._check_config(config, where)
        fit = config["fit"]
        if not isinstance(fit.get("num_classes"), int) or fit["num_classes"] < 2:
            raise ValueError(
                f"The checkpoint in {str(where)!r} has no valid `fit` record in its config: it is corrupted or was never fitted."
            )


def _kernel_input(x: np.ndarray) -> np.ndarray:
    """A C-ordered native float32 / float64 array the kernels read (float16 and others become float32, exactly)."""
    x = native_array(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)
    return np.ascontiguousarray(x)


def _calibrated(calibrator: Calibrator, z: np.ndarray, is_logits: bool) -> np.ndarray:
    """The calibrator's logits for ``z`` (numpy in, numpy out: one array of ``z``'s size)."""
    with torch.no_grad():
        return _kernel_input(calibrator(torch.from_numpy(z), from_logits=is_logits).numpy())


def _shaped(
    logits: Any, from_logits: bool | None, num_classes: int | None, fitted: str | None
) -> tuple[torch.Tensor, bool | None]:
    """``logits`` as a floating (N, K) tensor with N >= 1 and the fitted K, and ``from_logits`` for it; a binary
    predictor reads a one-logit head's (N,) / (N, 1) scores as two softmax logits (``_two_columns``), another K keeps
    its rank check."""
    if num_classes in (None, 2):
        logits, from_logits, _ = _two_columns(logits, from_logits, fitted)
    z = _as_input(logits)
    if z.ndim != 2:
        raise ValueError(f"Expected `logits` to have shape (N, K) (rank 2), but got shape {tuple(z.shape)}.")
    if not z.is_floating_point():
        raise TypeError(f"Expected `logits` to be a floating array, but got {z.dtype}.")
    if num_classes is not None and z.shape[1] != num_classes:
        raise ValueError(
            f"Expected `logits` to have K = {num_classes} classes (the predictor was fitted on {num_classes}), but got K = {z.shape[1]}."
        )
    if z.shape[0] == 0:
        raise ValueError("Expected `logits` to hold at least one row, but got N = 0.")
    return z, from_logits


def _checked(
    logits: Any, from_logits: bool | None, num_classes: int | None, fitted: str | None = None
) -> tuple[np.ndarray, bool]:
    """Checked CPU (N, K) input for the kernels, and whether it holds logits (``_input_kind``; ``fitted``: the fit's
    input kind): shape, K, finite values, and for probabilities the rule every entry point applies (values in [0, 1],
    rows summing to 1 within 1e-2). A binary head's (N,) / (N, 1) logits are read as two softmax logits."""
    z, from_logits = _shaped(logits, from_logits, num_classes, fitted)
    zn = _kernel_input((z.float() if z.dtype == torch.bfloat16 else z).detach().numpy())
    is_logits = _input_kind(z, from_logits, fitted)
    _check_rows(zn, is_logits)
    return zn, is_logits


def _check_rows(z: np.ndarray, is_logits: bool) -> None:
    """Finite logits; probabilities by the rule every entry point applies (values in [0, 1], rows summing to 1 within
    1e-2). One compiled pass."""
    from hf_calibration._core.finite import first_non_finite
    from hf_calibration._core.rowpass import raise_row_error, top_label_pass

    if is_logits:
        bad = first_non_finite(z)
        if bad >= 0:
            raise ValueError(f"Expected `logits` to be finite, but row {bad} contains NaN or inf.")
        return
    found = top_label_pass(z, None, False, arrays=False)[3]
    if found is not None:
        raise_row_error(z, found, "logits")


def _check_fit_record(predictor: ConformalPredictor, where: str) -> None:
    """Refuse a fit record that does not match the threshold in the weights, or is not consistent in itself."""
    info = predictor.fit_info_

    def refuse(what: str) -> None:
        refuse_edited(where, "conformal predictor", what)

    if not isinstance(info.get("q_hat"), (int, float)) or float(info["q_hat"]) != float(predictor.q_hat):
        refuse(f"fit.q_hat is {info.get('q_hat')!r}, the weights hold q_hat = {float(predictor.q_hat)!r}")
    for name in ("method", "randomized", "allow_empty"):
        if info.get(name) != getattr(predictor, name):
            refuse(f"`{name}` is {getattr(predictor, name)!r} but fit.{name} is {info.get(name)!r}")
    try:
        alpha, n = check_alpha(info.get("alpha")), info.get("num_samples")
        consistent = isinstance(n, int) and n >= 1 and check_enough_samples(n, alpha) == info.get("quantile_rank")
    except (TypeError, ValueError):
        consistent = False
    if not consistent:
        refuse(
            f"fit.alpha = {info.get('alpha')!r} with fit.num_samples = {info.get('num_samples')!r} does not give "
            f"fit.quantile_rank = {info.get('quantile_rank')!r}"
        )


def _as_input(logits: Any) -> torch.Tensor:
    """A tensor or array as it is; nested lists (which ``fit`` takes too) as a float64 array."""
    if isinstance(logits, (torch.Tensor, np.ndarray)):
        return as_tensor(logits, "logits")
    if isinstance(logits, (list, tuple)):
        try:
            return torch.from_numpy(np.asarray(logits, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"Expected `logits` to be an (N, K) array of numbers, but the list given is not one ({err})."
            ) from None
    raise TypeError(
        f"Expected `logits` to be a torch.Tensor, a numpy array or a nested list, but got {type(logits).__name__}."
    )


def _input_kind(z: torch.Tensor, from_logits: bool | None, fitted: str | None) -> bool:
    """Whether ``z`` holds logits: ``from_logits`` when given, else the kind the predictor was fitted on (``fitted``:
    ``"logits"`` / ``"probabilities"``; None: detected). Never detected per call when a fit says which."""
    return scores_kind(z, from_logits, recorded=fitted, name="logits")


def _two_columns(logits: Any, from_logits: bool | None, fitted: str | None = None) -> tuple[Any, bool | None, bool]:
    """A binary head's one logit per sample ((N,) or (N, 1)) as the two softmax logits ``[0, z]`` (or, for
    probabilities, the rows ``[1 - p, p]``), whose softmax is ``[1 - sigmoid(z), sigmoid(z)]``: THR, APS and RAPS then
    give sets of the two classes {0, 1}. Other input is returned as it is. ``fitted``: the fit's input kind, which
    decides when ``from_logits`` is None (one logit of 0.3 alone is then read as in a batch, not as a probability).
    Returns ``(input, from_logits, converted)``."""
    shape = tuple(getattr(logits, "shape", np.shape(logits)))
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        return logits, from_logits, False
    z = as_tensor(logits if not isinstance(logits, (list, tuple)) else np.asarray(logits), "logits")
    if not z.is_floating_point():
        raise TypeError(f"Expected `logits` to be a floating array, but got {z.dtype}.")
    z = z.reshape(-1)
    is_logits = scores_kind(z, from_logits, task="binary", recorded=fitted, name="logits")
    pair = torch.stack([torch.zeros_like(z), z], dim=1) if is_logits else torch.stack([1 - z, z], dim=1)
    if isinstance(logits, np.ndarray):
        pair = pair.numpy()
    return pair, is_logits, True


def _probabilities(
    logits: Any,
    from_logits: bool | None,
    calibrator: Calibrator | None,
    num_classes: int | None = None,
    fitted: str | None = None,
) -> torch.Tensor:
    """Checked (N, K) input -> float64 probabilities on its device, through ``calibrator`` if there is one; ``fitted``:
    the input kind of the fit (see ``_input_kind``). A binary head's (N,) / (N, 1) logits are read as two softmax
    logits (``_two_columns``)."""
    z, from_logits = _shaped(logits, from_logits, num_classes, fitted)
    if not bool(torch.isfinite(z.sum())):  # one reduction; a NaN, an inf or an overflowing total lands here
        finite = torch.isfinite(z).all(dim=1)
        if not bool(finite.all()):
            raise ValueError(
                f"Expected `logits` to be finite, but row {int((~finite).nonzero()[0])} contains NaN or inf."
            )
    is_logits = _input_kind(z, from_logits, fitted)
    if calibrator is not None:
        z, is_logits = calibrator(z, from_logits=is_logits), True
    if not is_logits:
        z = log_probabilities(z, torch.float64)
    return torch.softmax(z, dim=1, dtype=torch.float64)  # cast inside the kernel: no float64 copy of the logits


def check_save_folder(
    folder: str | Path,
    *,
    overwrite: bool,
    what: str = "argument `save_directory`",
    overwrite_flag: str = "overwrite=True",
) -> str | None:
    """Check that a predictor may be saved in ``folder`` (the rules of ``hub.check_save_folder``, where a predictor
    saved there counts as ours); returns ``"conformal"`` or ``"calibrator"`` when one is there to replace, else None."""
    folder = Path(folder)
    if _predictor_config(folder) is None:
        return (
            "calibrator"
            if hub.check_save_folder(
                folder, overwrite=overwrite, what=what, overwrite_flag=overwrite_flag, subfolder="conformal"
            )
            else None
        )
    if not overwrite:
        raise ValueError(
            f"Expected {what} to be a new or empty folder, but {str(folder)!r} holds a conformal predictor; "
            f"pass {overwrite_flag} to replace it."
        )
    return "conformal"


def _predictor_config(folder: Path) -> dict | None:
    """The folder's config.json if it is a ConformalPredictor's, else None."""
    try:
        config = json.loads((folder / hub.CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) and config.get("conformal") in METHODS else None
