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
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CHECKPOINT_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

CALIBRATOR_CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A post-hoc calibrator for an image classifier, saved with
[hf_calibration]({{ repo_url | default("https://github.com/hf-calibration/hf-calibration", true) }}).
{{ method_description }} {{ argmax_statement }}

{% if paper_url %}Method: {{ paper_url }}
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


def resolve_checkpoint(
    name_or_path: str | os.PathLike,
    *,
    subfolder: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    force_download: bool = False,
    local_files_only: bool = False,
    token: str | bool | None = None,
) -> Path:
    """A local folder holding the checkpoint: ``name_or_path`` itself (plus ``subfolder``) or a Hub download."""
    if subfolder is not None and not isinstance(subfolder, str):
        raise TypeError(f"Expected argument `subfolder` to be a str, but got {subfolder!r}.")
    local = Path(name_or_path)
    if local.is_dir():
        folder = local / subfolder if subfolder else local
        if not folder.is_dir():
            raise ValueError(f"Expected argument `subfolder` to name a folder inside {str(local)!r}, but {subfolder!r} is not one.")
        return folder
    from huggingface_hub import snapshot_download

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    root = snapshot_download(
        repo_id=str(name_or_path),
        revision=revision,
        cache_dir=cache_dir,
        force_download=force_download,
        local_files_only=local_files_only,
        token=token,
        allow_patterns=[prefix + CONFIG_NAME, prefix + WEIGHTS_NAME, prefix + "README.md"],
    )
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
    folder = resolve_checkpoint(name_or_path, subfolder=subfolder, **download)
    kind = read_config(folder).get("calibrator")
    if kind not in list_calibrators():
        raise ValueError(
            f"Expected the checkpoint's config to name a calibrator among {list_calibrators()} in its `calibrator` field, "
            f"but got {kind!r}: {str(folder)!r} is not an hf_calibration calibrator checkpoint."
        )
    return get_calibrator_class(kind).from_pretrained(folder, **kwargs)
