"""Name → calibrator class registry (``register_calibrator`` / ``create_calibrator`` / ``list_calibrators``)."""

from __future__ import annotations

from typing import Any

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
    if task is None:
        return sorted(_CALIBRATORS)
    from ..tasks import check_task

    sigmoid = check_task(task) != "multiclass"
    return sorted(name for name, cls in _CALIBRATORS.items() if bool(getattr(cls, "_sigmoid_head", False)) == sigmoid)


def get_calibrator_class(name: str) -> type:
    if not isinstance(name, str) or name not in _CALIBRATORS:
        raise ValueError(f"Expected argument `name` to be one of {list_calibrators()}, but got {name!r}.")
    return _CALIBRATORS[name]


def create_calibrator(name: str, **kwargs: Any):
    """Build an (unfitted) calibrator by name: ``create_calibrator("smart", seed=1)``."""
    return get_calibrator_class(name)(**kwargs)
