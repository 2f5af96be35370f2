"""The bundled ``evaluate`` metric scripts published as Hub Spaces, so that ``evaluate.load("<org>/ece")`` works online.

``evaluate.load("<org>/<name>")`` downloads ``<name>.py`` from the Space ``<org>/<name>``
(``https://huggingface.co/spaces/<org>/<name>/resolve/<revision>/<name>.py``); the Space itself runs ``app.py``
(evaluate's Gradio widget) after installing ``requirements.txt``. Each Space is one folder of
``hf_calibration/metric_scripts`` (every folder there: :func:`hf_calibration.hub.list_metric_scripts`), copied as it is
except ``requirements.txt``, which names a pip requirement that installs this version of the package
(:func:`package_requirement`), because the scripts import ``hf_calibration``.

:func:`build_metric_spaces` writes the folders (what ``hf-calibration push-metrics --dry-run`` shows);
:func:`push_metric_spaces` creates each Space (``HfApi.create_repo(repo_type="space", space_sdk="gradio")``) and
uploads its folder (``HfApi.upload_folder``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_calibration._core.version import package_requirement
from hf_calibration.hub.metric_scripts import list_metric_scripts, metric_path

__all__ = ["build_metric_spaces", "check_namespace", "package_requirement", "push_metric_spaces", "space_files"]

logger = logging.getLogger(__name__)

REQUIREMENTS_NAME = "requirements.txt"
RECORD_NAME = ".hf_calibration_spaces.json"  # in `out`, beside the folders: {"files": {"<name>/<path>": SHA-256}}
_SKIPPED = ("__pycache__", ".pyc")  # never published


def _check_requirement(requirement: Any) -> str:
    if not isinstance(requirement, str) or not requirement.strip() or "\n" in requirement.strip():
        raise ValueError(f"Expected argument `requirement` to be one pip requirement line, but got {requirement!r}.")
    return requirement.strip()


def _check_names(names: Sequence[str] | None) -> list[str]:
    available = list_metric_scripts()
    if names is None:
        return available
    if isinstance(names, str) or not names:
        raise ValueError(
            f"Expected argument `names` to be a non-empty list of metrics among {available}, but got {names!r}."
        )
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"Expected argument `names` to hold metrics among {available}, but got {unknown}.")
    return list(dict.fromkeys(names))


def check_namespace(namespace: Any) -> str:
    """A Hub user or organisation name under which ``<namespace>/<metric>`` are valid Space ids."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(namespace, str) or not namespace.strip() or "/" in namespace:
        raise ValueError(
            f"Expected argument `namespace` to be a Hub user or organisation name (no '/'), but got {namespace!r}."
        )
    try:
        validate_repo_id(f"{namespace}/ece")
    except HFValidationError as err:
        raise ValueError(
            f"Expected argument `namespace` to be a Hub user or organisation name, but got {namespace!r}: {err}"
        ) from None
    return namespace


def space_files(name: str, requirement: str) -> dict[str, bytes]:
    """The files of the Space of metric ``name``: its folder's files (by relative path), ``requirements.txt`` replaced."""
    folder = Path(metric_path(name))
    files = {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and not any(part in _SKIPPED or part.endswith(_SKIPPED) for part in path.relative_to(folder).parts)
    }
    files[REQUIREMENTS_NAME] = (_check_requirement(requirement) + "\n").encode()
    return files


def _recorded(out: Path) -> dict[str, str]:
    """``{relative path: SHA-256}`` of the files an earlier call wrote in ``out`` ({} without a readable record)."""
    try:
        record = json.loads((out / RECORD_NAME).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return record if isinstance(record, dict) else {}


def _check_out(out: Path, overwrite: bool) -> None:
    """Refuse to write where a user's files are: ``out`` must be new or empty; with ``overwrite``, it may hold Space
    folders written by an earlier call, which are replaced, as long as every file in them is one that call wrote,
    unchanged since (its SHA-256 is in the record ``RECORD_NAME``): a card edited after a dry run is never replaced."""
    from hf_calibration._core.checkpoints import file_digest

    if out.exists() and not out.is_dir():
        raise ValueError(f"Expected argument `out` to be a folder, but {str(out)!r} is a file.")
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(p.name for p in entries[:3])
        raise ValueError(
            f"Expected argument `out` to be a new or empty folder, but {str(out)!r} holds {shown}; pass "
            "overwrite=True (--overwrite) to replace the metric folders an earlier call wrote there."
        )
    recorded = _recorded(out)
    for entry in entries:
        if entry.name == RECORD_NAME and entry.is_file():
            continue
        ours = entry.is_dir() and entry.name in list_metric_scripts()
        expected = set(space_files(entry.name, "x")) if ours else set()
        found = {p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()} if ours else set()
        if not ours or not found <= expected:
            what = sorted(found - expected)[0] if ours else entry.name
            raise ValueError(
                f"Expected argument `out` to hold only metric folders written by an earlier call, but "
                f"{str(out / (entry.name if not ours else entry.name + '/' + what))!r} is not one of their "
                "files: it is never replaced; choose another folder."
            )
        for relative in sorted(found):
            key = f"{entry.name}/{relative}"
            if recorded.get(key) != file_digest(entry / relative):
                raise ValueError(
                    f"Expected argument `out` to hold only files an earlier call wrote, unchanged, but "
                    f"{str(entry / relative)!r} "
                    + ("was changed since it was written" if key in recorded else "is not in that call's record")
                    + ": it is never replaced; move it away or choose another folder."
                )


def build_metric_spaces(
    out: str | os.PathLike,
    names: Sequence[str] | None = None,
    *,
    requirement: str | None = None,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Write one Space folder per metric into ``out`` (``out/<name>/``); returns ``{name: folder}``.

    Args:
        out: a new or empty folder (``overwrite=True``: also one holding folders an earlier call wrote, replaced;
            any other file there is refused, never replaced).
        names: the metrics (default: every bundled script, :func:`hf_calibration.hub.list_metric_scripts`).
        requirement: the pip requirement line of ``requirements.txt`` (default: :func:`package_requirement`).
    """
    if not isinstance(overwrite, bool):
        raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
    names = _check_names(names)
    requirement = _check_requirement(package_requirement() if requirement is None else requirement)
    out = Path(out)
    _check_out(out, overwrite)
    from hf_calibration._core.checkpoints import file_digest

    folders, record = {}, _recorded(out)
    for name in names:
        folder = out / name
        if folder.exists():
            shutil.rmtree(folder)  # an earlier call's folder (checked above)
        record = {key: digest for key, digest in record.items() if not key.startswith(f"{name}/")}
        for relative, content in space_files(name, requirement).items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_bytes(content)
            record[f"{name}/{relative}"] = file_digest(folder / relative)
        folders[name] = folder
    (out / RECORD_NAME).write_text(json.dumps({"files": record}, sort_keys=True, indent=2))
    return folders


def push_metric_spaces(
    namespace: str,
    names: Sequence[str] | None = None,
    *,
    requirement: str | None = None,
    private: bool | None = None,
    token: str | None = None,
) -> dict[str, str]:
    """Create (or update) the Space ``<namespace>/<name>`` of each metric and upload its folder; returns
    ``{name: Space URL}``. ``evaluate.load("<namespace>/<name>")`` then loads the script.

    Raises ``HubUnreachableError`` (a ``ConnectionError``) in one sentence when the Hub cannot be reached; the folders
    that were to be uploaded are kept and named in the message.
    """
    from huggingface_hub import HfApi

    from hf_calibration._core.checkpoints import HubUnreachableError, unreachable_reason
    from hf_calibration._core.version import __version__

    names = _check_names(names)
    check_namespace(namespace)
    root = Path(tempfile.mkdtemp(prefix="hf_calibration_spaces_"))
    folders = build_metric_spaces(root, names, requirement=requirement)
    api = HfApi(token=token)
    urls = {}
    try:
        for name, folder in folders.items():
            repo_id = api.create_repo(
                repo_id=f"{namespace}/{name}", repo_type="space", space_sdk="gradio", private=private, exist_ok=True
            ).repo_id
            api.upload_folder(
                repo_id=repo_id,
                repo_type="space",
                folder_path=str(folder),
                commit_message=f"Upload the {name} metric (hf-calibration {__version__})",
            )
            urls[name] = f"https://huggingface.co/spaces/{repo_id}"
            logger.info("%s: published %s", name, urls[name])
    except Exception as err:
        reason = unreachable_reason(err)
        if reason is None:
            shutil.rmtree(root, ignore_errors=True)
            raise
        done = f" ({', '.join(urls)} already published)" if urls else ""
        raise HubUnreachableError(
            f"Could not publish the metric Spaces: the Hugging Face Hub is unreachable ({reason}){done}; "
            f"the folders to upload are in {str(root)!r}.",
            reason,
        ) from None
    shutil.rmtree(root, ignore_errors=True)
    return urls
