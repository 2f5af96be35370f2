"""Calibrators fitted to survive shift: the held-out images perturbed at a range of strengths, the calibrator fitted on
the union (Tomani, Gruber, Erdem, Cremers and Buettner, "Post-hoc Uncertainty Calibration for Domain Drift
Scenarios", CVPR 2021).

A calibrator fitted on clean held-out data learns how confident the model should be on clean data; under shift the
model is less accurate but hardly less confident. Tomani et al. perturb the validation images with generic noise of
growing strength, so that the model's accuracy runs from its clean value down to chance, and fit the calibrator on
all of them together: it then sees, during its fit, logits whose confidence the data do not support.

The perturbation here is theirs, additive Gaussian noise on the pixels in [0, 1] (clipped), ``x + strength * N(0, 1)``,
each image with its own seeded noise; the benchmark corruptions (``hf_calibration.shift.corrupt``) are an option
(``perturbation="corruptions"``: each level a severity, the corruptions taken in turn over the images). The strengths:
``levels`` values from 0 up to the strength at which the model's accuracy on the held-out images first falls to within
``chance_margin`` of chance (found by doubling, then bisection), evenly spaced, so the accuracies reached span clean to
near chance (:func:`strength_schedule`). The recipe (perturbation, strengths, seed, the accuracy at each level and the
number of images) is stored in the calibrator's ``fit_info_["shift_fit"]``, its config and its card.

The price is paid on unshifted data: a map fitted to the whole range is under-confident on clean inputs (on CIFAR-10,
`benchmarks/RESULTS.md` "shift.py study", TS fitted this way had a clean ECE of 9.8 % against 1.3 % fitted on clean
data). The fit measures it on the held-out images it was given, with no further data: ``shift_fit["clean_ece"]``
(the fitted map on the unperturbed level) against ``shift_fit["clean_only_ece"]`` (the same method fitted on that
level alone), and warns (:class:`ShiftTradeoffWarning`) when the first is more than ``TRADEOFF_POINTS`` points above.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_calibration.shift.transform import ImageChangingProcessor

__all__ = [
    "PERTURBATIONS",
    "TOMANI_REFERENCE",
    "ShiftTradeoffWarning",
    "fit_for_shift",
    "fit_on_perturbed",
    "perturb",
    "strength_schedule",
]

logger = logging.getLogger(__name__)

TOMANI_REFERENCE = (
    "C. Tomani, S. Gruber, M. E. Erdem, D. Cremers, F. Buettner, Post-hoc Uncertainty Calibration for Domain Drift "
    "Scenarios, CVPR 2021"
)
PERTURBATIONS = ("gaussian_noise", "corruptions")
TRADEOFF_POINTS = 2.0  # clean ECE points above a clean-only fit beyond which fit_on_perturbed warns


class ShiftTradeoffWarning(UserWarning):
    """A calibrator fitted for shift is markedly worse calibrated on unshifted data than one fitted on it alone."""


def perturb(images: np.ndarray, strength: float, *, seed: int = 0, offset: int = 0) -> np.ndarray:
    """``images`` ((N, H, W, C) or (N, H, W): uint8 or uint16 pixels over their whole range, or floats in [0, 1]) with
    Gaussian noise of standard deviation ``strength`` (in units of that range) added and clipped, in their own dtype;
    image ``i`` draws its noise from the seed ``(seed, offset + i)``, the same noise at every strength (so the accuracy
    falls monotonically with it). Other dtypes raise ``TypeError``, floats outside [0, 1] (or NaN) ``ValueError``."""
    from hf_calibration._core.checks import check_float

    strength = check_float(strength, "strength", minimum=0.0)
    images = np.asarray(images)
    if images.dtype.kind == "f":
        if images.size and not (images.min() >= 0 and images.max() <= 1):
            raise ValueError(
                "Expected `images` of a float dtype to hold pixels in [0, 1], but they range over "
                f"[{images.min()}, {images.max()}]: scale them to [0, 1] (or pass uint8 pixels)."
            )
    elif images.dtype not in (np.uint8, np.uint16):
        raise TypeError(f"Expected `images` to be uint8, uint16 or float pixels in [0, 1], but got {images.dtype}.")
    return (
        np.stack([_noisy(images[i], strength, (seed, offset + i)) for i in range(images.shape[0])])
        if len(images)
        else images
    )


def _noisy(image: np.ndarray, strength: float, seed) -> np.ndarray:
    """``image`` (uint8 or uint16 over its whole range, or floats in [0, 1]) with the noise, in its own dtype."""
    noise = np.random.default_rng(seed).standard_normal(image.shape, dtype=np.float32)
    work = np.result_type(image.dtype, np.float32)
    if image.dtype.kind == "f":
        return np.clip(image.astype(work) + work.type(strength) * noise, 0, 1).astype(image.dtype)
    top = float(np.iinfo(image.dtype).max)
    x = image.astype(np.float32) / np.float32(top) + np.float32(strength) * noise
    return np.clip(np.rint(x * np.float32(top)), 0, top).astype(image.dtype)


def strength_schedule(
    accuracy_of: Callable[[float], float],
    *,
    levels: int = 10,
    num_classes: int,
    chance_margin: float = 0.1,
    max_strength: float = 4.0,
) -> tuple[list[float], list[float]]:
    """``levels`` strengths from 0 to the first strength at which ``accuracy_of(strength)`` (the model's accuracy on the
    perturbed held-out images) is within ``chance_margin`` of the way from chance to the clean accuracy, evenly spaced;
    and the accuracy at each. The top strength is found by doubling from 0.05, then 12 bisection steps."""
    from hf_calibration._core.checks import check_float, check_int

    levels = check_int(levels, "levels", minimum=2)
    chance_margin = check_float(chance_margin, "chance_margin", minimum=0.0, maximum=1.0, min_inclusive=False)
    chance = 1.0 / num_classes
    clean = accuracy_of(0.0)
    goal = chance + chance_margin * max(clean - chance, 0.0)
    low, high = 0.0, 0.05
    while accuracy_of(high) > goal:
        low, high = high, 2 * high
        if high > max_strength:
            high = max_strength
            break
    for _ in range(12):
        mid = (low + high) / 2
        if accuracy_of(mid) > goal:
            low = mid
        else:
            high = mid
    strengths = [float(s) for s in np.linspace(0.0, high, levels)]
    return strengths, [clean] + [accuracy_of(s) for s in strengths[1:]]


def fit_on_perturbed(
    logits: Sequence[np.ndarray],
    labels: np.ndarray,
    method: str = "ets",
    *,
    recipe: dict[str, Any],
    progress_bar: bool = False,
    **calibrator_kwargs: Any,
):
    """Fit ``method`` (any registered softmax calibrator) on the union of the logits of every perturbation level (each
    an (N, K) array of the same N held-out images, ``labels`` theirs) and record ``recipe`` in ``fit_info_["shift_fit"]``,
    with what the fit costs on the unperturbed level (``recipe["strengths"]`` 0, when there is one: see the module
    docstring). ``recipe["strengths"]`` and ``recipe["levels"]``, when given, describe one level each of ``logits``:
    another count raises ``ValueError``, as levels of different shapes do."""
    return _fit_on_perturbed(logits, labels, method, recipe, progress_bar, calibrator_kwargs, stacklevel=3)


def _fit_on_perturbed(logits, labels, method, recipe, progress_bar, calibrator_kwargs, *, stacklevel: int):
    from hf_calibration._core.checks import check_classification_shapes
    from hf_calibration.calibrators import create_calibrator

    if not logits:
        raise ValueError("Expected `logits` of at least one perturbation level, but got none.")
    levels, labels = [np.asarray(z) for z in logits], np.asarray(labels)
    for i, z in enumerate(levels):
        check_classification_shapes(z, labels, f"logits[{i}]", "labels")
        if z.shape[1] != levels[0].shape[1]:
            raise ValueError(
                f"Expected every level of `logits` to have the same K classes, but logits[0] has K = "
                f"{levels[0].shape[1]} and logits[{i}] K = {z.shape[1]}."
            )
    described = {
        "strengths": len(recipe["strengths"]) if "strengths" in recipe else None,
        "levels": recipe.get("levels"),
    }
    for key, count in described.items():
        if count is not None and count != len(levels):
            raise ValueError(
                f"Expected argument `recipe` to describe the {len(levels)} levels of `logits`, but its {key!r} "
                f"gives {count}."
            )
    union = np.concatenate(levels)
    union_labels = np.tile(labels, len(levels))
    calibrator = create_calibrator(method, **calibrator_kwargs)
    if getattr(calibrator, "_sigmoid_head", False):
        raise ValueError(f"Expected a softmax calibrator for fit_for_shift, but {method!r} calibrates a sigmoid head.")
    calibrator.fit(union, union_labels, from_logits=True, progress_bar=progress_bar)
    strengths = list(recipe.get("strengths", []))
    clean_ece = clean_only_ece = None
    if 0.0 in strengths:
        clean = levels[strengths.index(0.0)]
        clean_ece, clean_only_ece = _clean_tradeoff(calibrator, clean, labels, method, **calibrator_kwargs)
    calibrator.fit_info_["shift_fit"] = {
        "reference": TOMANI_REFERENCE,
        "num_images": int(len(labels)),
        **recipe,
        "clean_ece": clean_ece,
        "clean_only_ece": clean_only_ece,
    }
    if clean_ece is not None:  # the ladder a deployment batch is placed on, without labels (shift.ladder)
        from hf_calibration.shift.ladder import ladder_table

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the per-level temperature fits' own notes (a level near chance)
            calibrator.fit_info_["shift_fit"]["ladder"] = ladder_table(calibrator, levels, labels)
    if clean_ece is not None and clean_ece - clean_only_ece > TRADEOFF_POINTS / 100:
        warnings.warn(
            f"Fitted for shift, this {method} calibrator is under-confident on unshifted data: ECE {100 * clean_ece:.1f} % "
            f"on the clean held-out images against {100 * clean_only_ece:.1f} % for {method} fitted on them alone. Use it "
            "where strong shift is expected; otherwise fit on clean data, or place a deployment batch on the ladder this "
            "fit recorded (hf_calibration.shift.adapt_on_ladder).",
            ShiftTradeoffWarning,
            stacklevel=stacklevel,
        )
    return calibrator


def _clean_tradeoff(calibrator, clean: np.ndarray, labels: np.ndarray, method: str, **calibrator_kwargs: Any):
    """``(ECE of the fitted map on the clean level, ECE of the method fitted on the clean level alone)``, 15 bins, on
    the held-out images themselves: what fitting for shift costs on unshifted data."""
    import warnings

    import torch

    from hf_calibration.calibrators import create_calibrator
    from hf_calibration.metrics import ece

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the clean-only fit's own held-out notes are not this fit's
        clean_only = create_calibrator(method, **calibrator_kwargs).fit(
            clean, labels, from_logits=True, progress_bar=False
        )
    scores = [
        float(ece(fitted(torch.from_numpy(clean), from_logits=True).double().numpy(), labels))
        for fitted in (calibrator, clean_only)
    ]
    return scores[0], scores[1]


class PerturbingProcessor(ImageChangingProcessor):
    """An image processor that adds the seeded Gaussian noise of :func:`perturb` to each image, then calls the model's own
    processor; its ``to_dict()`` names the perturbation, so a logits cache keeps one entry per strength."""

    def __init__(self, processor: Any, strength: float, seed: int = 0):
        self.processor, self.strength, self.seed = processor, float(strength), int(seed)

    def _change(self, image, seed):
        return _noisy(np.asarray(image), self.strength, seed)

    def _what(self):
        return "perturbation", {"name": "gaussian_noise", "strength": self.strength, "seed": self.seed}


def fit_for_shift(
    model: Any,
    dataset: Any,
    method: str = "ets",
    *,
    image_processor: Any = None,
    split: str | None = "validation",
    levels: int = 10,
    strengths: Sequence[float] | None = None,
    perturbation: str = "gaussian_noise",
    seed: int = 0,
    chance_margin: float = 0.1,
    progress_bar: bool = True,
    calibrator_kwargs: dict[str, Any] | None = None,
    **predict_kwargs: Any,
):
    """A calibrator fitted to survive shift (module docstring): the held-out ``split`` of ``dataset`` perturbed at
    ``levels`` strengths (from clean to near chance), ``method`` fitted on the union of their logits.

    Args:
        model: a model folder / Hub id or a model object; image_processor: its processor (default: loaded with it).
        dataset, split: the held-out (calibration) images; never the test split.
        method: any registered softmax calibrator (``"ets"``, ``"temperature_scaling"``, ``"smart"``, ...).
        levels: how many strengths (the clean images are the first); strengths: explicit ones instead (then no search).
        perturbation: ``"gaussian_noise"`` (Tomani et al.'s generic perturbation) or ``"corruptions"`` (level ``l``
            applies the benchmark corruptions at severity ``l``, ``levels`` at most 6).
        seed: the noise's seed. chance_margin: how close to chance the strongest level goes (module docstring).
        **predict_kwargs: ``batch_size``, ``image_column``, ``label_column``, ``max_samples``, ``device``, ... (see
            :func:`hf_calibration.io.predict_logits`).

    Returns:
        the fitted calibrator; ``fit_info_["shift_fit"]`` holds the recipe (perturbation, strengths, seed, the accuracy
        reached at each level, the number of images), which its config and card carry. It saves, loads, attaches,
        exports and serves like any calibrator.
    """
    from hf_calibration._core.checks import check_choice, check_float, check_int
    from hf_calibration.io.data import load_image_dataset
    from hf_calibration.io.inference import _best_device, predict_logits
    from hf_calibration.io.model_loading import load_image_classifier

    check_choice(perturbation, "perturbation", PERTURBATIONS)
    seed = check_int(seed, "seed", minimum=0)
    if strengths is not None:
        strengths = [check_float(s, "strengths", minimum=0.0) for s in strengths]
        if not strengths:
            raise ValueError("Expected argument `strengths` to hold at least one noise level, but got none.")
    model, processor = load_image_classifier(model, image_processor, revision=predict_kwargs.pop("revision", None))
    if predict_kwargs.get("device") is None:
        predict_kwargs["device"] = _best_device()
    predict_kwargs.setdefault("progress", progress_bar)
    data = load_image_dataset(dataset, split, config_name=predict_kwargs.pop("config_name", None))
    cache: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def logits_at(level: float) -> tuple[np.ndarray, np.ndarray]:
        if level not in cache:
            if perturbation == "gaussian_noise":
                proc = processor if level == 0 else PerturbingProcessor(processor, level, seed)
            else:
                from hf_calibration.shift.model import CorruptingProcessor
                from hf_calibration.shift.parameters import BENCHMARK_CORRUPTIONS

                severity = int(level)
                proc = (
                    processor
                    if severity == 0
                    else _RotatingCorruptions(processor, BENCHMARK_CORRUPTIONS, severity, seed, CorruptingProcessor)
                )
            z, y = predict_logits(model, data, proc, split=None, **predict_kwargs)
            cache[level] = (np.asarray(z), np.asarray(y))
        return cache[level]

    def accuracy_of(level: float) -> float:
        z, y = logits_at(level)
        return float((z.argmax(axis=1) == y).mean())

    num_classes = logits_at(0.0)[0].shape[1]
    if perturbation == "corruptions":
        levels = check_int(levels, "levels", minimum=2)
        if levels > 6:
            raise ValueError(
                f"Expected argument `levels` to be at most 6 with perturbation='corruptions' (clean and "
                f"severities 1-5), but got {levels}."
            )
        strengths = [float(s) for s in range(levels)]
        accuracies = [accuracy_of(s) for s in strengths]
    elif strengths is None:
        strengths, accuracies = strength_schedule(
            accuracy_of, levels=levels, num_classes=num_classes, chance_margin=chance_margin
        )
    else:
        accuracies = [accuracy_of(s) for s in strengths]
    labels = logits_at(strengths[0])[1]
    recipe = {
        "perturbation": perturbation,
        "strengths": strengths,
        "seed": seed,
        "accuracies": accuracies,
        "levels": len(strengths),
    }
    logger.info(
        "fit_for_shift: %s on %d images x %d levels, accuracies %s",
        method,
        len(labels),
        len(strengths),
        ", ".join(f"{a:.3f}" for a in accuracies),
    )
    return _fit_on_perturbed(
        [logits_at(s)[0] for s in strengths],
        labels,
        method,
        recipe,
        progress_bar,
        dict(calibrator_kwargs or {}),
        stacklevel=3,
    )


class _RotatingCorruptions:
    """The benchmark corruptions at one severity spread over the images: each image gets the corruption its pixels'
    hash picks (so any batch order, or worker, gives the same), then the model's processor."""

    def __init__(self, processor: Any, names: Sequence[str], severity: int, seed: int, corrupting: type):
        self.inner = [corrupting(processor, name, severity, seed=seed) for name in names]
        self.processor, self.severity, self.seed = processor, severity, seed

    def __call__(self, images, **kwargs):
        import zlib

        import torch

        from hf_calibration.shift.transform import _to_pil

        out = []
        for image in images:
            pick = zlib.crc32(_to_pil(image)[0].tobytes()) % len(self.inner)
            out.append(self.inner[pick]([image], **kwargs)["pixel_values"][0])
        return {"pixel_values": torch.stack(out)}

    def to_dict(self) -> dict[str, Any]:
        inner = self.processor.to_dict() if hasattr(self.processor, "to_dict") else repr(self.processor)
        return {
            "processor": inner,
            "perturbation": {"name": "corruptions", "severity": self.severity, "seed": self.seed},
        }
