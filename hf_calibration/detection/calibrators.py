"""Post-hoc calibration of detection scores: score-only maps and a box-conditioned one.

Each maps a detection's score (and, for some, its class logits or its box geometry) to a calibrated score, fitted
on matched held-out detections (``match_detections``) to the target "this detection is a true positive":

* ``DetectionPlatt``: ``sigmoid(a * logit(s) + b)`` (Platt 1999; the score-only baseline of Kuzucu et al. 2024);
* ``DetectionIsotonic``: an isotonic map of the score per predicted class (Oksuz et al. 2023, Sec. 5);
* ``DetectionTemperatureScaling``: one temperature on the class logits of a DETR-style head, the score read off as
  that head does: ``softmax(z / T)[label]`` (DETR, YOLOS: the last logit is "no object") or ``sigmoid(z_label / T)``
  (Deformable / Conditional DETR, RT-DETR);
* ``BoxLogisticCalibration``: ``sigmoid(w . [logit(s), cx, cy, w, h] + b)`` (Küppers et al. 2020, eq. 9; netcal's
  ``LogisticCalibration(detection=True)``).

The isotonic map, the sigmoid temperature and Platt (with a positive slope: scores that rank the fit's true positives
first) are increasing in the score within a class (each class's ranking, hence mAP, is kept); the softmax temperature
and the box-conditioned map are not, and ``fit`` warns when one lowers the ranking AP (``ranking_ap``) of the held-out
(else the fit) detections. All fit by maximum likelihood (binary cross-entropy), Platt and the box logistic map by
Newton's method, the temperature by L-BFGS, in float64. Saved, loaded and pushed like every calibrator
(:class:`hf_calibration._core.persistence.Saved`: ``model.safetensors``, ``config.json`` with the fit record, a model
card with the metrics before / after); ``load_detection_calibrator`` loads any kind.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from hf_calibration._core.persistence import Saved
from hf_calibration._core.vision_card import VISION_CARD_TEMPLATE, metric_rows
from hf_calibration.detection.matching import Detections, _check_threshold
from hf_calibration.detection.metrics import BOX_FEATURES, d_ece, detection_ece, laece, ranking_ap

__all__ = [
    "DETECTION_CALIBRATORS",
    "BoxLogisticCalibration",
    "DetectionCalibrator",
    "DetectionIsotonic",
    "DetectionPlatt",
    "DetectionTemperatureScaling",
    "load_detection_calibrator",
]

_EPS = 1e-12
_CARD_METRICS = {
    "d_ece": "D-ECE",
    "detection_ece": "detection ECE",
    "laece": "LaECE",
    "ranking_ap": "ranking AP (higher is better)",
}
_RANKING_TOLERANCE = 0.005  # a fall of the ranking AP beyond this is reported at fit


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(_EPS, 1 - _EPS)
    return torch.log(p) - torch.log1p(-p)


def _lbfgs(params: list[torch.Tensor], loss_fn, max_iter: int = 200) -> None:
    opt = torch.optim.LBFGS(
        params, lr=1, max_iter=max_iter, tolerance_grad=1e-12, tolerance_change=1e-14, line_search_fn="strong_wolfe"
    )

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)


def _newton_logistic(x: torch.Tensor, target: torch.Tensor, max_iter: int = 100) -> torch.Tensor:
    """Maximum-likelihood logistic regression of ``target`` on ``[x, 1]`` by Newton's method (float64); returns the
    coefficients, the intercept last. A ridge of 1e-10 keeps the Hessian invertible on separable data."""
    design = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)
    w = torch.zeros(design.shape[1], dtype=x.dtype)
    ridge = 1e-10 * torch.eye(design.shape[1], dtype=x.dtype)
    for _ in range(max_iter):
        p = torch.sigmoid(design @ w)
        grad = design.T @ (p - target) / x.shape[0] + ridge @ w
        hess = (design.T * (p * (1 - p))) @ design / x.shape[0] + ridge
        step = torch.linalg.solve(hess, grad)
        w = w - step
        if step.abs().max() < 1e-12:
            break
    return w


def _bce(score_logit: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(score_logit, target)


class DetectionCalibrator(
    Saved,
    library_name="hf_calibration",
    tags=["calibration", "hf_calibration"],  # and "object-detection", per card (Saved.generate_model_card)
    model_card_template=VISION_CARD_TEMPLATE,
):
    """A map of detection scores fitted on matched detections. Subclasses set ``kind`` and implement ``_fit`` and
    ``_map``.

    ``fit`` records in ``fit_info_`` the detection ECE, D-ECE (when the detections carry their box geometry) and LaECE
    before and after the map, on the fit detections and on ``held_out`` ones where given; the model card reports them.
    Saved, loaded and pushed through the package's one persistence (:class:`hf_calibration._core.persistence.Saved`):
    ``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``, an edited ``config.json`` refused at load.
    """

    needs: ClassVar[tuple[str, ...]] = ()  # what besides the scores the map reads: "labels", "features", "logits"
    paper_citation: ClassVar[str] = ""
    checkpoint_key: ClassVar[str] = "calibrator"
    checkpoint_what: ClassVar[str] = "detection calibrator"
    save_subfolder: ClassVar[str] = "calibrator"
    pipeline_task: ClassVar[str] = "object-detection"

    def __init__(self) -> None:
        super().__init__()
        self.fit_info_: dict[str, Any] | None = None

    # ------------------------------------------------------------------ state (Saved's hooks)
    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ValueError(f"{type(self).__name__} is not fitted: call `fit` (or `from_pretrained`) first.")

    @classmethod
    def _wrong_kind_hint(cls, config: dict) -> str:
        return ". Use hf_calibration.detection.load_detection_calibrator to load any detection calibrator."

    def _card_values(self, values: dict[str, Any]) -> dict[str, Any]:
        info = self.fit_info_ or {}
        out = {
            "title": f"{type(self).__name__} detection calibrator",
            "kind": self.kind,
            "model_kind": "an object detector's scores",
            "method_description": " ".join((type(self).__doc__ or "").split("\n\n")[0].split()),
            "citation": self.paper_citation,
            "fit_rows": (
                f"| fit detections | {info.get('num_detections', 'n/a')} ({info.get('num_true_positives', 'n/a')} true "
                f"positives at IoU >= {info.get('iou_threshold', 'n/a')}) |\n"
                f"| score threshold | {info.get('score_threshold', 'n/a')} |\n"
            ),
            "metric_rows": metric_rows(info, _CARD_METRICS),
            "metric_note": (
                "Measured on the detections scoring at least the score threshold before calibration (the same "
                "detections before and after; D-ECE over confidence, cx, cy, w, h with 5 bins each, detection ECE with "
                "10 bins, LaECE with 25). Numbers on the fit set flatter the calibrator: read the held-out rows."
            ),
            "usage": (
                'detector = hf_calibration.pipeline("object-detection", model="<model repo>")\n'
                "detector(image)  # transformers' output, each `score` calibrated"
            ),
            "format_version": self.format_version,
            "pipeline_task": self.pipeline_task,
        }
        out.update(values)
        return out

    # ------------------------------------------------------------------ fit / map
    def fit(
        self, detections: Detections, *, score_threshold: float = 0.0, held_out: Detections | None = None
    ) -> DetectionCalibrator:
        """Fit on the detections scoring at least ``score_threshold`` (the operating threshold: Kuzucu et al. 2024);
        ``held_out``: matched detections to measure the map on as well (recorded for the model card)."""
        if not isinstance(detections, Detections):
            raise TypeError(f"Expected `detections` from `match_detections`, but got {type(detections).__name__}.")
        if held_out is not None and not isinstance(held_out, Detections):
            raise TypeError(f"Expected `held_out` from `match_detections` or None, but got {type(held_out).__name__}.")
        threshold = _check_threshold(score_threshold, "score_threshold")
        kept = detections.above(threshold)
        if len(kept) < 2 or kept.matched.all() or not kept.matched.any():
            raise ValueError(
                f"Expected detections with both true and false positives above {score_threshold} to fit, but got "
                f"{int(kept.matched.sum())} true of {len(kept)}."
            )
        inputs = self._inputs(kept.scores, kept.labels, kept.features, kept.logits)
        with torch.enable_grad():
            self._fit(inputs, torch.from_numpy(kept.matched.astype(np.float64)))
        self.fit_info_ = {  # set first: the map is usable for the measures below
            "kind": self.kind,
            "num_detections": len(kept),
            "num_true_positives": int(kept.matched.sum()),
            "score_threshold": float(threshold),
            "iou_threshold": float(kept.iou_threshold),
        }
        self.fit_info_["fit_set"] = self._measure(kept)
        if held_out is not None:
            self.fit_info_["held_out"] = self._measure(held_out.above(threshold))
        record = self.fit_info_.get("held_out", self.fit_info_["fit_set"])
        if record["ranking_ap_after"] < record["ranking_ap_before"] - _RANKING_TOLERANCE:
            warnings.warn(
                f"{type(self).__name__} re-ranks the detections: their ranking AP (true positives above false ones, "
                f"class mean) falls from {record['ranking_ap_before']:.4f} to {record['ranking_ap_after']:.4f} on the "
                f"{'held-out' if 'held_out' in self.fit_info_ else 'fit'} detections, which lowers mAP. Rank by the "
                "raw score and read the calibrated one as the confidence, or use DetectionIsotonic, which keeps each "
                "class's order (as Platt does when the scores rank the fit's true positives first).",
                UserWarning,
                stacklevel=2,
            )
        return self

    def _measure(self, kept: Detections) -> dict[str, float]:
        """Detection ECE, D-ECE (with the geometry), LaECE and the ranking AP of ``kept`` before and after the map
        (NaN: no detection)."""
        after = self.calibrate(kept) if len(kept) else kept
        out = {}
        for key, fn in (
            ("detection_ece", detection_ece),
            ("d_ece", d_ece),
            ("laece", laece),
            ("ranking_ap", ranking_ap),
        ):
            if key == "d_ece" and kept.features is None:
                continue
            for when, d in (("before", kept), ("after", after)):
                out[f"{key}_{when}"] = fn(d, score_threshold=0.0) if len(d) else float("nan")
        return out

    def _inputs(self, scores, labels=None, features=None, logits=None) -> dict[str, torch.Tensor]:
        out = {"scores": torch.as_tensor(scores, dtype=torch.float64).reshape(-1)}
        given = {"labels": labels, "features": features, "logits": logits}
        for name in self.needs:
            if given[name] is None:
                raise ValueError(
                    f"Expected `{name}` for {type(self).__name__} (match with image sizes / logits), but got None."
                )
            out[name] = torch.as_tensor(given[name], dtype=torch.int64 if name == "labels" else torch.float64)
            if out[name].shape[0] != out["scores"].shape[0]:
                raise ValueError(
                    f"Expected `{name}` with one row per score ({out['scores'].shape[0]}), but got {out[name].shape[0]}."
                )
        if not torch.isfinite(out["scores"]).all() or (out["scores"] < 0).any() or (out["scores"] > 1).any():
            raise ValueError("Expected `scores` to be finite values in [0, 1].")
        return out

    def forward(self, scores: Any, labels: Any = None, features: Any = None, logits: Any = None) -> torch.Tensor:
        """Calibrated scores (float64) of detections given their ``scores`` and what the map ``needs``."""
        self._check_fitted()
        with torch.no_grad():
            return self._map(self._inputs(scores, labels, features, logits))

    def calibrate(self, detections: Detections) -> Detections:
        """The detections with calibrated scores (matches unchanged)."""
        return detections.with_scores(
            self(detections.scores, detections.labels, detections.features, detections.logits).numpy()
        )

    def _fit(self, inputs: dict[str, torch.Tensor], target: torch.Tensor) -> None:
        raise NotImplementedError

    def _map(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


class DetectionPlatt(DetectionCalibrator):
    """``sigmoid(a * logit(s) + b)``: Platt scaling of the detection score."""

    kind = "detection_platt"
    paper_citation = "Platt 1999; Kuzucu et al., ECCV 2024 (the detection baseline)"

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def _fit(self, inputs, target):
        w = _newton_logistic(_logit(inputs["scores"]).unsqueeze(1), target)
        self.weight.data.fill_(w[0])
        self.bias.data.fill_(w[1])

    def _map(self, inputs):
        return torch.sigmoid(self.weight * _logit(inputs["scores"]) + self.bias)


class BoxLogisticCalibration(DetectionCalibrator):
    """``sigmoid(w . [logit(s), cx, cy, w, h] + b)`` (Küppers et al. 2020, eq. 9), the box geometry as fractions of
    the image; ``features`` picks which of cx, cy, w, h enter."""

    kind = "box_logistic"
    needs = ("features",)
    paper_citation = "Küppers et al., CVPR-W 2020, eq. 9"

    def __init__(self, features: tuple[str, ...] | list[str] = BOX_FEATURES) -> None:
        super().__init__()
        features = tuple(features)
        if any(f not in BOX_FEATURES for f in features) or len(set(features)) != len(features):
            raise ValueError(
                f"Expected argument `features` to be distinct names from {BOX_FEATURES}, but got {features!r}."
            )
        self.columns = [BOX_FEATURES.index(f) for f in features]
        self.weight = nn.Parameter(torch.cat([torch.ones(1), torch.zeros(len(features))]).double())
        self.bias = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def _design(self, inputs):
        return torch.cat([_logit(inputs["scores"]).unsqueeze(1), inputs["features"][:, self.columns]], 1)

    def _fit(self, inputs, target):
        w = _newton_logistic(self._design(inputs), target)
        self.weight.data.copy_(w[:-1])
        self.bias.data.fill_(w[-1])

    def _map(self, inputs):
        return torch.sigmoid(self._design(inputs) @ self.weight + self.bias)


class DetectionTemperatureScaling(DetectionCalibrator):
    """One temperature on a DETR-style head's class logits (N, C): ``softmax(z / T)[label]`` with the last logit
    "no object" (``activation="softmax"``: DETR, YOLOS) or ``sigmoid(z[label] / T)`` (``"sigmoid"``: Deformable DETR,
    RT-DETR). ``labels`` is the class the detection was given. The sigmoid form keeps the order of a class's
    detections; the softmax form does not (one temperature moves each query's mass between its class and "no object"
    by how peaked its logits are), and may cost mAP: ``fit`` warns when the ranking AP falls."""

    kind = "detection_temperature"
    needs = ("labels", "logits")
    paper_citation = "Guo et al., ICML 2017, on a DETR-style head's class logits"

    def __init__(self, activation: Literal["softmax", "sigmoid"] = "softmax") -> None:
        super().__init__()
        if activation not in ("softmax", "sigmoid"):
            raise ValueError(f"Expected argument `activation` to be 'softmax' or 'sigmoid', but got {activation!r}.")
        self.activation = activation
        self.log_temperature = nn.Parameter(torch.zeros((), dtype=torch.float64))

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    def _score_logit(self, inputs):
        z = inputs["logits"] / self.log_temperature.exp()
        label = inputs["labels"].unsqueeze(1)
        if label.max() >= z.shape[1] - (self.activation == "softmax"):
            raise ValueError(
                f"Expected `labels` below the {z.shape[1]} logits' object classes, but got {int(label.max())}."
            )
        if self.activation == "sigmoid":
            return z.gather(1, label).squeeze(1)
        others = z.scatter(1, label, float("-inf")).logsumexp(1)  # logit(softmax_l) = z_l - logsumexp_{j != l} z_j
        return z.gather(1, label).squeeze(1) - others

    def _fit(self, inputs, target):
        _lbfgs([self.log_temperature], lambda: _bce(self._score_logit(inputs), target))

    def _map(self, inputs):
        return torch.sigmoid(self._score_logit(inputs))


class DetectionIsotonic(DetectionCalibrator):
    """A strictly increasing isotonic map of the score, one per predicted class (``num_classes`` of them): centred
    isotonic regression (Oron & Flournoy 2017), the pool-adjacent-violators fit with each pooled block's value placed
    at the block's mean score (the lowest and highest block at the fit's extreme scores) and linear between, so the
    map keeps the order of every two detections of a class inside the fitted score range (a step function would tie
    them, and the evaluation would break the ties in a new order); clipped outside it. A class without fit
    detections keeps its scores. ``max_knots`` bounds the saved knots (thinned evenly beyond it)."""

    kind = "detection_isotonic"
    needs = ("labels",)
    paper_citation = "Oksuz et al., CVPR 2023, Sec. 5; Oron & Flournoy, Stat. Biopharm. Res. 2017 (centred isotonic)"

    def __init__(self, num_classes: int, max_knots: int = 256) -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("max_knots", max_knots)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "num_classes" else 2):
                raise ValueError(f"Expected argument `{name}` to be a positive integer, but got {value!r}.")
        self.num_classes = num_classes
        self.register_buffer(
            "x", torch.linspace(0, 1, max_knots, dtype=torch.float64).repeat(num_classes, 1)
        )  # identity
        self.register_buffer("y", self.x.clone())

    def _fit(self, inputs, target):
        from sklearn.isotonic import IsotonicRegression

        scores, labels = inputs["scores"].numpy(), inputs["labels"].numpy()
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise ValueError(
                f"Expected `labels` in [0, {self.num_classes}), but got {int(labels.min())}..{int(labels.max())}."
            )
        m = self.x.shape[1]
        for c in np.unique(labels):
            keep = labels == c
            x = np.sort(scores[keep])
            fitted = IsotonicRegression(y_min=0.0, y_max=1.0).fit(scores[keep], target.numpy()[keep]).predict(x)
            starts = np.flatnonzero(np.r_[True, np.diff(fitted) != 0])  # the pooled blocks (PAV's level sets)
            xs = np.add.reduceat(x, starts) / np.diff(np.r_[starts, x.size])  # each block's mean score
            xs[0], xs[-1] = x[0], x[-1]  # (one block: a constant map over the fitted range)
            ys = fitted[starts]
            pick = np.unique(np.round(np.linspace(0, xs.size - 1, m)).astype(int))
            xs, ys = xs[pick], ys[pick]
            self.x[c] = torch.from_numpy(np.pad(xs, (0, m - xs.size), mode="edge"))
            self.y[c] = torch.from_numpy(np.pad(ys, (0, m - ys.size), mode="edge"))

    def _map(self, inputs):
        scores, labels = inputs["scores"], inputs["labels"]
        if labels.numel() and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"Expected `labels` in [0, {self.num_classes}).")
        x, y = self.x[labels], self.y[labels]  # (N, m) each detection's class knots
        s = scores.clamp(x[:, 0], x[:, -1]).unsqueeze(1)
        hi = torch.searchsorted(x, s, right=False).clamp(1, x.shape[1] - 1)
        x0, x1, y0, y1 = x.gather(1, hi - 1), x.gather(1, hi), y.gather(1, hi - 1), y.gather(1, hi)
        width = x1 - x0
        t = torch.where(width > 0, (s - x0) / torch.where(width > 0, width, 1), torch.ones_like(s))
        return (y0 + t * (y1 - y0)).squeeze(1)


DETECTION_CALIBRATORS: dict[str, type[DetectionCalibrator]] = {
    cls.kind: cls for cls in (DetectionPlatt, BoxLogisticCalibration, DetectionTemperatureScaling, DetectionIsotonic)
}


def load_detection_calibrator(pretrained_model_name_or_path, **kwargs: Any) -> DetectionCalibrator:
    """Load a saved detection calibrator of any kind (the one its ``config.json`` names), strictly; ``kwargs`` are
    ``from_pretrained``'s (``subfolder``, ``revision``, ``map_location``, ...)."""
    from hf_calibration._core import checkpoints as hub

    folder, config, _ = hub.open_checkpoint(
        pretrained_model_name_or_path,
        kwargs.get("subfolder"),
        dict(kwargs),
        who="Detection calibrators",
        what="detection calibrator",
    )
    kind = config.get("calibrator")
    if kind not in DETECTION_CALIBRATORS:
        raise ValueError(
            f"Expected a detection calibrator checkpoint (calibrator in {sorted(DETECTION_CALIBRATORS)}), but "
            f"{str(folder)!r} holds calibrator={kind!r}."
        )
    return DETECTION_CALIBRATORS[kind].from_pretrained(pretrained_model_name_or_path, **kwargs)
