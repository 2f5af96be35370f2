"""Hub persistence helpers for calibrators: checkpoint format, model card template, kind-dispatching loader.

A calibrator checkpoint is a folder (or a Hub repo, or a subfolder of a model's repo) holding
``model.safetensors`` (the weights and buffers), ``config.json`` (constructor arguments plus
``calibrator`` = the registered kind, ``format_version`` and ``fit`` = what it was fitted on) and a
generated ``README.md`` model card.

Publishing a model and its calibrator together, and loading both back::

    model.push_to_hub("me/vit-digits")                                  # the model at the repo root
    calibrator.push_to_hub("me/vit-digits", path_in_repo="calibrator")  # the calibrator beside it

    model = AutoModelForImageClassification.from_pretrained("me/vit-digits")
    calibrator = load_calibrator("me/vit-digits", subfolder="calibrator").attach(model)

(``save_pretrained(folder / "calibrator")`` next to ``model.save_pretrained(folder)`` is the local equivalent.)

Files a user owns: saving never replaces a file the call did not create. ``check_save_folder`` refuses a
non-empty folder unless asked to overwrite a calibrator saved there, and refuses a model's folder (a
``config.json`` that is not a calibrator's, or weights beside no calibrator config) even then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CHECKPOINT_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

CARD_NAME = "README.md"
CALIBRATOR_FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME)  # what save_pretrained writes, and replaces with overwrite
# files of a model checkpoint that a calibrator saved in the same folder would clobber or be confused with
_MODEL_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf")

CALIBRATOR_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A post-hoc calibrator for an image classifier, saved with the `hf_calibration` library
(`pip install hf-calibration`).
{{ method_description }} {{ argmax_statement }}

{% if citation %}Method: {{ citation }}{% if paper_url %} ({{ paper_url }}){% endif %}.
{% endif %}
## Fit

| | |
|---|---|
| calibrator | `{{ kind }}` |
| objective | `{{ objective }}` |
| fit-set size | {{ num_samples }} samples, {{ num_classes }} classes |
| fit-set accuracy | {{ accuracy }} |
| ECE before (fit set, 15 bins) | {{ ece_before }} |
| ECE after (fit set, 15 bins) | {{ ece_after }} |
| checkpoint format | {{ format_version }} |
{% if fitted_on %}| fitted on | {{ fitted_on }} |
{% endif %}

ECE is measured on the data the calibrator was fitted on; report held-out numbers for a fair picture.

## Usage

```python
from transformers import AutoModelForImageClassification, pipeline
from hf_calibration.calibrators import load_calibrator

{% if model_repo %}model = AutoModelForImageClassification.from_pretrained("{{ model_repo }}")
calibrator = load_calibrator({{ calibrator_args }})
{% else %}model = AutoModelForImageClassification.from_pretrained("<model repo>")
calibrator = load_calibrator("<this repo>")  # or load_calibrator("<model repo>", subfolder="calibrator")
{% endif %}calibrator.attach(model)      # model(...).logits and pipeline scores are now calibrated
calibrator.detach()           # back to the original model, bit for bit
```
{% if selection %}
## How this calibrator was chosen

{{ selection }}
{% endif %}
"""


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a local calibrator folder, with a clear error when it is missing or not JSON."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"Expected a calibrator checkpoint with a {CONFIG_NAME} in {str(folder)!r}, but there is none.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"The calibrator config {str(path)!r} is corrupted (not valid JSON): {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"The calibrator config {str(path)!r} is corrupted: expected a JSON object, got {type(config).__name__}.")
    return config


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached (offline mode, no network); ``reason`` says which."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


_UNREACHABLE = {"OfflineModeIsEnabled", "ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError", "TransportError"}


def unreachable_reason(err: BaseException) -> str | None:
    """Why ``err`` means the Hub could not be reached (offline mode, connection or timeout error), or None.

    Matched by class name along the exception's MRO, so it holds for huggingface_hub's HTTP client of any version
    (httpx, httpx2, requests).
    """
    names = {cls.__name__ for cls in type(err).__mro__}
    if "OfflineModeIsEnabled" in names:
        return "offline mode is on: HF_HUB_OFFLINE=1"
    if names & _UNREACHABLE or isinstance(err, (ConnectionError, TimeoutError)):
        return f"no connection: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}"
    return None


def _calibrator_config(folder: Path) -> dict | None:
    """The folder's config.json if it is a calibrator's (has a ``calibrator`` field), else None."""
    try:
        config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) and isinstance(config.get("calibrator"), str) else None


def check_save_folder(
    folder: str | os.PathLike,
    *,
    overwrite: bool,
    what: str = "argument `save_directory`",
    overwrite_flag: str = "overwrite=True",
    subfolder: str = "calibrator",
) -> bool:
    """Check that a calibrator may be saved in ``folder``; returns whether a calibrator is already there.

    Allowed: a new or empty folder; with ``overwrite``, a folder holding a calibrator (replaced whole, card
    included) or other files that are not a model's. Refused (``ValueError``; ``what`` and ``overwrite_flag`` name
    the argument and the switch in the message): anything else; a model's folder always (save the calibrator in
    its ``calibrator/`` subfolder instead; ``subfolder`` names the one the message suggests).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"Expected {what} to be a folder, but {str(folder)!r} is a file.")
    entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not entries:
        return False
    calibrator = _calibrator_config(folder) is not None
    if not calibrator:
        model_files = [e for e in entries if e == CONFIG_NAME or e.endswith(_MODEL_WEIGHT_SUFFIXES) or e.endswith(".index.json")]
        if model_files:
            raise ValueError(
                f"Expected {what} to be a new folder or one holding a calibrator, but {str(folder)!r} holds a "
                f"model's files ({', '.join(model_files[:3])}), which are never replaced: save it in "
                f"{str(folder / subfolder)!r} instead."
            )
    if not overwrite:
        held = "a calibrator" if calibrator else f"{len(entries)} file(s) ({', '.join(entries[:3])})"
        raise ValueError(
            f"Expected {what} to be a new or empty folder, but {str(folder)!r} holds {held}; "
            f"pass {overwrite_flag} to replace the calibrator there."
        )
    return calibrator


def remove_calibrator_files(folder: Path) -> None:
    """Delete the files ``save_pretrained`` writes (so an overwrite leaves no stale model card)."""
    for file in CALIBRATOR_FILES:
        (folder / file).unlink(missing_ok=True)


DOWNLOAD_OPTIONS = ("revision", "cache_dir", "force_download", "local_files_only", "token")


def open_checkpoint(name_or_path: str | os.PathLike, subfolder: str | None, kwargs: dict[str, Any], *, who: str) -> tuple[Path, dict, dict]:
    """``(folder, config, download options)`` of a checkpoint to load strictly: the download options (and ``strict``,
    which must stay True; ``who`` names the class in that message) are popped from a ``from_pretrained``'s ``kwargs``."""
    if kwargs.pop("strict", True) is not True:
        raise ValueError(f"{who} always load strictly: `strict=False` is not supported.")
    download = {k: kwargs.pop(k) for k in DOWNLOAD_OPTIONS if k in kwargs}
    folder = resolve_checkpoint(name_or_path, subfolder=subfolder, name="pretrained_model_name_or_path", **download)
    return folder, read_config(folder), download


def load_weights(module: Any, folder: str | os.PathLike, *, what: str, map_location: str = "cpu") -> dict[str, str]:
    """Load ``folder``'s ``model.safetensors`` into ``module`` strictly; returns the file's metadata. A missing,
    corrupted or mismatched file raises ``ValueError`` (``what`` names the checkpoint's kind in the message)."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    path = os.path.join(folder, WEIGHTS_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"Expected the {what} weights {WEIGHTS_NAME} in {str(folder)!r}, but the file is missing.")
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
        load_model(module, path, strict=True, device=map_location)
    except Exception as err:  # safetensors header errors, strict-load key/shape mismatches
        raise ValueError(f"Could not load the {what} weights {path!r}: the file is corrupted or does not match {type(module).__name__} ({err}).") from None
    return metadata


def _looks_like_a_path(name: str) -> bool:
    return name.startswith((".", "/", "~", "\\")) or name.endswith(("/", "\\")) or name.count("/") > 1 or "\\" in name or os.path.isabs(name)


def resolve_checkpoint(
    name_or_path: str | os.PathLike,
    *,
    subfolder: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    force_download: bool = False,
    local_files_only: bool = False,
    token: str | bool | None = None,
    name: str = "pretrained_model_name_or_path",
) -> Path:
    """A local folder holding the checkpoint: ``name_or_path`` itself (plus ``subfolder``) or a Hub download.

    A name that is no local folder and cannot be a Hub repo id (a path such as ``./x`` or ``a/b/c``, or any
    ``os.PathLike``), or a repo the Hub cannot give, raises a ``ValueError`` (``HubUnreachableError`` when the
    Hub cannot be reached) that says which.
    """
    if not isinstance(name_or_path, (str, os.PathLike)) or (isinstance(name_or_path, str) and not name_or_path.strip()):
        raise TypeError(f"Expected argument `{name}` to be a local folder or a Hub repo id, but got {name_or_path!r}.")
    if subfolder is not None and not isinstance(subfolder, str):
        raise TypeError(f"Expected argument `subfolder` to be a str, but got {subfolder!r}.")
    local = Path(name_or_path)
    if local.is_dir():
        folder = local / subfolder if subfolder else local
        if not folder.is_dir():
            raise ValueError(f"Expected argument `subfolder` to name a folder inside {str(local)!r}, but {subfolder!r} is not one.")
        return folder
    if local.exists():
        raise ValueError(f"Expected argument `{name}` to be a folder (or a Hub repo id), but {str(local)!r} is a file.")
    repo_id = name_or_path if isinstance(name_or_path, str) and not _looks_like_a_path(name_or_path) else None
    if repo_id is not None:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(repo_id)
        except HFValidationError:
            repo_id = None
    if repo_id is None:
        raise ValueError(f"Expected argument `{name}` to be a local folder or a Hub repo id ('owner/name'), but there is no folder {str(local)!r}.")
    return _download(repo_id, name, subfolder, revision=revision, cache_dir=cache_dir, force_download=force_download,
                     local_files_only=local_files_only, token=token)


def _download(repo_id: str, name: str, subfolder: str | None, **kwargs: Any) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    try:
        root = snapshot_download(repo_id=repo_id, allow_patterns=[prefix + f for f in CALIBRATOR_FILES], **kwargs)
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise ValueError(
            f"Expected argument `{name}` to be a local folder or a Hub repo id, but {repo_id!r} is no folder here and the Hub "
            f"has no such repo or revision (private repos need a token): {str(err).strip().splitlines()[0]}"
        ) from None
    except LocalEntryNotFoundError:
        raise HubUnreachableError(
            f"{repo_id!r} is no local folder, and as a Hub repo id it is not in the local cache while the Hub cannot be "
            "reached (offline mode or no connection).",
            "not cached, Hub unreachable",
        ) from None
    except Exception as err:
        reason = unreachable_reason(err)
        if reason is None:
            raise
        raise HubUnreachableError(f"{repo_id!r} is no local folder, and the Hub cannot be reached to download it ({reason}).", reason) from None
    return Path(root) / prefix if prefix else Path(root)


def load_calibrator(name_or_path: str | os.PathLike, *, subfolder: str | None = None, **kwargs: Any):
    """Load any registered calibrator from a folder or Hub repo, choosing the class from its config's ``calibrator``.

    Args:
        name_or_path: local folder or Hub repo id.
        subfolder: the calibrator's folder inside it (e.g. ``"calibrator"`` in a model's repo).
        **kwargs: ``revision``, ``cache_dir``, ``token``, ``local_files_only``, ``force_download``, ``map_location``.
    """
    from .calibrators._registry import get_calibrator_class, list_calibrators

    download = {k: kwargs.pop(k) for k in ("revision", "cache_dir", "force_download", "local_files_only", "token") if k in kwargs}
    folder = resolve_checkpoint(name_or_path, subfolder=subfolder, name="name_or_path", **download)
    kind = read_config(folder).get("calibrator")
    if kind not in list_calibrators():
        raise ValueError(
            f"Expected the checkpoint's config to name a calibrator among {list_calibrators()} in its `calibrator` field, "
            f"but got {kind!r}: {str(folder)!r} is not an hf_calibration calibrator checkpoint."
        )
    return get_calibrator_class(kind).from_pretrained(folder, **kwargs)
