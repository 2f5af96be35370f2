"""Name → calibrator class registry (``register_calibrator`` / ``create_calibrator`` / ``list_calibrators``), and
``load_calibrator``, which reads the name a checkpoint records and loads it with that class."""

from __future__ import annotations

import os
from typing import Any

from hf_calibration._core import checkpoints
from hf_calibration._core.tasks import check_task, compatible_head

_CALIBRATORS: dict[str, type] = {}


def register_calibrator(cls: type) -> type:
    """Class decorator: register a calibrator under its ``kind`` (e.g. ``"smart"``)."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"Expected a calibrator class with a non-empty string `kind`, but got {cls!r}.")
    if kind in _CALIBRATORS and _CALIBRATORS[kind] is not cls:
        raise ValueError(f"A calibrator named {kind!r} is already registered ({_CALIBRATORS[kind].__name__}).")
    _CALIBRATORS[kind] = cls
    return cls


def list_calibrators(task: str | None = None) -> list[str]:
    """Registered calibrator names, sorted; ``task``: only those for that kind of head (``"multiclass"``: the softmax
    calibrators; ``"binary"`` / ``"multilabel"``: the sigmoid ones)."""
    # a calibrator that needs the model's features as well as its logits (DAC) is created and loaded by name, but not
    # listed: every listed one fits and maps logits alone
    listed = {name: cls for name, cls in _CALIBRATORS.items() if not getattr(cls, "needs_features", False)}
    if task is None:
        return sorted(listed)
    sigmoid = check_task(task) != "multiclass"
    return sorted(name for name, cls in listed.items() if bool(getattr(cls, "_sigmoid_head", False)) == sigmoid)


def get_calibrator_class(name: str) -> type:
    if not isinstance(name, str) or name not in _CALIBRATORS:
        raise ValueError(f"Expected argument `name` to be one of {list_calibrators()}, but got {name!r}.")
    return _CALIBRATORS[name]


def create_calibrator(name: str, **kwargs: Any):
    """Build an (unfitted) calibrator by name: ``create_calibrator("smart", seed=1)``."""
    return get_calibrator_class(name)(**kwargs)


def load_calibrator(
    name_or_path: str | os.PathLike, *, subfolder: str | None = None, task: str | None = None, **kwargs: Any
):
    """Load any registered calibrator from a folder or Hub repo, choosing the class from its config's ``calibrator``.

    Args:
        name_or_path: local folder or Hub repo id.
        subfolder: the calibrator's folder inside it (e.g. ``"calibrator"`` in a model's repo).
        task: the head the caller will use it on (``"multiclass"``, ``"binary"``, ``"multilabel"``, or a model,
            whose ``config.problem_type`` says): a calibrator fitted for another kind of head is refused with a
            ``ValueError`` naming ``problem_type``. None: no check (``attach`` checks the model anyway).
        **kwargs: ``revision``, ``cache_dir``, ``token``, ``local_files_only``, ``force_download``, ``map_location``.
    """
    download = {
        k: kwargs.pop(k)
        for k in ("revision", "cache_dir", "force_download", "local_files_only", "token")
        if k in kwargs
    }
    folder = checkpoints.resolve_checkpoint(name_or_path, subfolder=subfolder, name="name_or_path", **download)
    kind = checkpoints.read_config(folder).get("calibrator")
    if kind not in _CALIBRATORS:
        raise ValueError(
            f"Expected the checkpoint's config to name a calibrator among {sorted(_CALIBRATORS)} in its `calibrator` field, "
            f"but got {kind!r}: {str(folder)!r} is not an hf_calibration calibrator checkpoint."
        )
    calibrator = get_calibrator_class(kind).from_pretrained(folder, **kwargs)
    if task is not None:
        fitted_for = (calibrator.fit_info_ or {}).get("task", "multiclass")
        if isinstance(task, str):
            if check_task(task) != fitted_for and not (fitted_for == "binary" and task == "multiclass"):
                raise ValueError(
                    f"Expected a calibrator for a {task} head, but {str(folder)!r} holds one fitted for a {fitted_for} "
                    "head (config.problem_type of the model it calibrates): it would give wrong scores there."
                )
        else:  # a model: its config decides
            compatible_head(fitted_for, task, num_labels=(calibrator.fit_info_ or {}).get("num_labels"))
    return calibrator
