"""A model that loads with its calibrator: ``load_calibrated_model("me/vit")`` and ``pipeline(..., model="me/vit")``.

A model's folder or Hub repo may hold, beside the model's own files, a calibrator in ``calibrator/`` (what
``calibrator.save_pretrained(folder / "calibrator")``, ``push_to_hub(..., path_in_repo="calibrator")`` and
``CalibrationTrainer(calibrate_on_eval=...)`` write) and a conformal predictor in ``conformal/``
(``hf_calibration.conformal.ConformalPredictor``). One call loads the model (through the Auto classes, as
``hf_calibration.io.model_loading`` does: timm and MaC-Cal checkpoints included), then what those subfolders hold:

* the calibrator is attached to the model (``calibrators.attach``): ``model(...).logits`` and every pipeline score
  are calibrated; ``attached_calibrator(model)`` returns it;
* the conformal predictor is kept as ``model.conformal_predictor`` (a plain attribute: not a submodule, not in the
  model's ``state_dict``), and :func:`pipeline` attaches it to the pipeline, whose results then carry prediction sets.
  One fitted on other scores than the calibrator serves (by the fingerprint its fit recorded,
  ``hf_calibration.conformal.agreement``) is refused with a ``ValueError`` saying to refit it.

A detector (``AutoModelForObjectDetection``: DETR, YOLOS, ...) or a semantic segmenter
(``AutoModelForSemanticSegmentation``: SegFormer, ...) loads the same way, its ``calibrator/`` holding a detection
calibrator, ``LocalTemperatureScaling`` or a calibrator fitted on pixel rows; :func:`pipeline` then serves
transformers' object-detection / image-segmentation output with calibrated scores (and calibrated probability maps):
:mod:`hf_calibration.serving.detection` says how, and where the threshold applies.

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

from hf_calibration._core import checkpoints as hub
from hf_calibration._core.checks import check_folder_or_hub_id
from hf_calibration._core.tasks import DENSE_TASKS, check_pipeline_task, dense_task_of_config, resolve_pipeline_task
from hf_calibration.calibrators import load_calibrator
from hf_calibration.io.model_loading import _HUB_KWARGS, _load_model, load_image_processor, load_processor

__all__ = ["CALIBRATOR_FOLDER", "CONFORMAL_FOLDER", "load_calibrated_model", "pipeline"]

logger = logging.getLogger(__name__)

CALIBRATOR_FOLDER = "calibrator"
CONFORMAL_FOLDER = "conformal"
_CONFORMAL_MODULE = "hf_calibration.conformal"  # ConformalPredictor: from_pretrained(path), attach(pipeline)

_told: set[tuple[str, str]] = set()  # (source, what) already said once in this process
_DENSE_TASK = "hf_calibration_task"  # a loaded detector's / segmenter's pipeline task (a plain attribute of the model)


def _say_once(source: str, what: str, level: int, message: str, *args: Any) -> None:
    if (source, what) not in _told:
        _told.add((source, what))
        logger.log(level, message, *args)


def _check_source(name_or_path: Any) -> str:
    """A model folder or a Hub repo id; a file, or a path to no folder, is refused here (not deep in transformers)."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    elif not isinstance(name_or_path, str) or not name_or_path.strip():
        raise TypeError(f"Expected argument `model` to be a folder or a Hub repo id, but got {name_or_path!r}.")
    check_folder_or_hub_id(name_or_path, "model")
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
    _say_once(
        source,
        "unreachable",
        logging.WARNING,
        "Could not look for %s/ in %s (%s): loaded the plain, uncalibrated model.",
        CALIBRATOR_FOLDER,
        source,
        reason,
    )
    return None


def _load_conformal(folder: Path, source: str):
    try:
        module = importlib.import_module(_CONFORMAL_MODULE)
    except ImportError:
        _say_once(
            source,
            "conformal",
            logging.WARNING,
            "%s holds a %s/ predictor, but this hf_calibration has no %s module: prediction sets are not attached "
            "(upgrade hf-calibration).",
            source,
            CONFORMAL_FOLDER,
            _CONFORMAL_MODULE,
        )
        return None
    load = (
        getattr(module, "load_conformal_predictor", None) or module.ConformalPredictor.from_pretrained
    )  # any kind: THR / APS / RAPS, CRC
    return load(str(folder))


def _companion_folder(root: Path, name: str) -> Path | None:
    """``root / name`` when it holds something to load; None when absent or empty; a file there is refused."""
    folder = root / name
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"Expected {str(folder)!r} to be a folder holding a saved {name} (or nothing there), but it is a file."
        )
    return folder if folder.is_dir() and any(folder.iterdir()) else None


def _check_classes(what: Any, folder: Path, num_classes: int | None, source: str) -> None:
    info = getattr(what, "fit_info_", None) or {}
    method = getattr(what, "method", None)
    fitted = info.get("num_labels") if method == "crc" else info.get("num_classes")  # a multi-label predictor: labels
    # a conformal predictor of a binary head's one logit holds sets of its two classes
    one_logit = num_classes == 1 and fitted == 2 and method in ("thr", "aps", "raps")
    if num_classes is not None and fitted is not None and fitted != num_classes and not one_logit:
        raise ValueError(
            f"The {type(what).__name__} in {str(folder)!r} was fitted on K = {fitted} classes, but the model in "
            f"{source!r} has {num_classes} (config.num_labels): it belongs to another model."
        )


def _load_companions(
    source: str, revision: str | None, download: dict[str, Any], num_classes: int | None = None
) -> tuple[Any, Any]:
    """``(calibrator or None, conformal predictor or None)`` from ``source``'s subfolders, each checked against the
    model's ``num_classes``; says once what is missing. A subfolder that is a file, or holds files but no checkpoint,
    raises ``ValueError`` naming it."""
    root = _companion_root(source, revision, download)
    if root is None:
        return None, None
    calibrator_dir, conformal_dir = (
        _companion_folder(root, CALIBRATOR_FOLDER),
        _companion_folder(root, CONFORMAL_FOLDER),
    )
    calibrator = load_calibrator(calibrator_dir) if calibrator_dir is not None else None
    conformal = _load_conformal(conformal_dir, source) if conformal_dir is not None else None
    if calibrator is None:
        _say_once(
            source,
            "calibrator",
            logging.WARNING,
            "%s has no %s/ folder (or an empty one): loaded the plain, uncalibrated model (save a fitted calibrator in "
            "%s/ beside the model to load it calibrated).",
            source,
            CALIBRATOR_FOLDER,
            CALIBRATOR_FOLDER,
        )
    else:
        _check_classes(calibrator, calibrator_dir, num_classes, source)
        logger.info("%s: attached the %s calibrator from %s/", source, calibrator.kind, CALIBRATOR_FOLDER)
    if conformal is not None:
        _check_classes(conformal, conformal_dir, num_classes, source)
        _check_sets_match_scores(conformal, calibrator, conformal_dir, source)
    return calibrator, conformal


def _check_sets_match_scores(conformal: Any, calibrator: Any, folder: Path, source: str) -> None:
    """Refuse ``conformal/`` fitted on other scores than ``calibrator/`` serves (``conformal.agreement``); a predictor
    saved before it recorded them, whose calibrator differs, gets one warning per source and process instead."""
    if not hasattr(conformal, "fit_info_"):  # not one of hf_calibration.conformal's predictors: nothing recorded
        return
    from hf_calibration.conformal.agreement import check_sets_match_scores

    if check_sets_match_scores(conformal, calibrator, f"{str(folder)!r}"):
        return
    conformal.__dict__["_scores_warned"] = True  # said here: the pipeline it is attached to does not say it again
    _say_once(
        source,
        "sets-scores",
        logging.WARNING,
        "%s: the conformal predictor in %s/ was saved before predictors recorded the scores they were fitted on, and "
        "its calibrator is not the one in %s/: the served scores are calibrated, its sets are not computed from them. "
        "Refit it behind %s/ (ConformalPredictor(...).fit(logits, labels, calibrator=...)) and save it again.",
        source,
        CONFORMAL_FOLDER,
        CALIBRATOR_FOLDER,
        CALIBRATOR_FOLDER,
    )


def _dense_task(source: str, task: str | None, revision: str | None, kwargs: dict[str, Any]) -> str | None:
    """``"object-detection"`` / ``"image-segmentation"`` when ``source`` holds a detector / semantic segmenter (its
    config), None for a classifier; a ``task`` that contradicts the config is a ``ValueError``."""
    if task is not None and task not in DENSE_TASKS:
        check_pipeline_task(task)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, revision=revision, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    found = dense_task_of_config(config)
    if (task in DENSE_TASKS or found is not None) and task is not None and task != found:
        raise ValueError(
            f"Expected argument `task` to agree with the model's config, but got task={task!r} for a "
            f"{found or 'classification'} model (config.architectures={getattr(config, 'architectures', None)!r})."
        )
    return found


def _load_dense(source: str, task: str, revision: str | None, **kwargs: Any) -> nn.Module:
    """The detector / segmenter of ``source`` through its Auto class, serving the calibrator of its ``calibrator/``."""
    import transformers

    from hf_calibration.serving.detection import load_dense_calibrator, serve_calibrator  # the detection machinery

    model = getattr(transformers, DENSE_TASKS[task][0]).from_pretrained(source, revision=revision, **kwargs).eval()
    model.__dict__[_DENSE_TASK] = task
    root = _companion_root(source, revision, {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    folder = _companion_folder(root, CALIBRATOR_FOLDER) if root is not None else None
    if folder is None:
        _say_once(
            source,
            "calibrator",
            logging.WARNING,
            "%s has no %s/ folder (or an empty one): loaded the plain, uncalibrated %s model.",
            source,
            CALIBRATOR_FOLDER,
            task,
        )
        return model
    calibrator = load_dense_calibrator(folder)
    logger.info("%s: serving the %s calibrator from %s/", source, type(calibrator).__name__, CALIBRATOR_FOLDER)
    return serve_calibrator(model, calibrator, task)


def load_calibrated_model(
    name_or_path: str | os.PathLike, *, task: str | None = None, revision: str | None = None, **kwargs: Any
) -> nn.Module:
    """The model of a folder or Hub repo, its calibrator (``calibrator/``) attached, its conformal predictor
    (``conformal/``) as ``model.conformal_predictor``; in eval mode.

    Args:
        name_or_path: a local folder or a Hub repo id.
        task: the pipeline task, which picks the Auto class: ``None`` (default) reads it from the model's config
            (``architectures``: ``BertForSequenceClassification`` is ``"text-classification"``,
            ``Wav2Vec2ForSequenceClassification`` ``"audio-classification"``, ...; :mod:`hf_calibration._core.tasks`);
            ``"image-classification"``, ``"text-classification"``, ``"audio-classification"`` or
            ``"video-classification"`` only where the config names none; ``"object-detection"`` /
            ``"image-segmentation"`` for a detector / semantic segmenter (read from its config too). One that
            contradicts the config is a ``ValueError``.
        revision: the Hub revision (branch, tag or commit), for the model and its subfolders alike.
        **kwargs: passed to ``from_pretrained`` (``dtype``, ``cache_dir``, ``token``, ``local_files_only``, ...);
            the download options also fetch the subfolders.

    Without ``calibrator/`` the plain model is returned, and a warning says so (once per source and process).

    Example::

        model = load_calibrated_model("me/vit")        # model(...).logits are calibrated
        attached_calibrator(model)                     # the calibrator (hf_calibration.calibrators.attach)
    """
    source = _check_source(name_or_path)
    dense = _dense_task(source, task, revision, kwargs)
    if dense is not None:
        return _load_dense(source, dense, revision, **kwargs)
    if task is not None:
        check_pipeline_task(task)
    model = _load_model(source, revision, task, **kwargs).eval()
    num_classes = getattr(getattr(model, "config", None), "num_labels", None)
    calibrator, conformal = _load_companions(
        source,
        revision,
        {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs},
        num_classes if isinstance(num_classes, int) else None,
    )
    if calibrator is not None:
        calibrator.attach(model)
    model.__dict__["conformal_predictor"] = conformal  # plain attribute: not a submodule, never saved with the model
    return model


def pipeline(
    task: str | None = None,
    model: str | os.PathLike | None = None,
    *,
    image_processor: Any = None,
    tokenizer: Any = None,
    feature_extractor: Any = None,
    video_processor: Any = None,
    revision: str | None = None,
    token: str | bool | None = None,
    model_kwargs: dict[str, Any] | None = None,
    conformal_draws: str = "input",
    **pipeline_kwargs: Any,
):
    """``transformers.pipeline(task, model=...)`` whose scores are calibrated by the repo's ``calibrator/`` and whose
    results carry the prediction sets of its ``conformal/`` predictor.

    Args:
        task: a classification pipeline: ``"image-classification"``, ``"text-classification"``,
            ``"audio-classification"`` or ``"video-classification"`` (the calibrators act on any classifier's logits);
            or ``"object-detection"`` / ``"image-segmentation"`` (calibrated scores and probability maps:
            :mod:`hf_calibration.serving.detection`); ``None`` (default) reads it from the model's config, as
            :func:`load_calibrated_model` does. One that contradicts the config is a ``ValueError``.
        model: a local folder or a Hub repo id (loaded by :func:`load_calibrated_model`).
        image_processor, tokenizer, feature_extractor, video_processor: the task's preprocessor (an object, or a
            folder / Hub id); default: the model's own (the image processor, tokenizer, feature extractor or video
            processor saved with it).
        revision, token: for the model, its subfolders and its preprocessor.
        model_kwargs: passed to the model's ``from_pretrained`` (``dtype``, ``cache_dir``, ...).
        conformal_draws: with a randomised ``conformal/`` predictor (APS / RAPS), where each input's uniform draw comes
            from: ``"input"`` (default: derived from the preprocessed input, its pixel values, token ids or audio
            features, so the same input gets the same set on every call, alone or in a batch) or ``"stream"`` (the
            predictor's random stream: a new draw per input and call). See ``ConformalPredictor.attach``.
        **pipeline_kwargs: passed to ``transformers.pipeline`` (``device``, ``top_k``, ``batch_size``, ...). The scores'
            ``function_to_apply`` follows the model's head (``config.problem_type``, :mod:`hf_calibration._core.tasks`):
            ``"sigmoid"`` for a multi-label or one-logit binary head (each label's calibrated probability),
            ``"softmax"`` otherwise, unless given here.

    Example::

        classify = hf_calibration.pipeline("image-classification", model="me/vit")
        classify(image)          # calibrated scores (and the prediction set, with conformal/)
        hf_calibration.pipeline(model="me/bert-sentiment")("a fine film")   # the task read from the config
    """
    import transformers

    if task is not None and task not in DENSE_TASKS:
        check_pipeline_task(task)
    if conformal_draws not in ("input", "stream"):
        raise ValueError(f"Expected argument `conformal_draws` to be 'input' or 'stream', but got {conformal_draws!r}.")
    source = _check_source(model)
    model_kwargs = dict(model_kwargs or {})
    if token is not None:
        model_kwargs["token"] = token
    loaded = load_calibrated_model(source, task=task, revision=revision, **model_kwargs)
    processor_kwargs = {k: model_kwargs[k] for k in _HUB_KWARGS if k in model_kwargs}
    dense = loaded.__dict__.get(_DENSE_TASK)
    if dense is not None:  # a detector or segmenter: transformers' pipeline with a calibrated postprocess
        from hf_calibration.serving.detection import calibrated_pipeline_class

        if image_processor is None or isinstance(image_processor, (str, os.PathLike)):
            image_processor = load_image_processor(image_processor or source, revision, **processor_kwargs)
        return transformers.pipeline(
            dense,
            model=loaded,
            image_processor=image_processor,
            pipeline_class=calibrated_pipeline_class(dense),
            **pipeline_kwargs,
        )
    task = resolve_pipeline_task(task, getattr(loaded, "config", None))
    given = {
        "image_processor": image_processor,
        "tokenizer": tokenizer,
        "feature_extractor": feature_extractor,
        "video_processor": video_processor,
    }
    preprocessors = {}
    for argument, value in given.items():  # a folder or Hub id is loaded as the task's preprocessor, an object kept
        if isinstance(value, (str, os.PathLike)):
            preprocessors.update([load_processor(task, value, revision, **processor_kwargs)])
        elif value is not None:
            preprocessors[argument] = value
    if not preprocessors:  # the model's own, with an error that says which argument to pass when it has none
        preprocessors.update([load_processor(task, source, revision, **processor_kwargs)])
    if "function_to_apply" not in pipeline_kwargs:
        # the scores' activation follows the head (hf_calibration._core.tasks): a sigmoid per label for a multi-label or
        # one-logit binary head, a softmax otherwise; said explicitly rather than left to the pipeline's own guess
        from hf_calibration._core.tasks import head_of, task_of_model

        pipeline_kwargs["function_to_apply"] = head_of(task_of_model(loaded) or "multiclass")
    pipe = transformers.pipeline(task, model=loaded, **preprocessors, **pipeline_kwargs)
    conformal = loaded.__dict__.get("conformal_predictor")
    if conformal is not None:
        conformal.attach(pipe, draws=conformal_draws)
    return pipe
