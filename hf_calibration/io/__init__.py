"""Models and logits in and out: load a classifier and its processor, its logits over a dataset (``predict_logits``),
logits files in memory (``save_logits`` / ``load_logits``) and on disk (``open_logits``, ``LogitsWriter``), and the
logits cache; ``resolve_task``, the one rule that says which head type (multi-class, binary, multi-label) a call is
about."""

from hf_calibration._core.tasks import resolve_task
from hf_calibration.io.disk_logits import DiskLogits, LogitsWriter, open_logits
from hf_calibration.io.inference import predict_logits
from hf_calibration.io.logits_files import Logits, LogitsFileError, load_logits, save_logits

__all__ = [
    "DiskLogits",
    "Logits",
    "LogitsFileError",
    "LogitsWriter",
    "load_logits",
    "open_logits",
    "predict_logits",
    "resolve_task",
    "save_logits",
]
