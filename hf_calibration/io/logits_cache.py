"""The on-disk cache of ``predict_logits``: one ``.npz`` per (model weights, dataset, split, preprocessing).

The key is a hash of everything the logits depend on:

* the model: its class, its config (labels included) and a hash of every tensor of its ``state_dict``
  (name, dtype, shape, bytes), plus the Hub commit it came from and any calibrator attached to it. A
  model whose weights changed by one bit gets a new key, so it is never served stale logits;
* the dataset: its ``datasets`` fingerprint (which changes with its files, ``select``, ``map``...),
  its split and its length;
* the preprocessing: the image processor's configuration, the image and label columns, the colour
  mode images are converted to, and the version of this cache format.

What a key cannot describe is not cached (a warning says why): a forward hook on the model other than an attached
calibrator's, a ``forward`` replaced on the instance, an image processor without ``to_dict()`` (a plain callable,
whose ``repr`` does not change with its code), a dataset without fingerprint.

Beside each ``<key>.npz`` (``logits``, ``labels``) a ``<key>.json`` says in words what it holds.
Writes go to a temporary file renamed into place, so a crashed run never leaves a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "CACHE_FORMAT_VERSION",
    "cache_key",
    "default_cache_dir",
    "load_cached",
    "model_fingerprint",
    "save_cached",
    "uncacheable_reason",
]

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    """``$HF_HOME/hf_calibration/logits`` (``~/.cache/huggingface/hf_calibration/logits`` by default)."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "hf_calibration" / "logits"


def _hash_tensors(digest, tensors) -> None:
    for name, tensor in tensors:
        tensor = tensor.detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)


def model_fingerprint(model: nn.Module) -> dict[str, Any]:
    """What identifies a model's outputs: class, config, a hash of its weights and buffers, Hub commit, attached calibrator."""
    digest = hashlib.blake2b(digest_size=20)
    _hash_tensors(digest, sorted(model.state_dict(keep_vars=False).items()))
    config = getattr(model, "config", None)
    out: dict[str, Any] = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "weights": digest.hexdigest(),
        "config": json.loads(config.to_json_string(use_diff=False)) if hasattr(config, "to_json_string") else None,
        "commit": getattr(config, "_commit_hash", None),
    }
    from hf_calibration.calibrators.attach import attached_calibrator

    calibrator = attached_calibrator(model)
    if calibrator is not None:
        cal_digest = hashlib.blake2b(digest_size=20)
        _hash_tensors(cal_digest, sorted(calibrator.state_dict().items()))
        out["calibrator"] = {"class": type(calibrator).__qualname__, "weights": cal_digest.hexdigest()}
    return out


def _foreign_hooks(model: nn.Module) -> list[str]:
    """Forward hooks and pre-hooks that can change the model's outputs and that the key cannot describe: any on the
    model or a submodule, on the attached calibrator, or registered globally; and a ``forward`` replaced on the instance
    (the attached calibrator's own excepted: the calibrator is keyed by its weights)."""
    from torch.nn.modules import module as torch_module

    from hf_calibration.calibrators.attach import _ATTR

    attachment = model.__dict__.get(_ATTR)
    modules = [("", m) for m in model.modules()] + (
        [("calibrator ", attachment.calibrator)] if attachment is not None else []
    )
    found = []
    for prefix, module in modules:
        where = prefix + type(module).__name__
        own = module is model and attachment is not None and attachment.previous is None
        if "forward" in module.__dict__ and not (own and module.__dict__["forward"] is attachment.forward):
            found.append(f"{where}.forward replaced on the instance")
        for hook in [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]:
            found.append(f"{getattr(hook, '__qualname__', type(hook).__name__)} on {where}")
    for hook in [*torch_module._global_forward_pre_hooks.values(), *torch_module._global_forward_hooks.values()]:
        found.append(f"{getattr(hook, '__qualname__', type(hook).__name__)} (global)")
    return found


def uncacheable_reason(model: nn.Module, processor: Any) -> str | None:
    """Why the logits of ``model`` through ``processor`` cannot be keyed (so must not be cached), or None.

    A key can only hold what can be described: weights, config, an attached calibrator, an image processor's
    ``to_dict()``. A forward hook (or pre-hook) may rewrite the logits in ways no key sees, and a plain callable
    processor has only its ``repr``, which does not change when its code or state does.
    """
    hooks = _foreign_hooks(model)
    if hooks:
        return f"the model has forward hooks the cache cannot key ({'; '.join(hooks[:3])}{'; ...' if len(hooks) > 3 else ''})"
    if _processor_state(processor) is None:
        return (
            f"the processor is a {type(processor).__name__} without to_dict(), whose settings the cache cannot "
            "key (pass a transformers image processor, fast tokenizer or feature extractor to cache)"
        )
    return None


def _processor_state(processor: Any) -> dict[str, Any] | None:
    """What the key holds of the preprocessing: an image processor's or feature extractor's ``to_dict()``; a fast
    tokenizer's class, settings and a hash of its ``tokenizer.json``; None for anything else."""
    if callable(getattr(processor, "to_dict", None)):
        return processor.to_dict()
    backend = getattr(processor, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "to_str", None)):
        return None
    return {
        "class": type(processor).__qualname__,
        "tokenizer": hashlib.sha256(backend.to_str().encode()).hexdigest(),
        "model_max_length": processor.model_max_length,
        "padding_side": processor.padding_side,
        "truncation_side": processor.truncation_side,
    }


def cache_key(
    model: nn.Module,
    processor: Any,
    dataset,
    *,
    split: str | None,
    image_column: str,
    label_column: str,
    image_mode: str | None,
) -> tuple[str, dict[str, Any]]:
    """``(hex key, description)`` for a model run over a dataset; a ``None`` key when the run cannot be keyed
    (``description["not_cached"]`` says why: a dataset without fingerprint, see also :func:`uncacheable_reason`)."""
    fingerprint = getattr(dataset, "_fingerprint", None)
    reason = uncacheable_reason(model, processor)
    if reason is not None:
        return None, {"not_cached": reason}
    description = {
        "format": CACHE_FORMAT_VERSION,
        "model": model_fingerprint(model),
        "dataset": {
            "fingerprint": fingerprint,
            "split": None if split is None else str(split),
            "num_rows": len(dataset),
        },
        "preprocessing": {
            "image_processor": _processor_state(processor),  # the key's name since version 1: any preprocessor
            "image_column": image_column,
            "label_column": label_column,
            "image_mode": image_mode,
        },
    }
    if fingerprint is None:
        return None, {**description, "not_cached": "the dataset has no fingerprint"}
    blob = json.dumps(description, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:40], description


def load_cached(cache_dir: str | os.PathLike, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached ``(logits, labels)`` under ``key``, or None (missing or unreadable: it is recomputed)."""
    path = Path(cache_dir) / f"{key}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return data["logits"], data["labels"]
    except (OSError, ValueError, KeyError) as err:
        logger.warning("ignoring the unreadable logits cache entry %s (%s)", path, err)
        return None


def save_cached(
    cache_dir: str | os.PathLike, key: str, description: dict[str, Any], logits: np.ndarray, labels: np.ndarray
) -> Path | None:
    """Write the entry atomically; a cache that cannot be written is a warning, never an error."""
    folder = Path(cache_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, write in (
            (".json", lambda f: f.write(json.dumps(description, indent=1, sort_keys=True, default=str).encode())),
            (".npz", lambda f: np.savez(f, logits=logits, labels=labels)),
        ):
            with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{key}", suffix=suffix, delete=False) as tmp:
                write(tmp)
            os.replace(tmp.name, folder / f"{key}{suffix}")
    except OSError as err:
        logger.warning("could not write the logits cache in %s (%s); the logits are not cached", folder, err)
        return None
    return folder / f"{key}.npz"
