"""An Inference Endpoints handler beside a calibrated model: ``handler.py`` and ``requirements.txt``.

A dedicated Hugging Face Inference Endpoint serves a repository with a ``handler.py`` (an ``EndpointHandler`` class)
through it, after installing the repository's ``requirements.txt``. ``write_endpoint_handler(folder)`` writes both
into a calibrated model's folder (the model, ``calibrator/`` and optionally ``conformal/``); the handler
(``endpoint_handler.py`` in this package, copied) serves ``hf_calibration.pipeline`` on that folder, so the Endpoint
returns calibrated scores and prediction sets. ``push_endpoint_handler(repo_id)`` uploads the two files to a Hub repo
that already holds the model, and ``CalibrationTrainer(..., endpoint_handler=True)`` writes them with ``save_model``
(hence ``push_to_hub``).

Files a user owns are never replaced: a ``handler.py`` or ``requirements.txt`` that this package did not write (its
first line is the package's marker) is refused; one it wrote is replaced with ``overwrite=True``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

__all__ = ["HANDLER_NAME", "REQUIREMENTS_NAME", "push_endpoint_handler", "write_endpoint_handler"]

logger = logging.getLogger(__name__)

HANDLER_NAME = "handler.py"
REQUIREMENTS_NAME = "requirements.txt"
MARKER = "# Written by hf-calibration for Hugging Face Inference Endpoints"


def default_requirement() -> str:
    """The requirement line that installs on the Endpoint the code installed here (``package_requirement``: the PyPI
    version, or the VCS / archive URL it came from); an install from a local folder has none, and says so."""
    from hf_calibration._core.version import package_requirement

    return package_requirement()


def handler_source() -> str:
    """The handler file's text: the marker, then ``endpoint_handler.py``."""
    from hf_calibration._core.version import __version__

    body = Path(__file__).with_name("endpoint_handler.py").read_text(encoding="utf-8")
    return f"{MARKER} (version {__version__}); write_endpoint_handler(overwrite=True) replaces it.\n{body}"


def _check_requirement(requirement: str | None) -> str:
    requirement = default_requirement() if requirement is None else requirement
    if not isinstance(requirement, str) or not requirement.strip() or "\n" in requirement:
        raise ValueError(
            f"Expected argument `requirement` to be one pip requirement line (e.g. 'hf-calibration==0.1.0' or a "
            f"git URL), but got {requirement!r}."
        )
    return requirement.strip()


def _check_image_processor(folder: Path) -> None:
    """The handler reads images through the folder's image processor: refuse now rather than at the Endpoint's start."""
    from hf_calibration.io.model_loading import load_image_processor

    try:
        load_image_processor(str(folder))
    except (OSError, ValueError) as err:
        raise ValueError(
            f"Expected {str(folder)!r} to hold the model's image processor (preprocessor_config.json), which the "
            f"Endpoint reads images with, but it could not be loaded ({err}). Save it beside the model "
            "(image_processor.save_pretrained(folder), or the Trainer's processing_class=) first."
        ) from None


def _ours(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().startswith(MARKER)
    except (OSError, UnicodeDecodeError):
        return False


def write_endpoint_handler(
    folder: str | os.PathLike, *, requirement: str | None = None, overwrite: bool = False
) -> list[str]:
    """Write ``handler.py`` and ``requirements.txt`` into a calibrated model's ``folder``; returns their paths.

    Args:
        folder: the model's folder (its ``config.json``, weights, ``calibrator/``; ``conformal/`` for sets).
        requirement: the line that installs hf-calibration on the Endpoint (default: the code installed here, as
            ``push-metrics`` writes it: ``hf-calibration==X.Y.Z`` from PyPI, or the git / archive URL it was installed
            from; an install from a local folder must say, e.g. ``"hf-calibration @ git+https://..."``). Further
            requirements are the user's.
        overwrite: replace the handler files an earlier call wrote; a file of the same name that this package did not
            write is refused all the same.

    The folder should hold a model: without ``config.json`` or without ``calibrator/`` a warning says that the Endpoint
    would fail or serve uncalibrated scores; a model without its image processor is refused (the Endpoint could not
    read an image).
    """
    folder = Path(folder)
    requirement = _check_requirement(requirement)
    if not isinstance(overwrite, bool):
        raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
    if not folder.is_dir():
        raise ValueError(f"Expected argument `folder` to be a model's folder, but {str(folder)!r} is not a folder.")
    for name in (HANDLER_NAME, REQUIREMENTS_NAME):
        path = folder / name
        if path.exists() and not _ours(path):
            raise ValueError(
                f"Expected {str(folder)!r} to hold no {name} of its own, but it does, and hf_calibration did not "
                f"write it: it is never replaced (merge the handler by hand, or write it elsewhere)."
            )
        if path.exists() and not overwrite:
            raise ValueError(f"{str(path)!r} holds a handler file written earlier; pass overwrite=True to replace it.")
    if not (folder / "config.json").is_file():
        logger.warning("%s holds no config.json: the Endpoint will not find a model there.", folder)
    else:
        _check_image_processor(folder)
        if not (folder / "calibrator" / "config.json").is_file():
            logger.warning("%s holds no calibrator/: the Endpoint will serve the model's uncalibrated scores.", folder)
    (folder / HANDLER_NAME).write_text(handler_source(), encoding="utf-8")
    (folder / REQUIREMENTS_NAME).write_text(f"{MARKER}.\n{requirement}\n", encoding="utf-8")
    return [str(folder / HANDLER_NAME), str(folder / REQUIREMENTS_NAME)]


def push_endpoint_handler(
    repo_id: str,
    *,
    requirement: str | None = None,
    dry_run: bool = False,
    commit_message: str | None = None,
    token: str | None = None,
    branch: str | None = None,
    create_pr: bool | None = None,
) -> str:
    """Upload ``handler.py`` and ``requirements.txt`` to the root of the Hub repo ``repo_id`` (which holds the model and
    its ``calibrator/``); returns the commit URL, or with ``dry_run`` the local folder that would be uploaded."""
    from hf_calibration._core import checkpoints as hub

    hub.check_repo_id(repo_id)
    requirement = _check_requirement(requirement)
    folder = Path(tempfile.mkdtemp(prefix="hf_calibration_handler_"))
    (folder / HANDLER_NAME).write_text(handler_source(), encoding="utf-8")
    (folder / REQUIREMENTS_NAME).write_text(f"{MARKER}.\n{requirement}\n", encoding="utf-8")
    if dry_run:
        return str(folder)
    from huggingface_hub import HfApi

    try:
        return HfApi(token=token).upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            revision=branch,
            create_pr=create_pr,
            commit_message=commit_message or "Add an Inference Endpoints handler (hf-calibration)",
        )
    except Exception as err:
        reason = hub.unreachable_reason(err)
        if reason is None:
            raise
        raise hub.HubUnreachableError(
            f"Could not push the handler to {repo_id!r}: the Hugging Face Hub is unreachable ({reason}); "
            f"the files are in {str(folder)!r}.",
            reason,
        ) from None
