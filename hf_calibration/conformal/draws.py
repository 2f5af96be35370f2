"""The randomised scores' uniform draws derived from the input: one input, one draw, in any batch and on any call.

A randomised APS / RAPS set depends on one Uniform(0, 1) draw per input. Drawn from a random stream, the same image
gets another set on the next call, or in another batch. A served model should give one answer per input, so
:func:`input_draws` derives each draw from the input itself: the first 53 bits of the keyed BLAKE2b hash of the row's
bytes (key: the predictor's seed), as a float in [0, 1). Different rows get draws that behave as independent uniforms
(a hash is as good as a random stream for the coverage argument, which needs the draws uniform and unrelated to the
labels); the same bytes always get the same draw. Hash what is bit-for-bit the same whatever the batch: an image's
pixel values are (the pipeline hashes those); logits often are not (a batched matrix product may round differently).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

_SCALE = 2.0**-53


def input_draws(rows: Any, seed: int = 0) -> torch.Tensor:
    """One draw in [0, 1) per row of ``rows`` (an (N, ...) tensor or array: pixel values, logits), float64 on the CPU.

    Example:
        >>> x = torch.arange(6.0).reshape(3, 2)
        >>> bool(torch.equal(input_draws(x)[1:], input_draws(x[1:])))  # a row's draw does not depend on its batch
        True
    """
    if isinstance(rows, torch.Tensor):
        array = rows.detach().cpu().contiguous()
        if array.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
            array = array.view(torch.int16)
        array = array.numpy()
    elif isinstance(rows, np.ndarray):
        array = np.ascontiguousarray(rows)
    else:
        raise TypeError(
            f"Expected the rows to draw from to be a torch.Tensor or numpy array, but got {type(rows).__name__}."
        )
    if array.ndim == 0:
        raise ValueError("Expected the rows to draw from to have a batch dimension (shape (N, ...)), but got a scalar.")
    key = int(seed).to_bytes(8, "little", signed=False)
    flat = array.reshape(array.shape[0], -1)
    values = [
        int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8, key=key).digest(), "little") >> 11 for row in flat
    ]
    return torch.tensor(values, dtype=torch.float64) * _SCALE
