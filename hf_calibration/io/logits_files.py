"""Read and write saved logits: ``.npz`` / ``.pt`` / ``.safetensors`` files and ``.npy`` pairs.

A logits file holds float logits ``(N, K)`` and integer labels ``(N,)`` (a binary head's one logit column, ``(N,)``, or a
multi-label head's ``(N, L)`` logits with ``(N, L)`` 0/1 labels, too), either under the keys
``logits`` / ``labels`` or split into ``logits_<split>`` / ``labels_<split>`` (for example
``logits_val``, ``labels_val``, ``logits_test``, ``labels_test``: fit a calibrator on the val part,
report on the test part). A ``.npy`` file holds the logits alone; its labels come from a second
``.npy`` file. A ``.pt`` file holds a dict with the same keys or a ``(logits, labels)`` pair.

Every problem (missing file, unknown format, missing keys, wrong shapes or dtypes, labels out of
range) raises :class:`LogitsFileError`, a ``ValueError`` whose message names the file.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hf_calibration._core.checks import IGNORE_INDEX, check_classification_shapes, check_labels_in_range, to_numpy
from hf_calibration._core.inputs import read_inputs, read_task, whole_labels

__all__ = ["LogitsFileError", "Logits", "load_logits", "save_logits", "npz_path", "available_splits", "SUFFIXES"]

SUFFIXES = (".npz", ".pt", ".pth", ".safetensors", ".npy")


class LogitsFileError(ValueError):
    """A logits file that cannot be read, or whose content is not (logits, labels)."""


class Logits(NamedTuple):
    logits: np.ndarray  # (N, K) floating
    labels: np.ndarray  # (N,) int64; (N, L) 0/1 for a multi-label head
    source: str  # "file.npz" or "file.npz[test]", for messages and report titles
    task: str = "multiclass"  # the head's kind (hf_calibration._core.tasks): "binary" / "multilabel" for a sigmoid head


def _read_arrays(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                return {key: data[key] for key in data.files}
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
            raise LogitsFileError(f"{path}: not a readable .npz file ({err}).") from None
    if suffix == ".npy":
        try:
            return {"logits": np.load(path, allow_pickle=False)}
        except (ValueError, OSError, EOFError) as err:
            raise LogitsFileError(f"{path}: not a readable .npy file ({err}).") from None
    if suffix in (".pt", ".pth"):
        import torch

        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises many kinds (UnpicklingError, RuntimeError...)
            raise LogitsFileError(
                f"{path}: not a readable torch file ({type(err).__name__}: {err}).".splitlines()[0]
            ) from None
        if isinstance(obj, (tuple, list)) and len(obj) == 2:
            return {"logits": obj[0], "labels": obj[1]}
        if isinstance(obj, dict):
            return dict(obj)
        raise LogitsFileError(
            f"{path}: expected a dict of arrays or a (logits, labels) pair, but found {type(obj).__name__}."
        )
    if suffix == ".safetensors":
        from safetensors.numpy import load_file

        try:
            return load_file(str(path))
        except Exception as err:
            raise LogitsFileError(f"{path}: not a readable .safetensors file ({err}).") from None
    raise LogitsFileError(
        f"{path}: unknown logits file type {suffix or '(none)'!r}; expected one of {', '.join(SUFFIXES)}."
    )


def _check_path(path: str | os.PathLike, name: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"Expected argument `{name}` to be a file path, but got {type(path).__name__}.")
    path = Path(path)
    if not path.exists():
        raise LogitsFileError(f"{path}: no such file.")
    if not path.is_file():
        raise LogitsFileError(f"{path}: not a file.")
    return path


def available_splits(keys) -> list[str]:
    """Split names with both ``logits_<split>`` and ``labels_<split>`` among ``keys``."""
    keys = set(keys)
    return sorted(
        k[len("logits_") :] for k in keys if k.startswith("logits_") and "labels_" + k[len("logits_") :] in keys
    )


def load_logits(
    path: str | os.PathLike,
    split: str | None = None,
    *,
    labels_path: str | os.PathLike | None = None,
    default_split: str | None = None,
    ignore_index: int | None = IGNORE_INDEX,
    task: str | None = None,
) -> Logits:
    """Load ``(logits, labels)`` from a file, checked.

    Args:
        path: ``.npz``, ``.pt``/``.pth``, ``.safetensors`` or ``.npy`` (logits only; see ``labels_path``).
        split: read ``logits_<split>`` / ``labels_<split>``. ``None``: the plain ``logits`` /
            ``labels`` keys, else ``default_split`` when the file has it, else the file's only split.
        labels_path: a ``.npy`` (or any supported file holding ``labels``) with the labels, for
            a logits-only file.
        default_split: split used when ``split`` is None and the file has no plain keys.
        ignore_index: labels equal to it are allowed (and kept); others must lie in [0, K).
        task: the head's kind, ``"multiclass"`` / ``"binary"`` / ``"multilabel"``; None reads it from the shapes
            (``(N, L)`` 0/1 labels: multi-label; one logit column: binary), see :mod:`hf_calibration._core.tasks`.

    Returns:
        :class:`Logits` ``(logits, labels, source)``; logits keep their float dtype.
    """
    path = _check_path(path, "path")
    arrays = _read_arrays(path)
    keys = sorted(arrays)
    splits = available_splits(keys)
    if split is None:
        if "logits" in arrays:
            logits_key, labels_key = "logits", "labels"
        elif default_split is not None and default_split in splits:
            split = default_split
        elif len(splits) == 1:
            split = splits[0]
        elif splits:
            raise LogitsFileError(f"{path}: holds several splits ({', '.join(splits)}); choose one with --split.")
        else:
            raise LogitsFileError(
                f"{path}: expected arrays `logits` and `labels` (or `logits_<split>` and `labels_<split>`), but found keys {keys}."
            )
    if split is not None:
        logits_key, labels_key = f"logits_{split}", f"labels_{split}"
        if logits_key not in arrays or (labels_key not in arrays and labels_path is None):
            found = f"splits {', '.join(splits)}" if splits else f"keys {keys}"
            raise LogitsFileError(f"{path}: no split {split!r} (`{logits_key}` and `{labels_key}`); found {found}.")
    logits = arrays[logits_key]
    source = f"{path.name}[{split}]" if split is not None else path.name

    if labels_path is not None:
        labels_file = _check_path(labels_path, "labels_path")
        label_arrays = _read_arrays(labels_file)
        if labels_file.suffix.lower() == ".npy":
            labels = label_arrays["logits"]  # a bare array, whatever it holds
        elif labels_key in label_arrays:
            labels = label_arrays[labels_key]
        else:
            raise LogitsFileError(
                f"{labels_file}: expected an array `{labels_key}`, but found keys {sorted(label_arrays)}."
            )
    elif labels_key in arrays:
        labels = arrays[labels_key]
    elif path.suffix.lower() == ".npy":
        raise LogitsFileError(
            f"{path}: a .npy file holds the logits only; give the labels file too (--labels LABELS.npy)."
        )
    else:
        raise LogitsFileError(f"{path}: expected an array `{labels_key}` beside `{logits_key}`, but found keys {keys}.")

    try:
        logits = to_numpy(logits, "logits")
        labels = to_numpy(labels, "labels")
        task = read_task(task, logits, labels, ignore_index=ignore_index, preds_name="logits", target_name="labels")
        if task == "multiclass":
            check_classification_shapes(logits, labels, "logits", "labels")
            check_labels_in_range(labels, logits.shape[1], "labels", ignore_index)
        else:  # a sigmoid head: one score column (binary) or (N, L) 0/1 labels (multi-label), checked as the metrics do
            read_inputs(
                logits,
                labels,
                task=task,
                from_logits=True,
                ignore_index=ignore_index,
                preds_name="logits",
                target_name="labels",
            )
            labels = whole_labels(labels, "labels")
    except (ValueError, TypeError) as err:
        raise LogitsFileError(f"{source}: {err}") from None
    if not np.isfinite(logits).all():
        raise LogitsFileError(f"{source}: the logits contain NaN or inf.")
    return Logits(logits, labels.astype(np.int64, copy=False), source, task)


def npz_path(path: str | os.PathLike) -> Path:
    """The file ``numpy.savez`` writes for ``path``: ``.npz`` is appended unless the name already ends with it."""
    path = Path(path)
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def save_logits(
    path: str | os.PathLike,
    logits: Any = None,
    labels: Any = None,
    *,
    overwrite: bool = False,
    **splits: tuple[Any, Any],
) -> Path:
    """Write an ``.npz`` logits file that :func:`load_logits` and ``hf-calibration`` read; returns its path.

    ``save_logits("out.npz", logits, labels)`` writes ``logits`` / ``labels``;
    ``save_logits("out.npz", val=(logits_val, labels_val), test=(logits_test, labels_test))``
    writes one ``logits_<split>`` / ``labels_<split>`` pair per split. ``.npz`` is appended to a name without
    it. An existing file is replaced only with ``overwrite=True``.
    """
    if not isinstance(overwrite, bool):
        raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
    target = npz_path(path)
    if target.exists() and not overwrite:
        raise ValueError(
            f"Expected argument `path` to name a new file, but {str(target)!r} exists; pass overwrite=True to replace it."
        )
    arrays: dict[str, np.ndarray] = {}
    if logits is not None or labels is not None:
        if logits is None or labels is None:
            raise ValueError("Expected both `logits` and `labels`, or neither (with splits given as keywords).")
        splits = {None: (logits, labels), **splits}
    if not splits:
        raise ValueError("Expected `logits` and `labels`, or at least one split, e.g. test=(logits, labels).")
    for name, pair in splits.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"Expected split `{name}` to be a (logits, labels) pair, but got {type(pair).__name__}.")
        z, y = to_numpy(pair[0], "logits"), whole_labels(pair[1], "labels")  # 0.7 or 1.7 is refused, never truncated
        from hf_calibration._core.tasks import resolve_task

        if resolve_task(preds=z, target=y) == "multiclass":  # a sigmoid head's arrays are checked when read back
            check_classification_shapes(z, y, "logits", "labels")
        suffix = "" if name is None else f"_{name}"
        arrays[f"logits{suffix}"], arrays[f"labels{suffix}"] = z, y.astype(np.int64, copy=False)
    np.savez(target, **arrays)
    return target
