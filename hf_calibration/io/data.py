"""Image-classification datasets: load one split from the Hub, a ``save_to_disk`` folder or an image folder,
and find its image and label columns.

``load_image_dataset("cifar10", "test")``, ``load_image_dataset("saved/", "validation")`` and
``load_image_dataset("images/", "test")`` (an ``imagefolder`` tree: ``images/test/<class>/*.png``, or
``images/<class>/*.png`` for a single ``train`` split) all return one :class:`datasets.Dataset`.

Columns are found from the features: the image column is the one :class:`datasets.Image` column, the
label column the one :class:`datasets.ClassLabel` column, else an integer column named ``label`` or
``labels``. When that is ambiguous or impossible the error names the candidates.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from hf_calibration._core.checks import check_folder_or_hub_id

__all__ = ["find_image_column", "find_label_column", "load_image_dataset", "select_split"]

LABEL_NAMES = ("label", "labels")
# a split the user asked for → the names it also goes by (fit on "val" finds a dataset's "validation")
SPLIT_ALIASES = {
    "val": ("validation", "valid", "dev"),
    "validation": ("val", "valid", "dev"),
    "valid": ("validation", "val", "dev"),
    "dev": ("validation", "val", "valid"),
    "test": ("testing",),
    "train": ("training",),
}


def _is_saved_dataset(folder: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def select_split(splits, split: str | None, what: str, default_split: str | None = None) -> str:
    """The split to use among ``splits``: ``split`` (or one of its aliases), else ``default_split`` (or an
    alias), else the only split; otherwise a ``ValueError`` naming the splits there are."""
    splits = list(splits)
    wanted = split if split is not None else default_split
    if wanted is not None:
        for name in (wanted, *SPLIT_ALIASES.get(wanted, ())):
            if name in splits:
                return name
        if split is not None:
            raise ValueError(
                f"Expected argument `split` to name a split of {what}, but got {split!r}; it has {sorted(splits)}."
            )
    if len(splits) == 1:
        return splits[0]
    raise ValueError(f"{what} has several splits {sorted(splits)}; choose one with `split`.")


def load_image_dataset(
    path_or_name: str | os.PathLike,
    split: str | None = None,
    *,
    config_name: str | None = None,
    revision: str | None = None,
    default_split: str | None = None,
    **load_kwargs: Any,
):
    """One split of an image dataset, as a :class:`datasets.Dataset`.

    Args:
        path_or_name: a folder written by ``save_to_disk`` (``load_from_disk``), an image folder
            (``load_dataset("imagefolder", data_dir=...)``), or a Hub dataset id (``load_dataset``).
        split: the split to read (``"val"`` also finds ``"validation"`` and the reverse). ``None``:
            ``default_split`` when the dataset has it, else its only split.
        config_name: the Hub dataset's configuration (``load_dataset(name, config_name)``).
        revision: the Hub dataset's git revision.
        default_split: used when ``split`` is None.
        **load_kwargs: passed to ``load_dataset`` (``cache_dir``, ``token``, ``trust_remote_code``...).

    Returns:
        the split, a ``datasets.Dataset``; its ``info.splits`` / fingerprint identify it for caching.
    """
    import datasets

    if isinstance(path_or_name, (datasets.Dataset, datasets.DatasetDict)):
        return _pick(path_or_name, split, default_split, "the dataset")
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise TypeError(
            f"Expected argument `dataset` to be a datasets.Dataset, a folder or a Hub dataset id, but got {type(path_or_name).__name__}."
        )
    folder = Path(path_or_name)
    if folder.is_dir():
        if _is_saved_dataset(folder):
            return _pick(datasets.load_from_disk(str(folder)), split, default_split, str(folder))
        if config_name is not None:
            raise ValueError(
                f"Expected no `config_name` for the image folder {str(folder)!r}, but got {config_name!r}."
            )
        return _pick(
            datasets.load_dataset("imagefolder", data_dir=str(folder), **load_kwargs), split, default_split, str(folder)
        )
    check_folder_or_hub_id(path_or_name, "dataset", "dataset")
    name = str(path_or_name)
    if split is None:  # ask the Hub which splits there are before downloading one
        names = datasets.get_dataset_split_names(name, config_name, revision=revision, **load_kwargs)
        split = select_split(names, None, name, default_split)
    else:
        try:
            names = datasets.get_dataset_split_names(name, config_name, revision=revision, **load_kwargs)
        except Exception:  # noqa: BLE001 - a script-less dataset may not list its splits: let load_dataset decide
            names = None
        if names:
            split = select_split(names, split, name)
    return datasets.load_dataset(name, config_name, split=split, revision=revision, **load_kwargs)


def _pick(data, split: str | None, default_split: str | None, what: str):
    import datasets

    if isinstance(data, datasets.DatasetDict):
        name = select_split(data.keys(), split, what, default_split)
        data = data[name]
        if data.split is None:  # Datasets built in memory and saved keep no split name: record the key it was under
            data._split = datasets.NamedSplit(name)
        return data
    if (
        split is not None
        and data.split is not None
        and str(data.split) != split
        and split not in SPLIT_ALIASES.get(str(data.split), ())
    ):
        raise ValueError(
            f"Expected argument `split` to name a split of {what}, but got {split!r}; it holds the {str(data.split)!r} split only."
        )
    return data


def _describe(features) -> str:
    return ", ".join(f"{name} ({type(feature).__name__})" for name, feature in features.items())


def check_column(features, name: str, argument: str, what: str, ok, said=lambda f: f"is {f}") -> str:
    """``name``, checked to be a column of ``features`` whose feature passes ``ok``; else a ``ValueError`` naming
    ``argument``, the column (``said``: what its feature is) and ``what`` it should hold."""
    if name not in features:
        raise ValueError(
            f"Expected argument `{argument}` to name a column, but got {name!r}; the columns are {_describe(features)}."
        )
    if not ok(features[name]):
        raise ValueError(
            f"Expected argument `{argument}` to name a column of {what}, but {name!r} {said(features[name])}; the "
            f"columns are {_describe(features)}."
        )
    return name


def find_image_column(features, image_column: str | None = None) -> str:
    """The column holding the images: ``image_column`` if given (checked), else the one ``datasets.Image`` column."""
    import datasets

    if image_column is not None:
        return check_column(  # numbers or strings: no pixels
            features,
            image_column,
            "image_column",
            "images",
            lambda f: not isinstance(f, (datasets.ClassLabel, datasets.Value)),
            lambda f: f"holds {type(f).__name__} values",
        )
    found = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(f"The dataset has several image columns {found}; choose one with `image_column`.")
    raise ValueError(
        f"The dataset has no datasets.Image column (columns: {_describe(features)}); name it with `image_column`."
    )


def _is_integer(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.ClassLabel) or (
        isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))
    )


def _list_inner(feature):
    """The item feature of a list column (``Sequence`` / ``List`` / ``LargeList``), or None."""
    for attr in ("feature",):
        inner = getattr(feature, attr, None)
        if inner is not None and type(feature).__name__ in ("Sequence", "List", "LargeList"):
            return inner
    return None


def _is_multilabel(feature) -> bool:
    """A column a multi-label dataset labels with: a list of class indices (``Sequence(ClassLabel)``, a list of integers)
    or a multi-hot vector (a list of numbers)."""
    import datasets

    inner = _list_inner(feature)
    return isinstance(inner, datasets.ClassLabel) or (
        isinstance(inner, datasets.Value) and inner.dtype.startswith(("int", "uint", "float", "bool"))
    )


def multi_hot_labels(data, column: str, num_labels: int) -> np.ndarray:
    """``(N, L)`` int64 0/1 labels of a multi-label column: a list of present class indices per row (``Sequence(ClassLabel)``
    or integers) or a multi-hot vector of length ``num_labels`` (-100 entries kept: ignored)."""
    import datasets

    feature = data.features[column]
    inner = _list_inner(feature)
    rows = data[column]
    out = np.zeros((len(rows), num_labels), dtype=np.int64)
    as_indices = isinstance(inner, datasets.ClassLabel) or (
        isinstance(inner, datasets.Value)
        and inner.dtype.startswith(("int", "uint"))
        and any(len(r) != num_labels for r in rows)
    )
    for i, row in enumerate(rows):
        if as_indices:
            for j in row:
                if not 0 <= int(j) < num_labels:
                    raise ValueError(
                        f"Expected the {column!r} column to hold class indices in [0, {num_labels}) (the model's "
                        f"num_labels), but row {i} holds {j}."
                    )
                out[i, int(j)] = 1
        else:
            if len(row) != num_labels:
                raise ValueError(
                    f"Expected each multi-hot row of the {column!r} column to have the model's {num_labels} "
                    f"labels, but row {i} has {len(row)}."
                )
            values = np.asarray(row, dtype=np.float64)
            bad = ~((values == 0) | (values == 1) | (values == -100))
            if bad.any():
                raise ValueError(
                    f"Expected the {column!r} column to hold 0/1 labels (or -100, ignored) for a multi-label model, "
                    f"but row {i} holds {values[bad][0].item()!r}: soft labels are not rounded."
                )
            out[i] = values.astype(np.int64)
    return out


def _is_binary_label(feature) -> bool:
    """What a one-logit binary head's labels may be stored as: class indices, floats (transformers' BCE loss takes float
    labels), or a one-element list of them (the (N, 1) float labels of ``problem_type="multi_label_classification"``)."""
    import datasets

    inner = _list_inner(feature)
    value = inner if inner is not None else feature
    return isinstance(value, datasets.ClassLabel) or (
        isinstance(value, datasets.Value) and value.dtype.startswith(("int", "uint", "float", "bool"))
    )


def find_label_column(
    features, label_column: str | None = None, *, multilabel: bool = False, binary: bool = False
) -> str:
    """The column holding the class indices: ``label_column`` if given (checked), else the one
    ``datasets.ClassLabel`` column, else an integer column named ``label`` or ``labels``. With ``multilabel``, the
    column of a multi-label dataset: a list of class indices (``Sequence(ClassLabel)``) or a multi-hot vector, named by
    ``label_column`` or found as the one such column (``labels`` / ``label`` first). With ``binary`` (a one-logit head),
    also a float column or a column of one-element lists (transformers' BCE labels), 0 / 1 checked when read."""
    import datasets

    if multilabel:
        if label_column is not None:
            what = "multi-label labels (a list of class indices, or a multi-hot vector) for a multi-label model"
            return check_column(features, label_column, "label_column", what, _is_multilabel)
        found = [name for name, feature in features.items() if _is_multilabel(feature)]
        named = [name for name in LABEL_NAMES if name in found]
        if len(named) == 1 or len(found) == 1:
            return named[0] if len(named) == 1 else found[0]
        raise ValueError(
            f"Expected one multi-label column (a list of class indices, or a multi-hot vector) for a multi-label "
            f"model (config.problem_type='multi_label_classification'), but found {found or 'none'} among "
            f"{_describe(features)}; name it with `label_column`."
        )

    if binary:  # a one-logit binary head: an integer, float or one-element list column, 0 / 1 checked when read
        if label_column is not None:
            what = "0/1 labels (integers, floats, or one-element lists of them)"
            return check_column(features, label_column, "label_column", what, _is_binary_label)
        named = [name for name in LABEL_NAMES if name in features and _is_binary_label(features[name])]
        if len(named) == 1 and not any(isinstance(f, datasets.ClassLabel) for f in features.values()):
            return named[0]

    if label_column is not None:
        what = "class indices (ClassLabel or integer)"
        return check_column(features, label_column, "label_column", what, _is_integer)
    class_labels = [name for name, feature in features.items() if isinstance(feature, datasets.ClassLabel)]
    if len(class_labels) == 1:
        return class_labels[0]
    if class_labels:
        named = [name for name in class_labels if name in LABEL_NAMES]
        if len(named) == 1:
            return named[0]
        raise ValueError(f"The dataset has several ClassLabel columns {class_labels}; choose one with `label_column`.")
    named = [name for name in LABEL_NAMES if name in features and _is_integer(features[name])]
    if len(named) == 1:
        return named[0]
    if named:
        raise ValueError(f"The dataset has both integer columns {named}; choose one with `label_column`.")
    raise ValueError(
        f"The dataset has no ClassLabel column and no integer `label`/`labels` column (columns: {_describe(features)}); "
        "name it with `label_column`."
    )
