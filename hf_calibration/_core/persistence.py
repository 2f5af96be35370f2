"""One persistence for everything the package saves: calibrators, conformal predictors, multi-label predictors.

``Saved`` is the base class (a ``torch.nn.Module`` with huggingface_hub's ``PyTorchModelHubMixin``) that writes and
reads the folder format of :mod:`hf_calibration._core.checkpoints`: ``model.safetensors`` (every buffer and parameter
of the module, with the settings copied into its metadata), ``config.json`` (the constructor's arguments, the kind
under ``checkpoint_key``, ``format_version`` and the ``fit`` record) and the model card. It owns ``save_pretrained``,
``push_to_hub``, ``from_pretrained``, the card and the check that ``config.json`` still says what the weights file
recorded at the save (an edited config is refused; a NaN in a fit record saves and loads, as JSON writes it).

A subclass sets ``checkpoint_key`` / ``checkpoint_what`` / ``save_subfolder`` and its ``kind`` (what is saved under
``checkpoint_key``: override ``checkpoint_kind`` / ``_own_kinds`` where that is not one class-wide name), implements
``_check_fitted``, and may override the hooks (each documented where it is defined):
``_card_values``, ``_check_config``, ``_check_loaded``, ``_before_save``, ``_after_save`` and ``_after_load``.

Arrays whose size is decided by the fit (bin edges, a feature bank): register them as buffers of any size, then
list their names in ``shaped_buffers``; a load gives each the shape the checkpoint holds, then loads strictly.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from hf_calibration._core import checkpoints as hub

logger = logging.getLogger(__name__)

SETTINGS_KEY = "settings"  # weights-file metadata: a copy of what config.json says, so an edited config is refused


def settings_metadata(settings: dict[str, Any]) -> str:
    """``settings`` (a save's constructor arguments and fit record) as the JSON stored in the weights file's metadata."""
    return json.dumps(json.loads(json.dumps(settings)), sort_keys=True)


def first_difference(saved: Any, loaded: Any, path: str = "") -> str | None:
    """The first key path at which two JSON values differ (None: equal; NaN equals NaN)."""
    if isinstance(saved, dict) and isinstance(loaded, dict):
        for key in sorted(set(saved) | set(loaded)):
            where = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in loaded:
                return where
            found = first_difference(saved[key], loaded[key], where)
            if found is not None:
                return found
        return None
    if isinstance(saved, list) and isinstance(loaded, list) and len(saved) == len(loaded):
        for i, (a, b) in enumerate(zip(saved, loaded, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    both_nan = isinstance(saved, float) and isinstance(loaded, float) and saved != saved and loaded != loaded
    return None if saved == loaded or both_nan else path  # a NaN of a fit record reads back as NaN, never equal to it


def check_settings(metadata: dict[str, str], settings: dict[str, Any], where: str, what: str) -> None:
    """Refuse a ``config.json`` that says other than the settings its weights file recorded at the save (saves made
    before they were recorded carry none, and are not checked here)."""
    recorded = metadata.get(SETTINGS_KEY)
    if recorded is None:
        return
    try:
        saved = json.loads(recorded)
    except ValueError:
        saved = None
    found = "the settings recorded in the weights file are not JSON" if saved is None else None
    if found is None:
        difference = first_difference(saved, json.loads(json.dumps(settings)))
        found = None if difference is None else f"{difference} differs from what was saved"
    if found is not None:
        refuse_edited(where, what, found)


def refuse_edited(where: Any, what: str, found: str) -> None:
    """The one error for a ``config.json`` that does not match its weights."""
    raise ValueError(
        f"The {what}'s {f'{where}/{hub.CONFIG_NAME}'!r} does not match its weights ({found}): it was edited after the "
        "save or is corrupted. Save it again rather than editing its config."
    )


class Saved(nn.Module, PyTorchModelHubMixin):
    """Save / load / card / push shared by every saved object (module docstring)."""

    checkpoint_key: ClassVar[str] = ""  # the config.json key naming the kind: "calibrator", "conformal"
    checkpoint_what: ClassVar[str] = ""  # the kind of checkpoint in messages: "calibrator", "conformal predictor"
    save_subfolder: ClassVar[str] = ""  # where to save it beside a model: "calibrator", "conformal"
    format_version: ClassVar[int] = hub.CHECKPOINT_FORMAT_VERSION
    shaped_buffers: ClassVar[tuple[str, ...]] = ()  # buffers whose shape a load takes from the checkpoint

    kind: ClassVar[str] = ""  # the class's name of its checkpoints: "temperature_scaling", "box_logistic"
    fit_info_: dict[str, Any] | None

    @property
    def is_fitted(self) -> bool:
        return self.fit_info_ is not None

    @property
    def checkpoint_kind(self) -> str:
        """The value saved under ``checkpoint_key`` (a calibrator's ``kind``; a conformal predictor's ``method``)."""
        return self.kind

    def _check_fitted(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ hooks
    def _settings(self) -> dict[str, Any]:
        """What decides the outputs and what the card states: the constructor's arguments and the fit record (the copy
        in the weights file's metadata that an edited ``config.json`` is checked against)."""
        return {"init": dict(self._hub_mixin_config or {}), "fit": self.fit_info_}

    def _card_values(self, values: dict[str, Any]) -> dict[str, Any]:
        """The card template's values, given the caller's ``model_card_kwargs`` (which win)."""
        return values

    def _before_save(self, folder: Path, overwrite: bool, card: dict[str, Any]) -> None:
        """Checks (and clean-up) before anything is written; ``card`` (the card's values) may be filled in."""
        hub.check_save_folder(folder, overwrite=overwrite, subfolder=self.save_subfolder)

    def _after_save(self, folder: Path, overwrite: bool, card: dict[str, Any]) -> None:
        """Write what is saved beside the checkpoint (a predictor's calibrator, in its own subfolder); ``card``: the
        card's values, as ``_before_save`` left them."""

    @classmethod
    def _check_config(cls, config: dict, where: Any) -> None:
        """Refuse a config that is not this class's (kind, format version, a ``fit`` record); subclasses add theirs."""
        kind = config.get(cls.checkpoint_key)
        if not cls._is_own_kind(kind):
            raise ValueError(
                f"Expected a {cls.__name__} checkpoint ({cls.checkpoint_key}={cls._own_kinds()!r}), but {str(where)!r} "
                f"holds {cls.checkpoint_key}={kind!r}{cls._wrong_kind_hint(config)}"
            )
        version = config.get("format_version")
        if version != cls.format_version:
            raise ValueError(
                f"Expected checkpoint format_version {cls.format_version}, but {str(where)!r} has {version!r}: "
                "it was written by an incompatible version of hf_calibration."
            )
        if not isinstance(config.get("fit"), dict):
            raise ValueError(
                f"The checkpoint in {str(where)!r} has no `fit` record in its config: it is corrupted or was never fitted."
            )

    @classmethod
    def _own_kinds(cls) -> Any:
        """The kind(s) this class loads: its ``kind``, or a list of them."""
        return cls.kind

    @classmethod
    def _is_own_kind(cls, kind: Any) -> bool:
        kinds = cls._own_kinds()
        return kind in kinds if isinstance(kinds, (list, tuple)) else kind == kinds

    @classmethod
    def _wrong_kind_hint(cls, config: dict) -> str:
        return "."

    def _check_loaded(self, path: str) -> None:
        """Refuse loaded weights that no fit could have given (``path``: the weights file, for the message)."""
        for name, tensor in self.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"The {self.checkpoint_what} weights {path!r} are corrupted: {name} holds NaN or inf.")

    @classmethod
    def _after_load(cls, loaded: Saved, opened: dict[str, Any]) -> Saved:
        """Load what was saved beside the checkpoint; ``opened``: ``folder``, ``config``, ``name_or_path``,
        ``subfolder``, ``download`` (the Hub options) and ``map_location``."""
        return loaded

    # ------------------------------------------------------------------ save
    def _save_pretrained(self, save_directory) -> None:
        from safetensors.torch import save_model

        from hf_calibration._core.version import __version__

        save_model(
            self,
            str(save_directory / hub.WEIGHTS_NAME),
            metadata={
                "format": "pt",
                self.checkpoint_key: self.checkpoint_kind,
                "format_version": str(self.format_version),
                SETTINGS_KEY: settings_metadata(self._settings()),  # an edited config.json is refused at load
            },
        )
        config = {
            **(self._hub_mixin_config or {}),
            self.checkpoint_key: self.checkpoint_kind,
            "format_version": self.format_version,
            "hf_calibration_version": __version__,
            "fit": self.fit_info_,
        }
        (save_directory / hub.CONFIG_NAME).write_text(json.dumps(config, sort_keys=True, indent=2))

    def generate_model_card(self, *args, **kwargs):
        from huggingface_hub import ModelCard, ModelCardData

        values = self._card_values(dict(kwargs))
        info = self._hub_mixin_info
        data = ModelCardData(**info.model_card_data.to_dict())
        task = values.get("pipeline_task")
        data.tags = sorted({*(data.tags or ()), *([task] if task else ())})
        return ModelCard.from_template(
            card_data=data,
            template_str=info.model_card_template,
            repo_url=info.repo_url,
            paper_url=info.paper_url,
            docs_url=info.docs_url,
            **values,
        )

    def save_pretrained(self, save_directory, *, overwrite: bool = False, **kwargs: Any):
        """Write ``model.safetensors``, ``config.json`` and the model card ``README.md`` into ``save_directory``.

        The folder must be new or empty; ``overwrite=True`` replaces an object saved there (every file that save
        wrote, so the card always describes these weights) and allows other files beside it, which are never touched:
        a ``README.md`` the package did not write (or that was edited since) is kept, and the card goes to
        ``README.hf_calibration.md`` (a warning says so). A model's folder is refused even then: save in its
        ``calibrator/`` (or ``conformal/``) subfolder. The files written are recorded, with their SHA-256, in
        ``config.json`` (``files``). Other keyword arguments are ``PyTorchModelHubMixin.save_pretrained``'s
        (``model_card_kwargs``: extra values for the card template).
        """
        self._check_fitted()
        if not isinstance(overwrite, bool):
            raise TypeError(f"Expected argument `overwrite` to be a bool, but got {overwrite!r}.")
        folder = Path(save_directory)
        card = dict(kwargs.get("model_card_kwargs") or {})
        self._before_save(folder, overwrite, card)  # refused before anything is written
        kwargs["model_card_kwargs"] = card  # the mixin writes README.md with them
        out = hub.save_recorded(
            self,
            folder,
            lambda: super(Saved, self).save_pretrained(folder, **kwargs),
            overwrite=overwrite,
            card_kwargs=card,
            subfolder=self.save_subfolder,
        )
        self._after_save(folder, overwrite, card)
        return out

    def push_to_hub(
        self,
        repo_id: str,
        *,
        path_in_repo: str | None = None,
        dry_run: bool = False,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | None = None,
        branch: str | None = None,
        create_pr: bool | None = None,
        model_card_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Upload the checkpoint (weights, config, model card, what is saved beside it) to the Hub repo ``repo_id``;
        returns the commit URL.

        Args:
            repo_id: ``owner/name`` (created if needed).
            path_in_repo: a subfolder of the repo, e.g. ``"calibrator"`` beside a model at the repo root.
            dry_run: build the exact folder that would be uploaded, card included, in a new temporary folder and
                upload nothing; returns that folder's path (the folder is removed when the process exits).
            commit_message, private, token, branch, create_pr: as in ``huggingface_hub.HfApi.upload_folder`` /
                ``create_repo``.
            model_card_kwargs: extra values for the card template.

        Raises ``HubUnreachableError`` (a ``ConnectionError``) with one sentence when the Hub cannot be reached
        (offline mode, no network); the folder that was to be uploaded is kept and named in the message.
        """
        import atexit
        import shutil
        import tempfile

        self._check_fitted()
        hub.check_repo_id(repo_id)
        hub.check_path_in_repo(path_in_repo)
        root = Path(tempfile.mkdtemp(prefix="hf_calibration_push_"))
        folder = root / path_in_repo.strip("/") if path_in_repo else root
        if dry_run:  # the caller reads it; it goes when the process ends, never left behind
            atexit.register(shutil.rmtree, root, ignore_errors=True)
        self.save_pretrained(folder, model_card_kwargs=model_card_kwargs)
        where = f"https://huggingface.co/{repo_id}" + (f"/tree/main/{path_in_repo.strip('/')}" if path_in_repo else "")
        if dry_run:
            logger.info("Dry run: nothing uploaded; the files for %s are in %s", where, folder)
            return str(folder)
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        try:
            repo_id = api.create_repo(repo_id=repo_id, private=private, exist_ok=True).repo_id
            url = api.upload_folder(
                repo_id=repo_id,
                repo_type="model",
                folder_path=str(folder),
                path_in_repo=path_in_repo,
                commit_message=commit_message or f"Upload {self.checkpoint_kind} {self.checkpoint_what}",
                revision=branch,
                create_pr=create_pr,
            )
        except Exception as err:
            reason = hub.unreachable_reason(err)
            if reason is None:
                shutil.rmtree(root, ignore_errors=True)
                raise
            raise hub.HubUnreachableError(
                f"Could not push to {repo_id!r}: the Hugging Face Hub is unreachable ({reason}); nothing was uploaded, "
                f"and the files that would have been are in {str(folder)!r}.",
                reason,
            ) from None
        shutil.rmtree(root, ignore_errors=True)
        return url

    # ------------------------------------------------------------------ load
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, subfolder: str | None = None, **kwargs: Any):
        """Load a checkpoint strictly (wrong kind, format version, shapes, an edited config or a corrupted file:
        ``ValueError``), with what was saved beside it.

        Args:
            pretrained_model_name_or_path: local folder or Hub repo id.
            subfolder: the checkpoint's folder inside it (e.g. ``"calibrator"`` beside a model).
            **kwargs: ``revision``, ``cache_dir``, ``token``, ``local_files_only``, ``force_download``, ``map_location``.
        """
        folder, config, download = hub.open_checkpoint(
            pretrained_model_name_or_path,
            subfolder,
            kwargs,
            who=f"{cls.checkpoint_what.capitalize()}s",
            what=cls.checkpoint_what,
        )
        cls._check_config(config, folder)
        loaded = super().from_pretrained(folder, **kwargs)
        opened = {
            "folder": Path(folder),
            "config": config,
            "name_or_path": pretrained_model_name_or_path,
            "subfolder": subfolder,
            "download": download,
            "map_location": kwargs.get("map_location", "cpu"),
        }
        return cls._after_load(loaded, opened)

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision,
        cache_dir,
        force_download,
        local_files_only,
        token,
        map_location: str = "cpu",
        strict: bool = True,
        config: dict | None = None,
        **model_kwargs,
    ):
        cls._check_config(config or {}, model_id)
        try:
            loaded = cls(**model_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"The checkpoint's config in {model_id!r} does not fit {cls.__name__}: {err}") from None
        metadata = hub.load_weights(loaded, model_id, what=cls.checkpoint_what, map_location=map_location)
        path = os.path.join(model_id, hub.WEIGHTS_NAME)
        if metadata.get(cls.checkpoint_key, loaded.checkpoint_kind) != loaded.checkpoint_kind:
            raise ValueError(
                f"The weights in {path!r} belong to {cls.checkpoint_key}={metadata.get(cls.checkpoint_key)!r}, "
                f"not {loaded.checkpoint_kind!r}."
            )
        loaded.fit_info_ = dict(config["fit"])
        check_settings(metadata, loaded._settings(), model_id, cls.checkpoint_what)
        loaded._check_loaded(path)
        loaded.eval()
        return loaded

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        for name in self.shaped_buffers:  # a fit-sized array takes the checkpoint's shape, then loads strictly
            incoming = state_dict.get(prefix + name)
            current = self._buffers.get(name)
            if isinstance(incoming, torch.Tensor) and current is not None:
                self._buffers[name] = torch.empty(incoming.shape, dtype=current.dtype, device=current.device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
