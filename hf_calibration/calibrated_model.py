"""A model that loads with its calibrator: ``load_calibrated_model("me/vit")`` and ``pipeline(..., model="me/vit")``.

A model's folder or Hub repo may hold, beside the model's own files, a calibrator in ``calibrator/`` (what
``calibrator.save_pretrained(folder / "calibrator")``, ``push_to_hub(..., path_in_repo="calibrator")`` and
``CalibrationTrainer(calibrate_on_eval=...)`` write) and a conformal predictor in ``conformal/``
(``hf_calibration.conformal.ConformalPredictor``). One call loads the model (through the Auto classes, as
``hf_calibration.model_loading`` does: timm and MaC-Cal checkpoints included), then what those subfolders hold:

* the calibrator is attached to the model (``calibrators.attach``): ``model(...).logits`` and every pipeline score
  are calibrated; ``attached_calibrator(model)`` returns it;
* the conformal predictor is kept as ``model.conformal_predictor`` (a plain attribute: not a submodule, not in the
  model's ``state_dict``), and :func:`pipeline` attaches it to the pipeline, whose results then carry prediction sets.

A folder or repo without ``calibrator/`` loads the plain model and says so once (a warning per source and process).
The subfolders are invisible to transformers: with transformers alone, ``AutoModelForImageClassification`` and
``transformers.pipeline`` load the same repo as the plain model.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any

from torch import nn

from . import hub
from .model_loading import _HUB_KWARGS, _load_model, load_image_processor

__all__ = ["CALIBRATOR_FOLDER", "CONFORMAL_FOLDER", "load_calibrated_model", "pipeline"]

logger = logging.getLogger(__name__)

CALIBRATOR_FOLDER = "calibrator"
CONFORMAL_FOLDER = "conformal"
_CONFORMAL_MODULE = "hf_calibration.conformal"  # ConformalPredictor: from_pretrained(path), attach(pipeline)
_TASK = "image-classification"

_told: set[tuple[str, str]] = set()  # (source, what) already said once in this process


def _say_once(source: str, what: str, level: int, message: str, *args: Any) -> None:
    if (source, what) not in _told:
        _told.add((source, what))
        logger.log(level, message, *args)


def _check_source(name_or_path: Any) -> str:
    if isinstance(name_or_path, os.PathLike):
        return os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise TypeError(f"Expected argument `model` to be a folder or a Hub repo id, but got {name_or_path!r}.")
    return name_or_path


def _companion_root(source: str, revision: str | None, download: dict[str, Any]) -> Path | None:
    """The local folder where ``calibrator/`` and ``conformal/`` would be: the model's folder, or the Hub repo's
    snapshot with those two subfolders fetched (the model's files are already in the same snapshot). None when the
    Hub cannot give it (a warning says so)."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = [f"{CALIBRATOR_FOLDER}/*", f"{CONFORMAL_FOLDER}/*"]
    try:
        return Path(snapshot_download(repo_id=source, revision=revision, allow_patterns=patterns, **download))
    except LocalEntryNotFoundError:
        reason = "not cached, Hub unreachable"
    except Exception as err:  # noqa: BLE001 - only an unreachable Hub is a reason to go on without the calibrator
        reason = hub.unreachable_reason(err)
        if reason is None:
            raise
    _say_once(source, "unreachable", logging.WARNING,
              "Could not look for %s/ in %s (%s): loaded the plain, uncalibrated model.", CALIBRATOR_FOLDER, source, reason)
    return None


def _load_conformal(folder: Path, source: str):
    try:
        module = importlib.import_module(_CONFORMAL_MODULE)
    except ImportError:
        _say_once(source, "conformal", logging.WARNING,
                  "%s holds a %s/ predictor, but this hf_calibration has no %s module: prediction sets are not attached "
                  "(upgrade hf-calibration).", source, CONFORMAL_FOLDER, _CONFORMAL_MODULE)
        return None
    load = getattr(module, "load_conformal_predictor", None) or module.ConformalPredictor.from_pretrained  # any kind: THR / APS / RAPS, CRC
    return load(str(folder))


def _load_companions(source: str, revision: str | None, download: dict[str, Any]) -> tuple[Any, Any]:
    """``(calibrator or None, conformal predictor or None)`` from ``source``'s subfolders; says once what is missing."""
    root = _companion_root(source, revision, download)
    if root is None:
        return None, None
    calibrator_dir, conformal_dir = root / CALIBRATOR_FOLDER, root / CONFORMAL_FOLDER
    calibrator = hub.load_calibrator(calibrator_dir) if (calibrator_dir / hub.CONFIG_NAME).is_file() else None
    conformal = _load_conformal(conformal_dir, source) if conformal_dir.is_dir() and any(conformal_dir.iterdir()) else None
    if calibrator is None:
        _say_once(source, "calibrator", logging.WARNING,
                  "%s has no %s/ folder: loaded the plain, uncalibrated model (save a fitted calibrator in %s/ beside "
                  "the model to load it calibrated).", source, CALIBRATOR_FOLDER, CALIBRATOR_FOLDER)
    else:
        logger.info("%s: attached the %s calibrator from %s/", source, calibrator.kind, CALIBRATOR_FOLDER)
    return calibrator, conformal


def load_calibrated_model(name_or_path: str | os.PathLike, *, revision: str | None = None, **kwargs: Any) -> nn.Module:
    """The model of a folder or Hub repo, its calibrator (``calibrator/``) attached, its conformal predictor
    (``conformal/``) as ``model.conformal_predictor``; in eval mode.

    Args:
        name_or_path: a local folder or a Hub repo id.
        revision: the Hub revision (branch, tag or commit), for the model and its subfolders alike.
        **kwargs: passed to ``from_pretrained`` (``dtype``, ``cache_dir``, ``token``, ``local_files_only``, ...);
            the download options also fetch the subfolders.

    Without ``calibrator/`` the plain model is returned, and a warning says so (once per source and process).

    Example::

        model = load_calibrated_model("me/vit")        # model(...).logits are calibrated
        attached_calibrator(model)                     # the calibrator (hf_calibration.calibrators.attach)
    """
    source = _check_source(name_or_path)
    model = _load_model(source, revision, **kwargs).eval()
    calibrator, conformal = _load_companions(source, revision, {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    if calibrator is not None:
        calibrator.attach(model)
    model.__dict__["conformal_predictor"] = conformal  # plain attribute: not a submodule, never saved with the model
    return model


def pipeline(
    task: str = _TASK,
    model: str | os.PathLike | None = None,
    *,
    image_processor: Any = None,
    revision: str | None = None,
    token: str | bool | None = None,
    model_kwargs: dict[str, Any] | None = None,
    **pipeline_kwargs: Any,
):
    """``transformers.pipeline("image-classification", model=...)`` whose scores are calibrated by the repo's
    ``calibrator/`` and whose results carry the prediction sets of its ``conformal/`` predictor.

    Args:
        task: ``"image-classification"`` (the only task a calibrator of class scores applies to).
        model: a local folder or a Hub repo id (loaded by :func:`load_calibrated_model`).
        image_processor: an image processor, or a folder / Hub id; default: the model's own.
        revision, token: for the model, its subfolders and its image processor.
        model_kwargs: passed to the model's ``from_pretrained`` (``dtype``, ``cache_dir``, ...).
        **pipeline_kwargs: passed to ``transformers.pipeline`` (``device``, ``top_k``, ``batch_size``, ...). The scores'
            ``function_to_apply`` follows the model's head (``config.problem_type``, :mod:`hf_calibration.tasks`):
            ``"sigmoid"`` for a multi-label or one-logit binary head (each label's calibrated probability),
            ``"softmax"`` otherwise, unless given here.

    Example::

        classify = hf_calibration.pipeline("image-classification", model="me/vit")
        classify(image)          # calibrated scores (and the prediction set, with conformal/)
    """
    import transformers

    if task != _TASK:
        raise ValueError(f"Expected argument `task` to be {_TASK!r} (calibrators act on class scores), but got {task!r}.")
    source = _check_source(model)
    model_kwargs = dict(model_kwargs or {})
    if token is not None:
        model_kwargs["token"] = token
    loaded = load_calibrated_model(source, revision=revision, **model_kwargs)
    if image_processor is None or isinstance(image_processor, (str, os.PathLike)):
        processor_kwargs = {k: model_kwargs[k] for k in _HUB_KWARGS if k in model_kwargs}
        image_processor = load_image_processor(source if image_processor is None else image_processor, revision, **processor_kwargs)
    if "function_to_apply" not in pipeline_kwargs:
        # the scores' activation follows the head (hf_calibration.tasks): a sigmoid per label for a multi-label or
        # one-logit binary head, a softmax otherwise; said explicitly rather than left to the pipeline's own guess
        from .tasks import head_of, task_of_model

        pipeline_kwargs["function_to_apply"] = head_of(task_of_model(loaded) or "multiclass")
    pipe = transformers.pipeline(_TASK, model=loaded, image_processor=image_processor, **pipeline_kwargs)
    conformal = loaded.__dict__.get("conformal_predictor")
    if conformal is not None:
        conformal.attach(pipe)
    return pipe
