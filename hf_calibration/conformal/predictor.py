"""``ConformalPredictor``: split-conformal prediction sets (THR, APS, RAPS) fitted on a calibration split, on the Hub.

The procedure (Angelopoulos, Bates, Malik & Jordan 2021, Algorithms 2-3): softmax probabilities (after an optional
calibrator), one conformity score per calibration sample at its true class (``scores.py``), the threshold ``q_hat`` =
the ``ceil((n+1)(1-alpha))``-th smallest of them (``quantile.py``), and for a new image the set of classes whose score
is at most ``q_hat``. Where this departs from the paper's reference code, and why:

* Non-randomised APS / RAPS give ``{y : s(x, y) <= q_hat}`` with the score of the paper's Algorithm 2. The paper's
  Algorithm 3 also keeps the class at which the cumulative mass crosses ``q_hat``; calibrated on the same scores, that
  set covers more than asked. Ours is the split-conformal set of that score (as TorchCP's), with the same guarantee;
  ``randomized=True`` (the default) is the paper's exactly.
* ``k_reg`` / ``lambda`` set to ``"auto"`` follow the paper's tuning (``tuning.py``) on a held-out fraction
  (``tune_fraction``, 0.3 as in the reference code) of the calibration data. An unfitted calibrator passed to ``fit`` is
  fitted on that same fraction, never on the samples that set ``q_hat`` (the paper fits Platt scaling on all of them,
  which leaves the guarantee only approximately true).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from .. import hub
from .._checks import check_choice, check_float, check_int, resolve_from_logits
from ..calibrators._base import Calibrator, NotFittedError, _labels_of
from ..calibrators._inputs import as_tensor, log_probabilities, native_array
from ..calibrators._threads import torch_single_threaded
from ..metrics._format import prepare
from . import metrics as _metrics
from .card import CONFORMAL_CARD_TEMPLATE, card_values
from .quantile import check_alpha, check_enough_samples, conformal_quantile
from .scores import METHODS, conformity_scores, sets_from_scores
from .tuning import LAMBDA_GRID, choose_k_reg, choose_penalty


FORMAT_VERSION = 1
CALIBRATOR_SUBFOLDER = "calibrator"
AUTO = "auto"


def _seed_streams(seed: int) -> tuple[int, int]:
    """Two independent seeds from one: the fit's draws (split, tuning, calibration scores) and the predictions'."""
    fit, predict = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint64)
    return int(fit >> 1), int(predict >> 1)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class ConformalPredictor(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="hf_calibration",
    tags=["conformal-prediction", "hf_calibration", "image-classification"],
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
    format_version: ClassVar[int] = FORMAT_VERSION

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
            raise ValueError("Expected argument `randomized` to be False (or None) for method='thr': THR has no randomised form.")
        self.randomized, self.allow_empty = randomized, allow_empty
        if method != "raps":
            for name, value in (("k_reg", k_reg), ("penalty", penalty)):
                if value is not None:
                    raise ValueError(f"Expected argument `{name}` to be None for method={method!r}: it is a RAPS parameter.")
        self.k_reg = AUTO if k_reg in (None, AUTO) else check_int(k_reg, "k_reg", minimum=0)
        self.penalty = AUTO if penalty in (None, AUTO) else check_float(penalty, "penalty", minimum=0.0)
        self.tune_fraction = check_float(tune_fraction, "tune_fraction", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
        self.seed = check_int(seed, "seed", minimum=0)
        self.register_buffer("q_hat", torch.tensor(float("nan"), dtype=torch.float64))
        self.fit_info_: dict[str, Any] | None = None
        self.__dict__["calibrator_"] = None  # not a submodule: saved in its own subfolder, loaded by its own class
        self.__dict__["_attached_to"] = None
        self._reset_stream()

    # ------------------------------------------------------------------ state
    @property
    def is_fitted(self) -> bool:
        return self.fit_info_ is not None

    @property
    def calibrator(self) -> Calibrator | None:
        """The calibrator applied to the logits before the scores (None: plain softmax)."""
        return self.__dict__["calibrator_"]

    @property
    def num_classes(self) -> int | None:
        return (self.fit_info_ or {}).get("num_classes")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError("This ConformalPredictor is not fitted yet: call fit(logits, labels) or load one with from_pretrained() first.")

    def _reset_stream(self) -> None:
        """Restart the predictions' random stream from ``seed`` (after a fit or a load)."""
        self.__dict__["_predict_generator"] = _generator(_seed_streams(self.seed)[1])

    def _params(self) -> dict[str, Any]:
        info = self.fit_info_ or {}
        return {"k_reg": info.get("k_reg") or 0, "penalty": info.get("penalty") or 0.0}

    # ------------------------------------------------------------------ inputs
    def _probabilities(self, logits: Any, from_logits: bool | None) -> torch.Tensor:
        return _probabilities(logits, from_logits, self.calibrator, self.num_classes)

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
    ) -> "ConformalPredictor":
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
            raise TypeError(f"Expected argument `calibrator` to be an hf_calibration Calibrator or None, but got {type(calibrator).__name__}.")
        logits, labels = _labels_of(logits, labels)
        inputs = prepare(logits, labels, from_logits=from_logits, preds_name="logits", target_name="labels")
        z = torch.from_numpy(native_array(inputs.preds))
        y = torch.from_numpy(inputs.target)
        n, k = z.shape
        if calibrator is not None and calibrator.is_fitted and calibrator.fit_info_.get("num_classes") not in (None, k):
            raise ValueError(f"Expected argument `calibrator` to be fitted on K = {k} classes, but it was fitted on {calibrator.fit_info_['num_classes']}.")
        generator = _generator(_seed_streams(self.seed)[0])
        tuned = [f"choose RAPS's {name}" for name, value in (("k_reg", self.k_reg), ("lambda", self.penalty)) if value == AUTO and self.method == "raps"]
        if calibrator is not None and not calibrator.is_fitted:
            tuned.append(f"fit the {calibrator.kind} calibrator")
        if tuned:
            order = torch.randperm(n, generator=generator)
            n_tune = math.ceil(self.tune_fraction * n)
            tune, cal = order[:n_tune], order[n_tune:]
            if n - n_tune < 1:
                raise ValueError(f"Expected more than {n_tune} samples: tune_fraction={self.tune_fraction} leaves none to calibrate on.")
        else:
            tune, cal = torch.arange(0), torch.arange(n)
        check_enough_samples(int(cal.numel()), alpha, "calibration samples" + (" after the tuning split" if tuned else ""))

        with torch_single_threaded():  # small memory-bound passes: on a busy machine threads only stall (_threads.py)
            return self._fit(z, y, inputs.from_logits, alpha, calibrator, generator, tune, cal, tuned)

    def _fit(self, z, y, is_logits, alpha, calibrator, generator, tune, cal, tuned) -> "ConformalPredictor":
        if calibrator is not None and not calibrator.is_fitted:
            calibrator.fit(z[tune], y[tune], from_logits=is_logits, progress_bar=False)
        probs = _probabilities(z, is_logits, calibrator)
        k_reg, penalty, tuning = self._resolve_raps(probs[tune], y[tune], alpha, generator)
        u = self._draws(int(cal.numel()), generator, probs.device)
        scores = self._scores(probs[cal], u, k_reg, penalty)
        label_scores = scores[torch.arange(cal.numel()), y[cal]]
        q_hat = conformal_quantile(label_scores, alpha)
        sets = sets_from_scores(scores, q_hat, allow_empty=self.allow_empty)  # the calibration data's sets, same draws
        self.q_hat.fill_(q_hat)
        self.__dict__["calibrator_"] = calibrator
        self.fit_info_ = {
            "method": self.method,
            "alpha": alpha,
            "randomized": self.randomized,
            "allow_empty": self.allow_empty,
            "k_reg": k_reg if self.method == "raps" else None,
            "penalty": penalty if self.method == "raps" else None,
            "input": "logits" if is_logits else "probabilities",
            "num_samples": int(cal.numel()),
            "num_tune": int(tune.numel()),
            "tuned": tuned,
            "num_classes": int(z.shape[1]),
            "quantile_rank": check_enough_samples(int(cal.numel()), alpha),
            "q_hat": q_hat,
            "coverage": _metrics.coverage(sets, y[cal]),
            "mean_set_size": _metrics.set_size(sets),
            "calibrator": None
            if calibrator is None
            else {"kind": calibrator.kind, "fitted_on": "fitted on the tuning split" if any(t.startswith("fit the") for t in tuned) else "given fitted"},
            **({"lambda_set_sizes": tuning} if tuning else {}),
        }
        self._reset_stream()
        return self

    def _resolve_raps(self, probs: torch.Tensor, labels: torch.Tensor, alpha: float, generator: torch.Generator):
        """``(k_reg, lambda, {lambda: tuning set size})`` for RAPS (``"auto"`` chosen on the tuning rows), zeros otherwise."""
        if self.method != "raps":
            return 0, 0.0, None
        k_reg = choose_k_reg(probs, labels, alpha) if self.k_reg == AUTO else self.k_reg
        if self.penalty != AUTO:
            return k_reg, self.penalty, None
        u_calibrate = self._draws(probs.shape[0], generator, probs.device)
        u_predict = self._draws(probs.shape[0], generator, probs.device)
        penalty, sizes = choose_penalty(probs, labels, alpha, k_reg, u_calibrate, u_predict, allow_empty=self.allow_empty, grid=LAMBDA_GRID)
        return k_reg, penalty, {str(lam): size for lam, size in sizes.items()}

    # ------------------------------------------------------------------ predict
    def predict_sets(self, logits: Any, *, from_logits: bool | None = None, generator: torch.Generator | int | None = None):
        """The prediction sets of (N, K) logits (or probabilities) as an (N, K) boolean mask: numpy for numpy input,
        a torch tensor on the input's device for torch input.

        Randomised methods draw one uniform number per row from the predictor's stream (seeded by ``seed``, restarted
        by ``fit`` and ``from_pretrained``), so a sequence of calls is reproducible; ``generator`` (a
        ``torch.Generator`` or an int seed) draws from another instead.
        """
        self._check_fitted()
        if isinstance(logits, torch.Tensor) and logits.device.type != "cpu":
            return self._predict_sets(logits, from_logits, generator)
        with torch_single_threaded():  # see fit
            return self._predict_sets(logits, from_logits, generator)

    def _predict_sets(self, logits, from_logits, generator):
        probs = self._probabilities(logits, from_logits)
        if isinstance(generator, int) and not isinstance(generator, bool):
            generator = _generator(generator)
        elif generator is None:
            generator = self.__dict__["_predict_generator"]
        elif not isinstance(generator, torch.Generator):
            raise TypeError(f"Expected argument `generator` to be a torch.Generator, an int seed or None, but got {generator!r}.")
        scores = self._scores(probs, self._draws(probs.shape[0], generator, probs.device), **self._params())
        sets = sets_from_scores(scores, float(self.q_hat), allow_empty=self.allow_empty)
        return sets.cpu().numpy() if isinstance(logits, np.ndarray) else sets

    def draw_uniforms(self, n: int, *, generator: torch.Generator | int | None = None) -> torch.Tensor | None:
        """The (n,) float64 Uniform(0, 1) draws that ``predict_sets`` would use for its next ``n`` rows, taken from the
        predictor's stream (which they advance) or from ``generator``; None when the scores are not randomised. An
        exported graph (``hf_calibration.export_onnx``) takes them as its input ``u``."""
        self._check_fitted()
        n = check_int(n, "n", minimum=0)
        if isinstance(generator, int) and not isinstance(generator, bool):
            generator = _generator(generator)
        elif generator is None:
            generator = self.__dict__["_predict_generator"]
        elif not isinstance(generator, torch.Generator):
            raise TypeError(f"Expected argument `generator` to be a torch.Generator, an int seed or None, but got {generator!r}.")
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

    def attach(self, pipe: Any) -> Any:
        """Make an image-classification ``pipeline``'s results carry their prediction sets (see ``pipeline.py``): each
        row gets ``"in_set"``, and every class of the set is listed even beyond ``top_k``. Returns ``pipe``."""
        from .pipeline import attach

        return attach(self, pipe)

    def detach(self) -> Any:
        """Undo ``attach``: the pipeline returns its usual results again. Returns the pipeline."""
        from .pipeline import detach

        return detach(self)

    def extra_repr(self) -> str:
        info = self.fit_info_
        return f"method={self.method!r}, " + (f"alpha={info['alpha']}, q_hat={info['q_hat']:.6g}" if info else "not fitted")

    # ------------------------------------------------------------------ Hub
    def _save_pretrained(self, save_directory) -> None:
        from safetensors.torch import save_model

        from .. import __version__

        save_model(
            self,
            str(save_directory / hub.WEIGHTS_NAME),
            metadata={"format": "pt", "conformal": self.method, "format_version": str(FORMAT_VERSION)},
        )
        config = {
            **(self._hub_mixin_config or {}),
            "conformal": self.method,
            "format_version": FORMAT_VERSION,
            "hf_calibration_version": __version__,
            "fit": self.fit_info_,
        }
        (save_directory / hub.CONFIG_NAME).write_text(json.dumps(config, sort_keys=True, indent=2))

    def generate_model_card(self, *args, **kwargs):
        return super().generate_model_card(*args, **{**card_values(self), **kwargs})

    def save_pretrained(self, save_directory, *, overwrite: bool = False, **kwargs: Any):
        """Write ``model.safetensors`` (the threshold), ``config.json``, the model card ``README.md`` and, with a
        calibrator, its checkpoint in ``calibrator/``.

        The folder must be new or empty; ``overwrite=True`` replaces a predictor or calibrator saved there. A model's
        folder is refused even then: save the predictor in its ``conformal/`` subfolder. Other keyword arguments are
        ``PyTorchModelHubMixin.save_pretrained``'s.
        """
        self._check_fitted()
        if not isinstance(overwrite, bool):
            raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
        folder = Path(save_directory)
        held = check_save_folder(folder, overwrite=overwrite)
        sub = folder / CALIBRATOR_SUBFOLDER
        if self.calibrator is not None and sub.exists():  # checked before anything is written
            hub.check_save_folder(sub, overwrite=overwrite, what=f"the calibrator's folder {str(sub)!r}")
        if held == "conformal" and self.calibrator is None and sub.is_dir():  # the earlier predictor's calibrator
            hub.remove_owned_files(sub, tuple(hub.owned_files(sub)))  # only the files the package wrote there
            if not any(sub.iterdir()):
                sub.rmdir()
        # a predictor or a calibrator saved there is replaced whole, card included; a user's files are never touched
        out = hub.save_recorded(self, folder, lambda: super(ConformalPredictor, self).save_pretrained(folder, **kwargs),
                                overwrite=overwrite, card_kwargs=kwargs.get("model_card_kwargs"), subfolder="conformal")
        if self.calibrator is not None:
            self.calibrator.save_pretrained(sub, overwrite=overwrite)
        return out

    def push_to_hub(self, repo_id: str, *, path_in_repo: str | None = None, dry_run: bool = False, commit_message: str | None = None, **kwargs: Any) -> str:
        """Upload the predictor (and its calibrator) to the Hub repo ``repo_id``, e.g. ``path_in_repo="conformal"`` beside
        a model; returns the commit URL (``dry_run=True``: the local folder that would be uploaded). The other arguments
        (``private``, ``token``, ``branch``, ``create_pr``, ``model_card_kwargs``) and the errors are those of
        ``Calibrator.push_to_hub``."""
        self._check_fitted()
        return Calibrator.push_to_hub(
            self, repo_id, path_in_repo=path_in_repo, dry_run=dry_run, commit_message=commit_message or f"Upload {self.method} conformal predictor", **kwargs
        )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, subfolder: str | None = None, **kwargs: Any) -> "ConformalPredictor":
        """Load a saved predictor (and its calibrator) strictly from a local folder or a Hub repo.

        Args:
            pretrained_model_name_or_path: local folder or Hub repo id.
            subfolder: the predictor's folder inside it (e.g. ``"conformal"`` beside a model).
            **kwargs: ``revision``, ``cache_dir``, ``token``, ``local_files_only``, ``force_download``, ``map_location``.
        """
        folder, config, download = hub.open_checkpoint(pretrained_model_name_or_path, subfolder, kwargs, who="Conformal predictors")
        cls._check_config(config, folder)
        predictor = super().from_pretrained(folder, **kwargs)
        if config["fit"].get("calibrator"):
            local = Path(folder) / CALIBRATOR_SUBFOLDER
            if local.is_dir():
                calibrator = hub.load_calibrator(local, map_location=kwargs.get("map_location", "cpu"))
            else:  # a Hub repo: the calibrator's files are downloaded from its own subfolder
                nested = "/".join(p for p in ((subfolder or "").strip("/"), CALIBRATOR_SUBFOLDER) if p)
                calibrator = hub.load_calibrator(pretrained_model_name_or_path, subfolder=nested, **download)
            if calibrator.fit_info_.get("num_classes") not in (None, predictor.num_classes):
                raise ValueError(f"The calibrator saved with the predictor in {str(folder)!r} was fitted on another number of classes.")
            predictor.__dict__["calibrator_"] = calibrator
        return predictor

    @classmethod
    def _check_config(cls, config: dict, where) -> None:
        if config.get("conformal") not in METHODS:
            raise ValueError(
                f"Expected a ConformalPredictor checkpoint (config `conformal` in {list(METHODS)}) in {str(where)!r}, but its "
                f"config has conformal={config.get('conformal')!r}" + (" (it is a calibrator: use load_calibrator)." if "calibrator" in config else ".")
            )
        if config.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"Expected checkpoint format_version {FORMAT_VERSION}, but {str(where)!r} has {config.get('format_version')!r}: "
                "it was written by an incompatible version of hf_calibration."
            )
        fit = config.get("fit")
        if not isinstance(fit, dict) or not isinstance(fit.get("num_classes"), int) or fit["num_classes"] < 2:
            raise ValueError(f"The checkpoint in {str(where)!r} has no valid `fit` record in its config: it is corrupted or was never fitted.")

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision, cache_dir, force_download, local_files_only, token,
                         map_location: str = "cpu", strict: bool = True, config: dict | None = None, **model_kwargs):
        cls._check_config(config or {}, model_id)
        try:
            predictor = cls(**model_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"The checkpoint's config in {model_id!r} does not fit ConformalPredictor: {err}") from None
        metadata = hub.load_weights(predictor, model_id, what="conformal predictor", map_location=map_location)
        path = f"{model_id}/{hub.WEIGHTS_NAME}"
        if metadata.get("conformal") != predictor.method or not bool(torch.isfinite(predictor.q_hat)):
            raise ValueError(f"The weights in {path!r} do not belong to a fitted {predictor.method!r} ConformalPredictor.")
        predictor.fit_info_ = dict(config["fit"])
        predictor._reset_stream()
        predictor.eval()
        return predictor


def _probabilities(logits: Any, from_logits: bool | None, calibrator: Calibrator | None, num_classes: int | None = None) -> torch.Tensor:
    """Checked (N, K) input -> float64 probabilities on its device, through ``calibrator`` if there is one."""
    z = as_tensor(logits, "logits")
    if z.ndim != 2:
        raise ValueError(f"Expected `logits` to have shape (N, K) (rank 2), but got shape {tuple(z.shape)}.")
    if not z.is_floating_point():
        raise TypeError(f"Expected `logits` to be a floating array, but got {z.dtype}.")
    if num_classes is not None and z.shape[1] != num_classes:
        raise ValueError(f"Expected `logits` to have K = {num_classes} classes (the predictor was fitted on {num_classes}), but got K = {z.shape[1]}.")
    if z.shape[0] == 0:
        raise ValueError("Expected `logits` to hold at least one row, but got N = 0.")
    if not bool(torch.isfinite(z.sum())):  # one reduction; a NaN, an inf or an overflowing total lands here
        finite = torch.isfinite(z).all(dim=1)
        if not bool(finite.all()):
            raise ValueError(f"Expected `logits` to be finite, but row {int((~finite).nonzero()[0])} contains NaN or inf.")
    is_logits = resolve_from_logits(z, from_logits, "logits")
    if calibrator is not None:
        z, is_logits = calibrator(z, from_logits=is_logits), True
    if not is_logits:
        z = log_probabilities(z, torch.float64)
    return torch.softmax(z, dim=1, dtype=torch.float64)  # cast inside the kernel: no float64 copy of the logits


def check_save_folder(folder: str | Path, *, overwrite: bool, what: str = "argument `save_directory`",
                      overwrite_flag: str = "overwrite=True") -> str | None:
    """Check that a predictor may be saved in ``folder`` (the rules of ``hub.check_save_folder``, where a predictor
    saved there counts as ours); returns ``"conformal"`` or ``"calibrator"`` when one is there to replace, else None."""
    folder = Path(folder)
    if _predictor_config(folder) is None:
        return "calibrator" if hub.check_save_folder(folder, overwrite=overwrite, what=what, overwrite_flag=overwrite_flag, subfolder="conformal") else None
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
