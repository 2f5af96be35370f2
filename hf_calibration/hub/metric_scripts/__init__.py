"""The `evaluate` metric scripts, shipped as package data so that any install can load them.

Each sub-folder is a self-contained `evaluate` metric (script, metric card, Space files);
the repository's top-level ``metrics/`` folder is a link to this one.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def list_metric_scripts() -> list[str]:
    """Names of the bundled `evaluate` metric scripts."""
    return sorted(p.name for p in _HERE.iterdir() if (p / f"{p.name}.py").is_file())


def metric_path(name: str) -> str:
    """Local path of a bundled metric script, for ``evaluate.load(metric_path("ece"))``.

    Works offline from any install (wheel or clone); online, the same folder published as a
    Space loads with ``evaluate.load("<org>/<name>")``.
    """
    names = list_metric_scripts()
    if name not in names:
        raise ValueError(f"Expected argument `name` to be one of {names}, but got {name!r}.")
    return str(_HERE / name)
