"""Paths the tests share: the repository, the test folder, and the shared data beside the clone (``../shared``)."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED = REPO.parent / "shared"
SHARED_LOGITS = SHARED / "data" / "logits"


def needs_shared(path: Path) -> Path:
    """``path`` inside ``../shared``; the calling test is skipped, with the reason in pytest's summary, when the clone has
    no ``../shared`` beside it (the published logits and CIFAR-10 images are not part of the repository)."""
    if not path.exists():
        pytest.skip(
            f"needs {path.relative_to(SHARED.parent) if SHARED.parent in path.parents else path} "
            "(the shared data beside the clone, ../shared), which is not there"
        )
    return path


def shared_params(paths: list[Path]) -> list:
    """``paths`` as ``parametrize`` values; without ``../shared`` (a plain clone) one skipped case that says so, instead of
    pytest's bare "got empty parameter set"."""
    if paths:
        return paths
    reason = f"needs {SHARED_LOGITS} (the published logits beside the clone, ../shared), which is not there"
    return [pytest.param(None, id="no-shared-data", marks=pytest.mark.skip(reason=reason))]
