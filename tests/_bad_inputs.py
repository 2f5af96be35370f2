"""The bad-input suite's machinery: a :class:`Case` is one call a new user makes with bad or tricky input, and what it
must do; :func:`check` asserts it; :func:`case_params` turns builders into ``parametrize`` values.

A case passes when the call

* raises a ``ValueError`` / ``TypeError`` (the command line: exit status 1 or 2 with one line on stderr; the Hub: a
  ``ConnectionError`` sentence) whose first line names one of ``names`` (the argument, option or file at fault), or
* returns a value equal, within ``atol``, to ``reference()``: an independent computation (the numpy / scipy formulas
  below on clean float64 input, relplot for smECE, scipy for the temperature);

and, where ``warns`` is given, warned with that text; and, where ``untouched`` is given, left the user's files as they
were. A case with both ``names`` and ``reference`` documents two acceptable outcomes (refuse naming the flag, or
get the right value); anything else (a wrong value, bad input accepted, another exception, an error naming nothing, a
user's file replaced) fails.

The builders run when pytest collects the modules (tiny arrays, quick fits; slower set-up is :func:`shared`, built by
the first case that needs it), writing into one temporary folder removed at exit; the cases run as tests, in order (a few read files an earlier one wrote).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch


@dataclass
class Case:
    category: str
    area: str  # metrics / calibrators / losses / CLI / ...
    name: str
    call: Callable[[], Any]
    names: tuple[str, ...] = ()  # a clear error names one of these (argument, option or file)
    reference: Callable[[], Any] | None = None  # the right value, computed independently; None: only an error is right
    atol: float = 1e-9
    untouched: Callable[[], bool] | None = None  # after the call: the user's files are as they were
    warns: str | None = None  # the call must warn with this text (documented handling that is not an error)


def check(case: Case) -> None:
    """Assert the documented outcome of ``case`` (see the module docstring)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = case.call()
    except (ValueError, TypeError, ConnectionError) as err:  # ConnectionError: the Hub, unreachable
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        assert case.names, f"refused with {type(err).__name__}: {message}; expected a value"
        assert any(n in message for n in case.names), (
            f"{type(err).__name__} naming none of {list(case.names)}: {message}"
        )
        assert case.untouched is None or case.untouched(), f"a user's file changed ({type(err).__name__}: {message})"
        return
    assert case.untouched is None or case.untouched(), "a user's file changed"
    assert case.reference is not None, (
        f"accepted, returned {_short(value)}; expected an error naming {list(case.names)}"
    )
    if case.warns is not None:
        seen = [str(w.message) for w in caught]
        assert any(case.warns in text for text in seen), f"no warning saying {case.warns!r}; got {seen}"
    expected = case.reference()
    if not _close(value, expected, case.atol):
        off = _max_difference(value, expected)
        raise AssertionError(
            f"returned {_short(value)}, expected {_short(expected)}"
            + (f" (off by {off:.2g}, tolerance {case.atol:g})" if off is not None else "")
        )


def shared(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make()`` once, when the first case that needs it runs (a fitted calibrator, a saved folder: set-up too slow to
    build at collection, where a run that deselects every case would pay for it)."""
    return functools.cache(make)


_ROOT: list[Path] = []


def _workdir() -> Path:
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="hf_calibration_bad_inputs_")))
        atexit.register(shutil.rmtree, _ROOT[0], ignore_errors=True)
    return _ROOT[0]


def case_params(*builders: Callable[[Path], list[Case]]) -> list:
    """The cases of ``builders`` (each given its own empty folder) as ``parametrize`` values, one a case, named by it."""
    params = []
    log = logging.getLogger("hf_calibration")
    for build in builders:
        folder = _workdir() / build.__name__
        folder.mkdir()
        level = log.level
        log.setLevel(logging.ERROR)  # the fits of the set-up, quietly; the cases log as usual
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = build(folder)
        finally:
            log.setLevel(level)
        params += [pytest.param(case, id=f"{case.category} | {case.name}") for case in built]
    return params


def _close(a, b, atol) -> bool:
    if isinstance(a, (dict, list, str, bool, tuple)) or isinstance(b, (dict, list, str, bool, tuple)):
        return a == b
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= atol))


def _max_difference(a, b) -> float | None:
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            return float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else None
    except (TypeError, ValueError):
        return None


def _short(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    if isinstance(v, (np.ndarray, torch.Tensor)):
        return f"array{tuple(v.shape)}"
    text = repr(v)
    return text if len(text) < 80 else text[:77] + "..."


# ----------------------------------------------------------------------------- independent references (numpy, float64)


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _bins(p: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bins lo < p <= hi on (0, 1]; p = 0 in the first bin."""
    return np.clip(np.ceil(p * n_bins).astype(np.int64) - 1, 0, n_bins - 1)


def _binned_gaps(conf, hit, index, n_bins):
    count = np.bincount(index, minlength=n_bins)
    gap = np.abs(np.bincount(index, conf, n_bins) - np.bincount(index, hit, n_bins))
    return count, gap


def ref_ece(p, y, n_bins=15):
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    _, gap = _binned_gaps(conf, hit, _bins(conf, n_bins), n_bins)
    return gap.sum() / len(y)


def ref_mce(p, y, n_bins=15):
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    count, gap = _binned_gaps(conf, hit, _bins(conf, n_bins), n_bins)
    return max(g / c for g, c in zip(gap, count) if c)


def ref_adaece(p, y, n_bins=15):
    """Equal-count bins of the sorted confidences (len(y) divisible by n_bins here: no rounding choice)."""
    conf, hit = p.max(1), (p.argmax(1) == y).astype(float)
    order = np.argsort(conf, kind="stable")
    return sum(abs(conf[b].sum() - hit[b].sum()) for b in np.array_split(order, n_bins)) / len(y)


def ref_classwise_ece(p, y, n_bins=15):
    k = p.shape[1]
    return np.mean(
        [
            _binned_gaps(p[:, c], (y == c).astype(float), _bins(p[:, c], n_bins), n_bins)[1].sum() / len(y)
            for c in range(k)
        ]
    )


def ref_brier(p, y):
    return float(((p - np.eye(p.shape[1])[y]) ** 2).sum(1).mean())


def ref_nll(p, y):
    return float(-np.log(p[np.arange(len(y)), y]).mean())


def ref_nll_logits(z, y):
    """Mean of ``logsumexp(z_i) - z_iy`` in extended precision (long double: no overflow for float64 logits near 1e308)."""
    z = np.asarray(z, dtype=np.longdouble)
    top = z.max(axis=1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    return float((lse - z[np.arange(len(y)), y]).mean())


def ref_smece(p, y):
    import relplot

    return float(relplot.smECE(p.max(1), (p.argmax(1) == y).astype(float)))


def ref_ts_temperature(z, y, bounds=(0.05, 100.0)):
    """The NLL-optimal temperature by scipy (bounded scalar search in log T), in temperature scaling's range."""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    z = np.asarray(z, dtype=np.float64)
    nll = lambda t: -log_softmax(z / np.exp(t), axis=1)[np.arange(len(y)), y].mean()  # noqa: E731
    return float(np.exp(minimize_scalar(nll, bounds=np.log(bounds), method="bounded", options={"xatol": 1e-10}).x))


# ----------------------------------------------------------------------------- data


def make_data(n=600, k=5, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = 3.0 * (rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y]) + rng.normal(scale=4.0, size=(n, 1))
    return z, y


Z, Y = make_data()
P = softmax(Z)
Z32 = Z.astype(np.float32)
K = Z.shape[1]

# softmax of N(0, 3) logits, 5000 rows, so a defect can sit before or after row 4096
Z5 = np.random.default_rng(0).normal(size=(5000, 5)) * 3
Y5 = Z5.argmax(1)
P5 = softmax(Z5)
DEFECTS = {
    "row x 1.02": lambda r: r * 1.02,
    "a value -1e-9": lambda r: np.r_[-1e-9, r[1:]],
    "a value 1 + 1e-7": lambda r: np.r_[1 + 1e-7, r[1:]],
}


def malformed(row: int, defect: str) -> np.ndarray:
    bad = P5.copy()
    bad[row] = DEFECTS[defect](bad[row])
    return bad


MIXED = {
    "probabilities then logits": np.vstack([P5[:100], np.log(P5[100:]) + 2.0]),
    "logits then probabilities": np.vstack([np.log(P5[:100]) + 2.0, P5[100:]]),
}


# ----------------------------------------------------------------------------- the command line, files, warnings, models


@contextlib.contextmanager
def own_tempdir(folder: Path):
    """``tempfile``'s folder is ``folder`` (created empty) inside the block: what a call leaves there is its own, whatever
    other processes do in the system's temporary folder."""
    folder.mkdir()
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved


def cli(*argv) -> str:
    """Run ``hf-calibration`` in-process. A one-line error (exit 1 or 2) becomes a ValueError carrying that line; a
    traceback or several lines a RuntimeError (a crash); success returns stdout."""
    from hf_calibration.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_info:
            code = exit_info.code
    lines = err.getvalue().strip().splitlines()
    if code == 0:
        return out.getvalue()
    if code in (1, 2) and len(lines) == 1 and "Traceback" not in lines[0]:
        raise ValueError(lines[0])
    raise RuntimeError(f"exit {code}, stderr: {' / '.join(lines[-3:])}")


def cli_err(*argv) -> tuple[str, str]:
    """``cli`` that also returns stderr on success (warnings a command prints while it works)."""
    from hf_calibration.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_info:
            code = exit_info.code
    lines = err.getvalue().strip().splitlines()
    if code == 0:
        return out.getvalue(), err.getvalue()
    if code in (1, 2) and lines and "Traceback" not in err.getvalue():
        raise ValueError(lines[-1])
    raise RuntimeError(f"exit {code}, stderr: {' / '.join(lines[-3:])}")


def refuse(token):
    raise ValueError(f"non-standard JSON token {token}")


def stderr_count(call, text):
    err = io.StringIO()
    handler = logging.StreamHandler(err)
    logging.getLogger("hf_calibration").addHandler(handler)
    try:
        call()
    finally:
        logging.getLogger("hf_calibration").removeHandler(handler)
    return err.getvalue().count(text)


def snapshot(folder: Path) -> dict[str, bytes]:
    return (
        {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        if folder.exists()
        else {}
    )


def unchanged(folder: Path) -> Callable[[], bool]:
    """A check that ``folder`` (files and all) is as it is now."""
    before = snapshot(folder)
    return lambda: snapshot(folder) == before


def warns_user(call: Callable[[], Any]) -> tuple[Any, bool]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call()
    return value, any(issubclass(w.category, UserWarning) for w in caught)


def warned(call: Callable[[], Any], category) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return any(issubclass(w.category, category) for w in caught)


def tiny_vit(image_size: int = 8):
    """A tiny random-init ViT classifier (config-built: nothing downloaded)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=image_size,
        patch_size=4,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=K,
    )
    return ViTForImageClassification(config).eval()


def tiny_model_folder(folder: Path) -> Path:
    tiny_vit().save_pretrained(folder)
    return folder


def tiny_pipeline():
    from transformers import ViTImageProcessor, pipeline

    processor = ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return pipeline("image-classification", model=tiny_vit(), image_processor=processor, device="cpu"), torch.randn(
        4, 3, 8, 8
    )


def saved_route(tmp: Path) -> tuple[Path, Path]:
    """A tiny ViT folder (with its image processor) and a save_to_disk dataset of 8 x 8 RGB images (60 validation, 24 test
    validation splits, an unlabelled `nolabels` dataset beside it)."""
    import datasets
    from PIL import Image
    from transformers import ViTImageProcessor

    model = tmp / "vit"
    if not model.exists():
        tiny_vit().save_pretrained(model)
        ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
            model
        )
        rng = np.random.default_rng(0)
        features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=K)})
        splits = {}
        for split, n in (("validation", 60), ("test", 24)):  # SMART fits on 50 samples at least
            images = [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(n)]
            splits[split] = datasets.Dataset.from_dict(
                {"img": images, "label": list(rng.integers(0, K, n))}, features=features
            )
        datasets.DatasetDict(splits).save_to_disk(str(tmp / "data"))
        unlabelled = splits["test"].map(lambda row: {"label": -1})
        datasets.DatasetDict({"test": unlabelled}).save_to_disk(str(tmp / "nolabels"))
    return model, tmp / "data"
