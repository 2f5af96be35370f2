"""Checkpoint files: the folder format every saved object shares (calibrators, conformal predictors, MaC-Cal heads),
the files a save owns, and finding a checkpoint in a folder or on the Hub.

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

Files a user owns: only files this package wrote are ever replaced or removed. Each save records, in its
``config.json`` under ``files``, the SHA-256 of every other file it wrote (the weights, the card); a file counts as
the package's only while its content is still what was recorded (a card the user edited is theirs). ``plan_save``
refuses a non-empty folder unless asked to overwrite a save there, refuses a model's folder (a ``config.json`` that
is not the package's, or weights beside none) even then, and never puts the card over a user's ``README.md``: it
goes to ``README.hf_calibration.md`` instead, and a warning says so. Saves made before the record existed (no
``files``) own their ``config.json`` and their weights (safetensors metadata naming the calibrator), not the card.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

CARD_NAME = "README.md"
FALLBACK_CARD_NAME = "README.hf_calibration.md"  # the card's name when a user's README.md is in the folder
CALIBRATOR_FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME)  # what a Hub download of a checkpoint fetches
FILES_RECORD = "files"  # config.json key: {file name: SHA-256} of the other files the package wrote beside it
# files of a model checkpoint that a calibrator saved in the same folder would clobber or be confused with
_MODEL_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf")


def read_config(folder: str | os.PathLike, what: str = "calibrator") -> dict[str, Any]:
    """The ``config.json`` of a local checkpoint folder (``what``: the kind of checkpoint, for the messages), with a
    clear error when it is missing or not JSON."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        found = sorted(p.name for p in Path(folder).iterdir())[:3] if Path(folder).is_dir() else []
        raise ValueError(
            f"Expected a {what} checkpoint with a {CONFIG_NAME} in {str(folder)!r}, but there is none"
            + (f" (it holds {', '.join(found)})." if found else ".")
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"The {what} config {str(path)!r} is corrupted (not valid JSON): {err}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"The {what} config {str(path)!r} is corrupted: expected a JSON object, got {type(config).__name__}."
        )
    return config


def read_config_or_none(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's ``config.json`` if it is a calibrator's or a conformal predictor's (one this package saved), else None."""
    return _calibrator_config(Path(folder)) if Path(folder).is_dir() else None


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached (offline mode, no network); ``reason`` says which."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


_UNREACHABLE = {
    "OfflineModeIsEnabled",
    "ConnectError",
    "ConnectTimeout",
    "TimeoutException",
    "NetworkError",
    "TransportError",
}


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


PACKAGE_KINDS = ("calibrator", "conformal")  # config.json / safetensors metadata fields naming what the package saved


def _calibrator_config(folder: Path) -> dict | None:
    """The folder's config.json if this package wrote it (a ``calibrator`` or ``conformal`` field, or a ``files``
    record beside the ``hf_calibration_version`` every save writes), else None."""
    try:
        config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    recorded = isinstance(config.get(FILES_RECORD), dict) and "hf_calibration_version" in config
    return config if recorded or any(isinstance(config.get(kind), str) for kind in PACKAGE_KINDS) else None


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _legacy_weights(path: Path) -> bool:
    """Weights written before the ``files`` record: safetensors whose metadata names a calibrator or predictor kind."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        return any(isinstance(metadata.get(kind), str) for kind in PACKAGE_KINDS)
    except Exception:  # noqa: BLE001 - unreadable: not provably ours
        return False


def owned_files(folder: str | os.PathLike) -> list[str]:
    """The files in ``folder`` that this package wrote and that are unchanged since: its ``config.json``, and each file
    recorded there whose content still has the recorded SHA-256 (for saves older than the record: the weights)."""
    folder = Path(folder)
    config = _calibrator_config(folder)
    if config is None:
        return []
    owned = [CONFIG_NAME]
    record = config.get(FILES_RECORD)
    if isinstance(record, dict):
        for name, digest in record.items():
            path = folder / str(name)
            if (
                Path(str(name)).name == str(name)
                and name != CONFIG_NAME
                and path.is_file()
                and file_digest(path) == digest
            ):
                owned.append(str(name))
    elif (folder / WEIGHTS_NAME).is_file() and _legacy_weights(folder / WEIGHTS_NAME):
        owned.append(WEIGHTS_NAME)
    return owned


def model_files(folder: str | os.PathLike) -> list[str]:
    """The files that make ``folder`` a model's (a ``config.json`` this package did not write, weights, a weight index),
    or [] (no folder, or one this package saved in)."""
    folder = Path(folder)
    if not folder.is_dir() or _calibrator_config(folder) is not None:
        return []
    entries = sorted(p.name for p in folder.iterdir())
    return [e for e in entries if e == CONFIG_NAME or e.endswith(_MODEL_WEIGHT_SUFFIXES) or e.endswith(".index.json")]


class SavePlan(NamedTuple):
    """What a save into a folder does: the package's earlier files it replaces, and the name its card gets."""

    replace: tuple[str, ...]  # files of an earlier save by this package (removed first: no stale card lingers)
    card: str  # README.md, or FALLBACK_CARD_NAME beside a user's README.md


def plan_save(
    folder: str | os.PathLike,
    *,
    overwrite: bool,
    what: str = "argument `save_directory`",
    overwrite_flag: str = "overwrite=True",
    writes: tuple[str, ...] = (CONFIG_NAME, WEIGHTS_NAME),
    subfolder: str = "calibrator",
) -> SavePlan:
    """Check that the package may save ``writes`` and a card in ``folder``, before anything is written.

    Allowed: a new or empty folder; with ``overwrite``, a folder holding an earlier save by this package or files that
    are not a model's. Refused (``ValueError``; ``what`` and ``overwrite_flag`` name the argument and the switch): a
    model's folder always (save in its ``subfolder`` instead, ``calibrator/`` by default); any other non-empty folder without
    ``overwrite``; a file at one of the names in ``writes`` that the package did not write; a user's file under both
    card names. A user's README.md is kept: the card goes to ``FALLBACK_CARD_NAME`` (the save warns).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"Expected {what} to be a folder, but {str(folder)!r} is a file.")
    entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not entries:
        return SavePlan((), CARD_NAME)
    ours = _calibrator_config(folder) is not None
    found = model_files(folder)
    if found:
        raise ValueError(
            f"Expected {what} to be a new folder or one holding a calibrator, but {str(folder)!r} holds a "
            f"model's files ({', '.join(found[:3])}), which are never replaced: save it in "
            f"{str(folder / subfolder)!r} instead."
        )
    if not overwrite:
        held = "a calibrator" if ours else f"{len(entries)} file(s) ({', '.join(entries[:3])})"
        raise ValueError(
            f"Expected {what} to be a new or empty folder, but {str(folder)!r} holds {held}; "
            f"pass {overwrite_flag} to replace the calibrator there."
        )
    owned = owned_files(folder)
    theirs = [name for name in writes if (folder / name).exists() and name not in owned]
    if theirs:
        raise ValueError(
            f"Expected {what} to hold no file of the same name as the calibrator's, but {str(folder)!r} holds "
            f"{', '.join(theirs)}, which hf_calibration did not write (or which changed since): it is never replaced."
        )
    card = next(
        (name for name in (CARD_NAME, FALLBACK_CARD_NAME) if not (folder / name).exists() or name in owned), None
    )
    if card is None:
        raise ValueError(
            f"Expected {what} to leave room for the model card, but {str(folder)!r} holds both {CARD_NAME} and "
            f"{FALLBACK_CARD_NAME}, which hf_calibration did not write: they are never replaced."
        )
    return SavePlan(tuple(owned), card)


def check_save_folder(
    folder: str | os.PathLike,
    *,
    overwrite: bool,
    what: str = "argument `save_directory`",
    overwrite_flag: str = "overwrite=True",
    subfolder: str = "calibrator",
) -> bool:
    """``plan_save``'s checks alone; returns whether an earlier save by this package is there."""
    return bool(
        plan_save(folder, overwrite=overwrite, what=what, overwrite_flag=overwrite_flag, subfolder=subfolder).replace
    )


def remove_owned_files(folder: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Delete the files ``plan_save`` listed as the package's own (and nothing else)."""
    for name in names:
        (Path(folder) / name).unlink(missing_ok=True)


def record_files(folder: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Record in ``folder``'s config.json (written by this save) the SHA-256 of each of ``names`` it wrote."""
    folder = Path(folder)
    config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    config[FILES_RECORD] = {name: file_digest(folder / name) for name in names if (folder / name).is_file()}
    (folder / CONFIG_NAME).write_text(json.dumps(config, sort_keys=True, indent=2))


def warn_user_card_kept(folder: str | os.PathLike, card: str) -> None:
    if card != CARD_NAME:
        logger.warning(
            "%s holds a README.md that hf_calibration did not write: it is kept, and the model card is "
            "written to %s instead.",
            folder,
            card,
        )


def save_recorded(
    module: Any,
    folder: str | os.PathLike,
    save,
    *,
    overwrite: bool,
    card_kwargs: dict | None = None,
    subfolder: str = "calibrator",
) -> Any:
    """Save ``module`` (a ``PyTorchModelHubMixin``) into ``folder`` by ``save()`` (the mixin's ``save_pretrained``)
    under the rules of ``plan_save``: the package's earlier files there are removed first, the card goes beside a
    user's README.md, and the files written are recorded. Returns what ``save()`` returns."""
    folder = Path(folder)
    plan = plan_save(folder, overwrite=overwrite, subfolder=subfolder)
    remove_owned_files(folder, plan.replace)
    warn_user_card_kept(folder, plan.card)
    result = save()  # the mixin writes the card as README.md only where no README.md is left
    if plan.card != CARD_NAME:
        module.generate_model_card(**(card_kwargs or {})).save(folder / plan.card)
    record_files(folder, (WEIGHTS_NAME, plan.card))
    return result


def check_repo_id(repo_id: Any, what: str = "argument `repo_id`") -> str:
    """A Hub repo id such as ``owner/name`` (``TypeError`` / ``ValueError`` naming ``what`` otherwise)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str):
        raise TypeError(f"Expected {what} to be a str such as 'owner/name', but got {repo_id!r}.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(
            f"Expected {what} to be a Hub repo id such as 'owner/name', but got {repo_id!r}: {err}"
        ) from None
    return repo_id


def check_path_in_repo(path_in_repo: Any, what: str = "argument `path_in_repo`") -> str | None:
    """None, or a non-empty folder name inside a repo."""
    if path_in_repo is not None and (not isinstance(path_in_repo, str) or not path_in_repo.strip("/")):
        raise ValueError(f"Expected {what} to be a non-empty folder name or None, but got {path_in_repo!r}.")
    return path_in_repo


DOWNLOAD_OPTIONS = ("revision", "cache_dir", "force_download", "local_files_only", "token")


def open_checkpoint(
    name_or_path: str | os.PathLike,
    subfolder: str | None,
    kwargs: dict[str, Any],
    *,
    who: str,
    what: str = "calibrator",
) -> tuple[Path, dict, dict]:
    """``(folder, config, download options)`` of a checkpoint to load strictly: the download options (and ``strict``,
    which must stay True; ``who`` names the class in that message) are popped from a ``from_pretrained``'s ``kwargs``;
    ``what`` names the kind of checkpoint in the errors."""
    if kwargs.pop("strict", True) is not True:
        raise ValueError(f"{who} always load strictly: `strict=False` is not supported.")
    download = {k: kwargs.pop(k) for k in DOWNLOAD_OPTIONS if k in kwargs}
    folder = resolve_checkpoint(name_or_path, subfolder=subfolder, name="pretrained_model_name_or_path", **download)
    return folder, read_config(folder, what), download


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
        raise ValueError(
            f"Could not load the {what} weights {path!r}: the file is corrupted or does not match {type(module).__name__} ({err})."
        ) from None
    return metadata


def _looks_like_a_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~", "\\"))
        or name.endswith(("/", "\\"))
        or name.count("/") > 1
        or "\\" in name
        or os.path.isabs(name)
    )


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
            raise ValueError(
                f"Expected argument `subfolder` to name a folder inside {str(local)!r}, but {subfolder!r} is not one."
            )
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
        raise ValueError(
            f"Expected argument `{name}` to be a local folder or a Hub repo id ('owner/name'), but there is no folder {str(local)!r}."
        )
    return _download(
        repo_id,
        name,
        subfolder,
        revision=revision,
        cache_dir=cache_dir,
        force_download=force_download,
        local_files_only=local_files_only,
        token=token,
    )


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
        raise HubUnreachableError(
            f"{repo_id!r} is no local folder, and the Hub cannot be reached to download it ({reason}).", reason
        ) from None
    return Path(root) / prefix if prefix else Path(root)
