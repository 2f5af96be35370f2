"""Which kind of classifier head: multi-class (softmax), binary or multi-label (sigmoid). One rule, asked everywhere.

transformers names the kind in ``config.problem_type`` and its own loss follows it:

* ``"single_label_classification"``: one softmax over ``num_labels >= 2`` classes → ``"multiclass"``;
* ``"multi_label_classification"``: an independent sigmoid per label → ``"multilabel"``, or ``"binary"`` with
  ``num_labels == 1`` (one logit, its sigmoid the probability of the positive class);
* ``None`` with ``num_labels >= 2``: the loss picks single-label for integer labels and the pipeline applies a
  softmax → ``"multiclass"``;
* ``None`` with ``num_labels == 1`` and ``"regression"``: a regression head (transformers' loss is the mean squared
  error) → refused: a one-logit binary classifier says ``problem_type="multi_label_classification"``, or the caller
  passes ``task="binary"``.

Without a model the data decides: ``(N, L)`` 0/1 labels are multi-label, a 1-D or ``(N, 1)`` logit column is binary,
anything else multi-class. An explicit ``task=`` wins over both (and is checked against the data's shape).

A binary problem has two spellings of its head: one logit (a sigmoid) or two softmax logits, whose log-odds is
``z_1 - z_0``. Binary metrics and calibrators accept both (``task="binary"`` with ``(N, 2)`` logits), so a model of
either spelling gives the same calibrated probabilities.

The pipeline task of a model is asked here too: the classification tasks (``CLASSIFICATION_TASKS``,
``pipeline_task_of_config``) and the dense-prediction ones, object detection and semantic segmentation
(``DENSE_TASKS``, ``dense_task_of_config``).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "CLASSIFICATION_TASKS",
    "DENSE_TASKS",
    "SEGMENTATION_TASK",
    "HEADS",
    "IMAGE_TASK",
    "SIGMOID_TASKS",
    "TASKS",
    "Task",
    "check_task",
    "compatible_head",
    "check_pipeline_task",
    "dense_task_of_config",
    "dense_task_of_folder",
    "head_of",
    "pipeline_task_of_config",
    "pipeline_task_of_folder",
    "resolve_pipeline_task",
    "resolve_task",
    "task_of_config",
    "task_of_model",
]

Task = Literal["multiclass", "binary", "multilabel"]
TASKS: tuple[str, ...] = ("multiclass", "binary", "multilabel")
SIGMOID_TASKS: tuple[str, ...] = ("binary", "multilabel")
HEADS = {
    "multiclass": "softmax",
    "binary": "sigmoid",
    "multilabel": "sigmoid",
}  # the activation each task's scores take

_PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
_WAY_FORWARD = (
    "a one-logit binary classifier is config.problem_type='multi_label_classification' with num_labels=1; "
    "or pass task='binary' (or 'multiclass' / 'multilabel') explicitly"
)


def check_task(task: Any, name: str = "task") -> str:
    """``task`` as one of :data:`TASKS` (``ValueError`` naming the argument otherwise)."""
    if task not in TASKS:
        raise ValueError(
            f"Expected argument `{name}` to be one of {list(TASKS)} (or None: decided by the model's "
            f"config.problem_type or by the data), but got {task!r}."
        )
    return task


def head_of(task: str) -> str:
    """``"softmax"`` for multi-class, ``"sigmoid"`` for binary and multi-label."""
    return HEADS[check_task(task)]


def _config_of(model: Any) -> Any:
    """``model.config``, or the config of the model a transformers ``Pipeline`` runs; None when there is none."""
    config = getattr(model, "config", None)
    if config is None and getattr(model, "model", None) is not None:
        config = getattr(model.model, "config", None)
    return config


def task_of_config(config: Any) -> str | None:
    """The task a transformers config's ``problem_type`` and ``num_labels`` name (module docstring); None when the
    config names neither. A regression head, or one logit without a problem type, is a ``ValueError`` that names
    ``problem_type`` and the way forward."""
    if config is None:
        return None
    problem_type = getattr(config, "problem_type", None)
    num_labels = getattr(config, "num_labels", None)
    if isinstance(problem_type, str) and problem_type not in _PROBLEM_TYPES:
        raise ValueError(
            f"Expected the model's config.problem_type to be one of {list(_PROBLEM_TYPES)} or None, but got "
            f"{problem_type!r}; pass task= explicitly."
        )
    if problem_type == "regression":
        raise ValueError(
            "The model's config.problem_type is 'regression': its outputs are not class scores, and there is no "
            "probability to calibrate. For a classifier, set config.problem_type to "
            "'single_label_classification' or 'multi_label_classification', or pass task= explicitly."
        )
    if problem_type == "multi_label_classification":
        return "binary" if num_labels == 1 else "multilabel"
    if not isinstance(num_labels, int):
        return "multiclass" if problem_type == "single_label_classification" else None
    if num_labels == 1:
        if problem_type == "single_label_classification":
            raise ValueError(
                "The model's config has problem_type='single_label_classification' with num_labels=1: a softmax "
                f"over one logit is always 1. {_WAY_FORWARD[0].upper() + _WAY_FORWARD[1:]}."
            )
        raise ValueError(
            "The model's config has num_labels=1 and problem_type=None, which transformers trains as regression "
            f"(mean squared error), not as a classifier: {_WAY_FORWARD}."
        )
    return "multiclass"


def task_of_model(model: Any) -> str | None:
    """The task of a transformers model (or pipeline) by its config (:func:`task_of_config`); None for a model without
    one (a bare timm or torch module)."""
    return task_of_config(_config_of(model))


def _shape(x: Any) -> tuple[int, ...] | None:
    shape = getattr(x, "shape", None)
    if shape is None and isinstance(x, (list, tuple)):
        import numpy as np

        try:
            shape = np.shape(x)
        except ValueError:  # ragged: the validation later words it
            return None
    return None if shape is None else tuple(int(s) for s in shape)


def task_of_data(preds: Any = None, target: Any = None) -> str:
    """The task the arrays' shapes name: ``(N, L)`` targets → multi-label (binary when ``L == 1`` and the scores are one
    column); 1-D or ``(N, 1)`` scores → binary; otherwise multi-class."""
    ps, ts = _shape(preds), _shape(target)
    if ts is not None and len(ts) == 2:
        if ts[1] == 1 and ps is not None and len(ps) == 2 and ps[1] > 1:
            return "multiclass"  # (N, K) scores with an (N, 1) column of labels: class indices of the wrong rank
        one_column = ts[1] == 1 and (ps is None or len(ps) == 1 or (len(ps) == 2 and ps[1] == 1))
        return "binary" if one_column else "multilabel"
    if ps is not None and (len(ps) == 1 or (len(ps) == 2 and ps[1] == 1)):
        return "binary"
    return "multiclass"


def resolve_task(task: str | None = None, *, model: Any = None, preds: Any = None, target: Any = None) -> str:
    """The one answer to "which kind of head is this?": ``"multiclass"``, ``"binary"`` or ``"multilabel"``.

    Args:
        task: an explicit answer; it wins (checked against the data's shape when data is given).
        model: a transformers model or pipeline: its ``config.problem_type`` / ``num_labels`` decide
            (:func:`task_of_config`; a regression head or one logit without a problem type raise ``ValueError``).
        preds, target: the scores and labels, whose shapes decide when there is no model (:func:`task_of_data`).

    Example:
        >>> import numpy as np
        >>> resolve_task(preds=np.zeros((4, 3)), target=np.array([[0, 1, 1]] * 4))
        'multilabel'
        >>> resolve_task(preds=np.zeros(4), target=np.array([0, 1, 1, 0]))
        'binary'
        >>> resolve_task(preds=np.zeros((4, 3)), target=np.array([0, 2, 1, 0]))
        'multiclass'
    """
    if task is not None:
        task = check_task(task)
        if preds is not None or target is not None:
            check_shapes_for_task(task, preds, target)
        return task
    if model is not None:
        found = task_of_model(model)
        if found is not None:
            if preds is not None or target is not None:
                check_shapes_for_task(found, preds, target, from_model=True)
            return found
    return task_of_data(preds, target)


def check_shapes_for_task(task: str, preds: Any = None, target: Any = None, *, from_model: bool = False) -> None:
    """Raise a ``ValueError`` naming ``task`` (or the model's ``problem_type``) when the arrays cannot be of that task."""
    ps, ts = _shape(preds), _shape(target)
    source = "the model's config.problem_type" if from_model else "argument `task`"
    if task == "multiclass":
        if ts is not None and len(ts) == 2 and ts[1] > 1:
            raise ValueError(
                f"Expected `target` to have shape (N,) of class indices for a multi-class (softmax) head, but got shape {ts}: "
                f"(N, L) 0/1 labels are multi-label. {source} says 'multiclass'; pass task='multilabel' (or set "
                "config.problem_type='multi_label_classification') if each image may carry several labels."
            )
        if ps is not None and (len(ps) == 1 or (len(ps) == 2 and ps[1] == 1)):
            raise ValueError(
                f"Expected `preds` to have shape (N, K) with K >= 2 for a multi-class head, but got shape {ps}: "
                f"one logit per sample is a binary head; pass task='binary'."
            )
    elif task == "binary":
        if ps is not None and len(ps) == 2 and ps[1] > 2:
            raise ValueError(
                f"Expected `preds` to have shape (N,), (N, 1) or (N, 2) for a binary head ({source}), but got "
                f"shape {ps}: pass task='multiclass' or task='multilabel'."
            )
        if ts is not None and len(ts) == 2 and ts[1] != 1:
            raise ValueError(
                f"Expected `target` to have shape (N,) of 0/1 labels for a binary head ({source}), but got "
                f"shape {ts}: (N, L) labels are multi-label; pass task='multilabel'."
            )
    elif task == "multilabel":
        if ts is not None and len(ts) != 2:
            raise ValueError(
                f"Expected `target` to have shape (N, L) of 0/1 labels (multi-hot) for a multi-label head ({source}), but got "
                f"shape {ts}: integer class indices of shape (N,) are multi-class; pass task='multiclass'."
            )
        if ps is not None and len(ps) != 2:
            raise ValueError(
                f"Expected `preds` to have shape (N, L) for a multi-label head ({source}), but got shape {ps}."
            )


def compatible_head(
    calibrator_task: str, model: Any, *, num_labels: int | None = None, what: str = "calibrator"
) -> None:
    """Refuse, with a ``ValueError`` naming ``problem_type``, a ``what`` fitted for ``calibrator_task`` on a model whose
    head is of another kind: a softmax map on a sigmoid head (or the reverse) would give silently wrong scores.

    A binary (sigmoid) calibrator fits a two-logit softmax head too (its log-odds ``z_1 - z_0``). A model without a
    config (a bare timm or torch module) is not checked here. ``num_labels``: the labels the calibrator was fitted on
    (multi-label), checked against the model's ``config.num_labels``.
    """
    check_task(calibrator_task, "calibrator_task")
    config = _config_of(model)
    if config is None:
        return
    problem_type = getattr(config, "problem_type", None)
    try:
        model_task = task_of_config(config)
    except ValueError as err:
        raise ValueError(f"Cannot attach a {calibrator_task} {what} to this model: {err}") from None
    if model_task is None:
        return
    model_labels = getattr(config, "num_labels", None)
    described = f"config.problem_type={problem_type!r}, num_labels={model_labels}"
    if calibrator_task == "binary" and model_task == "multiclass" and model_labels == 2:
        return  # two softmax logits: the binary calibrator maps their log-odds
    if calibrator_task != model_task:
        head = {
            "multiclass": "a softmax (multi-class)",
            "binary": "a binary sigmoid",
            "multilabel": "a multi-label sigmoid",
        }
        fix = (
            "fit a sigmoid calibrator (task='multilabel' or 'binary': platt, sigmoid_temperature_scaling, beta, ...) on "
            "this model's logits"
            if model_task in SIGMOID_TASKS
            else "fit a softmax calibrator (temperature_scaling, ...) on this model's logits"
        )
        raise ValueError(
            f"Expected a {what} fitted for this model's head, but the {what} was fitted for {head[calibrator_task]} head "
            f"(task={calibrator_task!r}) and the model's head is {head[model_task]} one ({described}): attached, its "
            f"scores would silently be wrong. {fix[0].upper() + fix[1:]}, or set the model's config.problem_type if it is wrong."
        )
    if (
        calibrator_task == "multilabel"
        and num_labels is not None
        and isinstance(model_labels, int)
        and model_labels != num_labels
    ):
        raise ValueError(
            f"Expected a {what} fitted on the model's {model_labels} labels, but it was fitted on {num_labels} "
            f"({described})."
        )


# Which pipeline task (modality) a classifier is for: image, text, audio or video. The head kind above and the task here
# are the two things a model's config says about its scores.

IMAGE_TASK = "image-classification"
# the transformers pipeline tasks whose models end in class logits: (Auto model class, preprocessor argument of
# ``transformers.pipeline``, Auto classes that load that preprocessor, tried in order)
CLASSIFICATION_TASKS = {
    IMAGE_TASK: ("AutoModelForImageClassification", "image_processor", ("AutoImageProcessor",)),
    "text-classification": ("AutoModelForSequenceClassification", "tokenizer", ("AutoTokenizer",)),
    "audio-classification": ("AutoModelForAudioClassification", "feature_extractor", ("AutoFeatureExtractor",)),
    # newer video models have a video processor; VideoMAE-era checkpoints may have only an image processor
    "video-classification": (
        "AutoModelForVideoClassification",
        "video_processor",
        ("AutoVideoProcessor", "AutoImageProcessor"),
    ),
}
# transformers' own tables (model_type -> class name) of the classes each Auto class loads; disjoint
_AUTO_MAPPINGS = {
    IMAGE_TASK: "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "text-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "audio-classification": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "video-classification": "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES",
}
# class-name endings for architectures the tables do not list (remote code, a user's own class); audio first:
# wav2vec2-style classes end in ForSequenceClassification too, and are found in the audio table above
_SUFFIXES = (
    ("ForAudioClassification", "audio-classification"),
    ("ForVideoClassification", "video-classification"),
    ("ForImageClassification", IMAGE_TASK),
    ("ForSequenceClassification", "text-classification"),
)


def check_pipeline_task(task: Any, name: str = "task") -> str:
    """``task`` as one of :data:`CLASSIFICATION_TASKS` (``ValueError`` naming the argument otherwise)."""
    if not isinstance(task, str) or task not in CLASSIFICATION_TASKS:
        raise ValueError(
            f"Expected argument `{name}` to be one of {sorted(CLASSIFICATION_TASKS)} (calibrators act on class scores), "
            f"or None (read from the model's config), but got {task!r}."
        )
    return task


def _auto_tables() -> dict[str, dict[str, str]]:
    from transformers.models.auto import modeling_auto

    return {task: dict(getattr(modeling_auto, name, {})) for task, name in _AUTO_MAPPINGS.items()}


def _field(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def pipeline_task_of_config(config: Any) -> tuple[str | None, str]:
    """``(task, why)``: the pipeline task a transformers config (or its ``config.json`` as a dict) is for, read from
    ``architectures`` (the class it was saved from, looked up in transformers' Auto tables, else by its name's ending),
    else from ``model_type`` when one table alone lists it; ``(None, why)`` when it names none of them."""
    if config is None:
        return None, "no config"
    if isinstance(_field(config, "maccal_head"), dict):
        return IMAGE_TASK, "a MaC-Cal checkpoint (config.maccal_head)"
    tables = _auto_tables()
    for name in _field(config, "architectures") or ():
        for task, table in tables.items():
            if name in table.values():
                return task, f"config.architectures={[name]}"
        for suffix, task in _SUFFIXES:
            if str(name).endswith(suffix):
                return task, f"config.architectures={[name]}"
    model_type = _field(config, "model_type")
    found = [task for task, table in tables.items() if model_type in table]
    if len(found) == 1:
        return found[0], f"config.model_type={model_type!r}"
    return None, f"config.architectures={_field(config, 'architectures')!r}, config.model_type={model_type!r}"


def _model_config_of_folder(folder: Any) -> dict | None:
    """The ``config.json`` of the model saved in ``folder``, or None: no model there (no config, or the config of a
    calibrator or conformal predictor saved there)."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return None if not isinstance(config, dict) or "calibrator" in config or "conformal" in config else config


def pipeline_task_of_folder(folder: Any) -> str | None:
    """The pipeline task of the model saved in ``folder`` (its ``config.json``, :func:`pipeline_task_of_config`), or
    None: no model there."""
    config = _model_config_of_folder(folder)
    return None if config is None else pipeline_task_of_config(config)[0]


def dense_task_of_folder(folder: Any) -> str | None:
    """The dense-prediction task of the model saved in ``folder`` (:func:`dense_task_of_config`), or None."""
    config = _model_config_of_folder(folder)
    return None if config is None else dense_task_of_config(config)


def resolve_pipeline_task(task: str | None = None, config: Any = None) -> str:
    """The pipeline task of a model: its config's (:func:`pipeline_task_of_config`); ``task`` overrides it only where the
    config says nothing, and one that contradicts the config is a ``ValueError`` naming both. A config that names no
    task (a bare timm module, an unknown architecture) is taken as ``"image-classification"`` unless ``task`` says."""
    if task is not None:
        check_pipeline_task(task)
    found, why = pipeline_task_of_config(config)
    if task is not None and found is not None and task != found:
        raise ValueError(
            f"Expected argument `task` to agree with the model's config, but got task={task!r} for a {found} model "
            f"({why}, which {CLASSIFICATION_TASKS[found][0]} loads). Leave task=None to read it from the config."
        )
    return task or found or IMAGE_TASK


# the pipeline task -> (Auto model class, transformers' table of the classes it loads, class-name ending)
SEGMENTATION_TASK = "image-segmentation"
DENSE_TASKS = {
    "object-detection": (
        "AutoModelForObjectDetection",
        "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
        "ForObjectDetection",
    ),
    SEGMENTATION_TASK: (
        "AutoModelForSemanticSegmentation",
        "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        "ForSemanticSegmentation",
    ),
}


def dense_task_of_config(config: Any) -> str | None:
    """``"object-detection"`` / ``"image-segmentation"`` when a transformers config (or its ``config.json`` as a dict)
    is a detector's / semantic segmenter's (its ``architectures`` in transformers' Auto tables, or by the class name's
    ending), else None."""
    from transformers.models.auto import modeling_auto

    def field(key):
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    for name in field("architectures") or ():
        for task, (_, table, suffix) in DENSE_TASKS.items():
            if name in getattr(modeling_auto, table, {}).values() or str(name).endswith(suffix):
                return task
    return None
