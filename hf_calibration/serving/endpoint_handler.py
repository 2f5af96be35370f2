"""Hugging Face Inference Endpoints handler for a calibrated image classifier (written by hf-calibration).

The Endpoint imports this file from the repository and builds ``EndpointHandler(path)`` once, ``path`` being the
repository's folder; each request then calls it with ``{"inputs": ..., "parameters": {...}}``. It serves
``hf_calibration.pipeline("image-classification", model=path)``: scores calibrated by the repository's
``calibrator/``, and with ``conformal/`` every result row carries ``"in_set"`` (every class of the prediction set is
listed, even beyond ``top_k``).

Inputs: an image, or a list of images, each a base64 string (optionally a ``data:image/...;base64,`` URL), raw
bytes, or a PIL image (what the Endpoint passes for a binary ``image/*`` request body); a list runs in batches of
``BATCH_SIZE``. Parameters: ``top_k`` (the pipeline's; a whole number >= 1). Output: the pipeline's, ``[{"label", "score"[, "in_set"]}, ...]`` for one image, a list of those for a
list. Paths and URLs are not read: a server must not open files or fetch addresses its callers name.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

PARAMETERS = ("top_k",)
BATCH_SIZE = 32  # images per forward for a list of images (the pipeline's own default is one at a time)


def _image(item: Any, index: int):
    from PIL import Image

    if isinstance(item, Image.Image):
        return item
    if isinstance(item, str):
        text = item.split(",", 1)[1] if item.startswith("data:") else item
        try:
            item = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                f"Expected input {index} to be a base64-encoded image, but it is not valid base64."
            ) from None
    if isinstance(item, (bytes, bytearray)):
        try:
            image = Image.open(io.BytesIO(item))
            image.load()
        except Exception as err:  # noqa: BLE001 - PIL raises several kinds for undecodable data
            raise ValueError(
                f"Expected input {index} to be an image file (PNG, JPEG, ...), but it could not be decoded ({err})."
            ) from None
        return image
    raise TypeError(
        f"Expected input {index} to be a base64 string, bytes or a PIL image, but got {type(item).__name__}."
    )


class EndpointHandler:
    """``EndpointHandler(path)(data)``: the Inference Endpoints custom-handler contract."""

    def __init__(self, path: str = ""):
        from hf_calibration.serving import pipeline

        self.pipeline = pipeline("image-classification", model=path or ".")

    def __call__(self, data: Any) -> Any:
        if not isinstance(data, dict):
            data = {"inputs": data}
        if "inputs" not in data:
            raise ValueError("Expected the request to hold `inputs` (an image or a list of images).")
        inputs, parameters = data["inputs"], data.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise TypeError(f"Expected `parameters` to be an object, but got {type(parameters).__name__}.")
        unknown = sorted(set(parameters) - set(PARAMETERS))
        if unknown:
            raise ValueError(f"Unexpected parameter(s) {unknown}: this endpoint takes {list(PARAMETERS)}.")
        if "top_k" in parameters:
            top_k = parameters["top_k"]
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise ValueError(f"Expected parameter `top_k` to be a whole number >= 1, but got {top_k!r}.")
        batch = isinstance(inputs, list)
        images = [_image(item, i) for i, item in enumerate(inputs if batch else [inputs])]
        if not images:
            raise ValueError("Expected at least one image in `inputs`, but the list is empty.")
        results = self.pipeline(images, batch_size=min(len(images), BATCH_SIZE), **parameters)
        return results if batch else results[0]
