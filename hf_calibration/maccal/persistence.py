"""How a model carries MaC-Cal's bottleneck head: its config, and loading it back the way transformers users do.

:func:`install_head` puts the head in the model and records it in the model's config:
``config.maccal_head = {"path", "in_features", "hidden", "num_labels", "base_model_type"}``, and the config becomes
an instance of :func:`maccal_config_class` of its own class — the same class, whose ``model_type`` is
``"hf_calibration_maccal"``. So the ``config.json`` that ``save_pretrained`` (and ``Trainer.save_model``) writes
names the head, and:

* once ``hf_calibration`` is imported (before or after transformers: the package registers itself when
  transformers loads its Auto classes), ``AutoConfig`` / ``AutoModelForImageClassification.from_pretrained(path)``
  and ``pipeline("image-classification", model=path)`` rebuild the bottleneck head and load it strictly, through
  :func:`load_maccal_model`;
* without it, transformers cannot build a model of that type and refuses the checkpoint (its error names the model
  type ``hf_calibration_maccal``) instead of building a random linear head.

Checkpoints written before this format (the backbone's own ``model_type`` and a ``maccal_head`` entry) still load
with :func:`load_maccal_model`.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import torch
from torch import nn

from hf_calibration._core.features import find_classifier_head
from hf_calibration.maccal.head import MaskedBottleneckHead

__all__ = [
    "CONFIG_KEY",
    "MODEL_TYPE",
    "MaCCalAutoConfig",
    "MaCCalForImageClassification",
    "head_path",
    "install_head",
    "load_maccal_model",
    "maccal_config_class",
    "register_auto_config",
]

CONFIG_KEY = "maccal_head"
MODEL_TYPE = "hf_calibration_maccal"
_SPEC_KEYS = ("path", "in_features", "hidden", "num_labels")
_AUTO_PRIVATE_KWARGS = ("_from_auto", "_commit_hash")
_HUB_KWARGS = ("cache_dir", "force_download", "proxies", "token", "revision", "local_files_only", "subfolder")


# ----------------------------------------------------------------------------- the head inside a model


def head_path(model: nn.Module, head: str | None = None) -> str:
    """Dotted path of the model's classification head (``"classifier"``, ``"classifier.1"``, ``"timm_model.fc"``)."""
    _, _, linear = find_classifier_head(model, head)
    for name, module in model.named_modules():
        if module is linear:
            return name
    raise ValueError(
        "Expected the classification head to be a submodule of `model`, but it is not."
    )  # pragma: no cover


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    *parents, last = path.split(".")
    parent = model.get_submodule(".".join(parents)) if parents else model
    setattr(parent, last, module)


def install_head(model: nn.Module, head: MaskedBottleneckHead, path: str) -> nn.Module:
    """Replace the module at ``path`` by ``head`` and record the head in the model's config (see the module docstring).

    A model without a transformers config (a bare timm model) only gets the head.
    """
    if not isinstance(head, MaskedBottleneckHead):
        raise TypeError(f"Expected argument `head` to be a MaskedBottleneckHead, but got {type(head).__name__}.")
    _set_submodule(model, path, head)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return model
    spec = head.spec(path)
    base = getattr(type(config), "maccal_base", type(config))
    if getattr(base, "model_type", ""):  # a config the Auto classes know: name the head in its model type
        spec["base_model_type"] = base.model_type
        config.__class__ = maccal_config_class(base)
    setattr(config, CONFIG_KEY, spec)
    return model


# ----------------------------------------------------------------------------- the config that names the head


class _MaCCalConfig:
    """Mixin of every :func:`maccal_config_class`: pickles as its backbone's config class plus the head."""

    maccal_base: type

    def __reduce__(self):
        return (_restore_config, (self.maccal_base,), self.__dict__.copy())


def _restore_config(base: type):
    cls = maccal_config_class(base)
    return cls.__new__(cls)


_CONFIG_CLASSES: dict[type, type] = {}


def maccal_config_class(base: type) -> type:
    """The config class of a ``base``-config model that carries a MaC-Cal head.

    A subclass of ``base`` (so the backbone reads it as its own config) whose ``model_type`` is
    ``"hf_calibration_maccal"``, registered with ``AutoModelForImageClassification`` (built once per ``base``).
    """
    if issubclass(base, _MaCCalConfig):
        return base
    cls = _CONFIG_CLASSES.get(base)
    if cls is None:
        from transformers import AutoModelForImageClassification

        register_auto_config()
        cls = type(
            f"MaCCal{base.__name__}",
            (_MaCCalConfig, base),
            {
                "model_type": MODEL_TYPE,
                "maccal_base": base,
                "__module__": __name__,
                "__doc__": maccal_config_class.__doc__,
            },
        )
        # one model class per config class: the Auto classes read (and on `register` check) its `config_class`
        model_cls = type(
            f"{cls.__name__}ForImageClassification", (MaCCalForImageClassification,), {"config_class": cls}
        )
        AutoModelForImageClassification.register(cls, model_cls, exist_ok=True)
        _CONFIG_CLASSES[base] = cls
    return cls


def _head_spec(config: Any, where: str) -> dict:
    spec = config.get(CONFIG_KEY) if isinstance(config, dict) else getattr(config, CONFIG_KEY, None)
    if not isinstance(spec, dict) or not set(_SPEC_KEYS) <= set(spec):
        raise ValueError(
            f"Expected the config in {where} to record a MaC-Cal head (`{CONFIG_KEY}` with {list(_SPEC_KEYS)}), "
            f"but got {spec!r}."
        )
    return spec


class MaCCalAutoConfig:
    """What ``AutoConfig`` finds under ``model_type = "hf_calibration_maccal"``: the backbone's config class,
    extended by :func:`maccal_config_class`, built from the ``config.json``."""

    model_type = MODEL_TYPE

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        base_type = _head_spec(config_dict, "this checkpoint").get("base_model_type")
        if base_type not in CONFIG_MAPPING:
            raise ValueError(
                f"Expected `{CONFIG_KEY}.base_model_type` to name a transformers model type, but got {base_type!r}: "
                "load the model with `hf_calibration.maccal.load_maccal_model(path, model_class=...)`."
            )
        return maccal_config_class(CONFIG_MAPPING[base_type]).from_dict(config_dict, **kwargs)


class MaCCalForImageClassification:
    """What ``AutoModelForImageClassification`` builds for a MaC-Cal config: the backbone's own image classifier
    (``ViTForImageClassification``, ...) whose head is the bottleneck, loaded by :func:`load_maccal_model`."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        if model_args:
            raise TypeError(f"Expected no positional model arguments for a MaC-Cal checkpoint, but got {model_args!r}.")
        # The Auto class's own bookkeeping: the backbone is loaded through the Auto class again, which adds it anew
        # (transformers >= 5.25 passes `_from_auto` in its kwargs and refuses it twice).
        for private in _AUTO_PRIVATE_KWARGS:
            kwargs.pop(private, None)
        return load_maccal_model(pretrained_model_name_or_path, config=config, **kwargs)

    @classmethod
    def _from_config(cls, config, **kwargs):  # AutoModelForImageClassification.from_config: a fresh model
        from transformers import AutoModelForImageClassification

        spec = _head_spec(config, "`config`")
        model = AutoModelForImageClassification.from_config(_backbone_config(config), **kwargs)
        old = model.get_submodule(spec["path"])
        head = MaskedBottleneckHead(spec["in_features"], spec["hidden"], spec["num_labels"]).to(next(old.parameters()))
        return install_head(model, head, spec["path"])


def _backbone_config(config):
    """The same config as an instance of the backbone's own class (what its model class loads with)."""
    base = getattr(type(config), "maccal_base", None)
    if base is None:
        return config
    config = copy.copy(config)
    config.__class__ = base
    return config


def register_auto_config() -> None:
    """Register ``"hf_calibration_maccal"`` with ``AutoConfig`` (idempotent; run when transformers loads its Auto classes)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    AutoConfig.register(MODEL_TYPE, MaCCalAutoConfig, exist_ok=True)


# ----------------------------------------------------------------------------- loading


def _checkpoint_tensors(path: str, prefix: str, hub_kwargs: dict) -> dict[str, torch.Tensor]:
    """Every tensor of a (possibly sharded) safetensors checkpoint, local or on the Hub, whose name starts with ``prefix``."""
    from safetensors import safe_open
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

    single = cached_file(path, SAFE_WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
    if single is not None:
        files = [single]
    else:
        index = cached_file(path, SAFE_WEIGHTS_INDEX_NAME, **hub_kwargs)
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        files = [cached_file(path, name, **hub_kwargs) for name in shards]
    out = {}
    for name in files:
        with safe_open(name, framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    out[key[len(prefix) :]] = f.get_tensor(key)
    return out


def load_maccal_model(path: str | os.PathLike, model_class=None, config=None, **kwargs) -> nn.Module:
    """Load a model saved after MaC-Cal, with its bottleneck head (strict: every weight must fit).

    ``AutoModelForImageClassification.from_pretrained(path)`` and ``pipeline("image-classification", model=path)``
    come here by themselves once ``hf_calibration`` is imported; call it directly for checkpoints written before the
    config named its head, or with ``model_class`` for a model the Auto classes do not know.

    Args:
        path: folder written by ``save_pretrained`` after the MaC-Cal stage, or a Hub repository id.
        model_class: the transformers class of the backbone's classifier; default ``AutoModelForImageClassification``.
        config: the checkpoint's config, when already loaded.
        **kwargs: passed to ``from_pretrained`` (``dtype``, ``device_map``, ``revision``...).

    Returns:
        The backbone's own classifier class (e.g. ``ViTForImageClassification``) with the bottleneck head, in eval mode.

    Example::

        model = load_maccal_model("out/maccal")
        clf = pipeline("image-classification", model=model, image_processor=AutoImageProcessor.from_pretrained("out/maccal"))
    """
    from transformers import AutoConfig, AutoModelForImageClassification
    from transformers.utils import logging as hf_logging

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"Expected argument `path` to be a folder or a Hub repository id, but got {path!r}.")
    path = os.fspath(path)
    hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    want_info = kwargs.pop("output_loading_info", False)
    if config is None:
        register_auto_config()
        try:
            config = AutoConfig.from_pretrained(path, **hub_kwargs)
        except OSError as err:
            raise ValueError(
                f"Expected argument `path` to be a saved model folder or a Hub model, but got {path!r}: {err}"
            ) from err
    spec = _head_spec(config, repr(path))
    prefix = spec["path"] + "."
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the Linear head is reported missing and the bottleneck unexpected: both are checked below
    try:
        model, info = (model_class or AutoModelForImageClassification).from_pretrained(
            path, config=_backbone_config(config), output_loading_info=True, **kwargs
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    stray = [k for k in info.get("missing_keys", []) if not k.startswith(prefix)]
    stray += [k for k in info.get("unexpected_keys", []) if not k.startswith(prefix)]
    stray += list(info.get("mismatched_keys", []))
    if stray:
        raise ValueError(
            f"Checkpoint {path!r} does not fit the model outside the MaC-Cal head: {sorted(map(str, stray))[:10]}."
        )
    old = model.get_submodule(spec["path"])
    weight = old.weight if isinstance(old, nn.Linear) else next(old.parameters())
    head = MaskedBottleneckHead(spec["in_features"], spec["hidden"], spec["num_labels"])
    head.load_state_dict(_checkpoint_tensors(path, prefix, hub_kwargs), strict=True)
    for name, tensor in head.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"Checkpoint {path!r} is corrupted: the MaC-Cal head's {name} holds NaN or inf.")
    head.to(device=weight.device, dtype=weight.dtype).eval()
    install_head(model, head, spec["path"])
    model.eval()
    if want_info:
        info = {k: [x for x in v if not str(x).startswith(prefix)] for k, v in info.items()}
        return model, info
    return model
