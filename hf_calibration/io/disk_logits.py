"""Logits larger than memory: :func:`open_logits` reads a file a block of rows at a time; :class:`LogitsWriter` writes one.

The reader is the calibrators' own input type for logits on disk, so it lives in the package's core
(:mod:`hf_calibration._core.disk_logits`, where its file formats are described); this is its public face.
"""

from hf_calibration._core.disk_logits import DiskLogits, LogitsWriter, as_disk_logits, open_logits

__all__ = ["DiskLogits", "LogitsWriter", "as_disk_logits", "open_logits"]
