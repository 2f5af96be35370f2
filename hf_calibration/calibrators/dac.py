"""Density-aware calibration (DAC; Tomani, Waseda, Shen, Cremers and Buettner, "Beyond In-Domain Scenarios: Robust
Density-Aware Calibration", ICML 2023), on top of any post-hoc calibrator (TS, ETS, SMART, ...).

A sample far from the data the model was fitted on deserves less confidence. DAC measures how far: for each layer
``l`` (here the feature the classification head sees, and the logits), the distance ``s_l(x)`` from the L2-normalised
representation of ``x`` to its ``k``-th nearest neighbour among reference samples (Sun, Ming, Zhu and Li, ICML 2022,
whose kNN score DAC uses), divided by its mean on the fit set. The calibrated logits are the base calibrator's
divided by a per-sample temperature (DAC eq. 4, with non-negative weights so that a farther sample is never made more
confident)::

    T(x) = w_0 + sum_l w_l s_l(x),        w = softplus(a) >= 0,        z_cal = base(z) / T(x),

``a`` fitted by NLL (full-batch LBFGS). Every ``T(x) > 0``, so the predicted class never changes. The reference is a
seeded sub-sample of at most ``max_reference`` samples, stored (float16) beside the weights in ``model.safetensors``,
so a calibrator stays a few MB. The neighbours are searched with faiss (``pip install "hf-calibration[density]"``)
when it is installed, else with torch (exact in both cases).

The map needs the features as well as the logits: ``calibrator(logits, features=...)``; ``attach(model)`` captures
them with a forward pre-hook on the model's classification head (:mod:`hf_calibration._core.features`), so
``load_calibrated_model`` and ``hf_calibration.pipeline`` serve it like any calibrator. ONNX export refuses it
(``export_refusal``): a nearest-neighbour search over stored features is not part of the exported graph.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from hf_calibration._core.checks import check_int
from hf_calibration.calibrators._machinery.base import Calibrator
from hf_calibration.calibrators._machinery.fitting.lbfgs import minimize
from hf_calibration.calibrators._machinery.registry import create_calibrator, register_calibrator

__all__ = ["DAC_REFERENCE", "DensityAwareCalibrator", "knn_distance", "logits_and_features"]

DAC_REFERENCE = (
    "C. Tomani, K. Waseda, Y. Shen, D. Cremers, F. Buettner, Beyond In-Domain Scenarios: Robust Density-Aware "
    "Calibration, ICML 2023"
)
_LAYERS = ("features", "logits")


def _normalised(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def knn_distance(queries: torch.Tensor, reference: torch.Tensor, k: int, *, exclude_self: bool = False) -> torch.Tensor:
    """Euclidean distance from each L2-normalised row of ``queries`` to its ``k``-th nearest L2-normalised row of
    ``reference`` (float32; faiss's exact ``IndexFlatL2`` when faiss is installed, else torch). ``exclude_self``:
    ``queries`` are ``reference`` itself, and each row's own match is skipped (leave-one-out)."""
    q, r = _normalised(queries).contiguous(), _normalised(reference).contiguous()
    kk = min(k + int(exclude_self), r.shape[0])
    try:
        import faiss
    except ImportError:
        faiss = None
    if faiss is not None:
        index = faiss.IndexFlatL2(r.shape[1])
        index.add(r.cpu().numpy())
        squared, _ = index.search(q.cpu().numpy(), kk)
        d2 = torch.from_numpy(squared[:, kk - 1])
    else:
        d2 = torch.cdist(q, r).square().topk(kk, dim=1, largest=False).values[:, kk - 1]
    return d2.clamp_min(0).sqrt().to(queries.device)


@torch.no_grad()
def logits_and_features(
    model: nn.Module, pixel_values: Any, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, features)`` of ``model`` (a transformers / timm classifier) on ``pixel_values`` ((N, C, H, W)), the
    features being the classification head's input, as ``attach`` captures them at serving time."""
    from hf_calibration._core.features import capture_features

    model.eval()
    logits, features = [], []
    with capture_features(model) as cap:
        for start in range(0, len(pixel_values), batch_size):
            out = model(pixel_values=torch.as_tensor(pixel_values[start : start + batch_size]))
            logits.append(out.logits if hasattr(out, "logits") else out)
            features.append(cap.pop().reshape(logits[-1].shape[0], -1))
    return torch.cat(logits), torch.cat(features)


@register_calibrator
class DensityAwareCalibrator(Calibrator):
    """DAC (module docstring): a per-sample temperature from kNN distances of features and logits to a stored reference,
    on top of a ``base`` calibrator.

    Args:
        base: the post-hoc calibrator underneath (any registered softmax calibrator kind; ``"ets"`` by default).
        k: which nearest neighbour's distance is the score (Sun et al. 2022's kNN score).
        max_reference: at most this many reference samples are kept (a seeded sub-sample).
        seed: the sub-sample's seed.
        num_reference, feature_dim, num_classes: the stored reference's shape, set by ``fit`` (and read back from a
            checkpoint's config); leave them at 0.
    """

    kind = "dac"
    min_samples = 10
    needs_features: ClassVar[bool] = True  # fit and forward take the head's input features as well as the logits
    export_refusal: ClassVar[str] = (
        "DensityAwareCalibrator searches the nearest stored reference features of every input, which an ONNX graph "
        "does not hold: export the model with its base calibrator (calibrator.base) instead."
    )
    paper_citation = DAC_REFERENCE

    def __init__(
        self,
        base: str = "ets",
        k: int = 10,
        max_reference: int = 2000,
        seed: int = 0,
        num_reference: int = 0,
        feature_dim: int = 0,
        num_classes: int = 0,
    ):
        super().__init__()
        if not isinstance(base, str) or base == self.kind:
            raise ValueError(
                f"Expected argument `base` to be a registered calibrator kind other than 'dac', but got {base!r}."
            )
        self.base = create_calibrator(base)
        if getattr(self.base, "_sigmoid_head", False):
            raise ValueError(f"Expected a softmax calibrator as `base`, but {base!r} calibrates a sigmoid head.")
        self.k = check_int(k, "k", minimum=1)
        self.max_reference = check_int(max_reference, "max_reference", minimum=1)
        self.seed = check_int(seed, "seed", minimum=0)
        m, d, c = (check_int(v, n, minimum=0) for v, n in ((num_reference, "num_reference"), (feature_dim, "feature_dim"), (num_classes, "num_classes")))  # fmt: skip
        self.register_buffer("reference_features", torch.zeros(m, d, dtype=torch.float16))
        self.register_buffer("reference_logits", torch.zeros(m, c, dtype=torch.float16))
        self.register_buffer("score_scale", torch.ones(len(_LAYERS), dtype=torch.float64))
        self.raw_weights = nn.Parameter(torch.zeros(len(_LAYERS) + 1, dtype=torch.float64))
        self.__dict__["_capture"] = None

    # ------------------------------------------------------------------ the map
    def weights(self) -> torch.Tensor:
        """``(w_0, w_features, w_logits)``, all >= 0 (softplus of the fitted parameters)."""
        return nn.functional.softplus(self.raw_weights)

    def scores(self, logits: torch.Tensor, features: torch.Tensor, *, exclude_self: bool = False) -> torch.Tensor:
        """``(N, 2)`` kNN distances of ``features`` and ``logits`` to the reference, divided by their fit-set means."""
        s = torch.stack(
            [
                knn_distance(features, self.reference_features, self.k, exclude_self=exclude_self),
                knn_distance(logits, self.reference_logits, self.k, exclude_self=exclude_self),
            ],
            dim=1,
        )
        return s.double().cpu() / self.score_scale

    def _temperature_of(self, s: torch.Tensor) -> torch.Tensor:
        w = self.weights()
        return w[0] + s @ w[1:] + 1e-3

    def temperature(self, logits: Any, features: Any = None) -> torch.Tensor:
        """The per-sample temperature ``T(x)`` (float64, (N,)) dividing the base calibrator's logits."""
        z = self._check_logits(logits)
        f = self._features_for(z, features)
        with torch.no_grad():
            return self._temperature_of(self.scores(z.detach(), f.detach()))

    def _features_for(self, z: torch.Tensor, features: Any) -> torch.Tensor:
        if features is None:
            capture = self.__dict__.get("_capture")
            features = capture.pop() if capture is not None else None
            if features is None:
                raise ValueError(
                    "Expected argument `features` (the (N, D) input of the model's classification head) beside the "
                    "logits: DensityAwareCalibrator scores each sample by its distance to the stored reference features "
                    "(or attach() it to the model, which captures them)."
                )
        f = torch.as_tensor(features)
        if f.ndim != 2 or f.shape[0] != z.shape[0]:
            raise ValueError(
                f"Expected `features` of shape (N, D) with N = {z.shape[0]} (the logits' rows), but got {tuple(f.shape)}."
            )
        if self.reference_features.shape[1] and f.shape[1] != self.reference_features.shape[1]:
            raise ValueError(
                f"Expected `features` with D = {self.reference_features.shape[1]} columns (the fit's), but got {f.shape[1]}."
            )
        if not bool(torch.isfinite(f).all()):
            raise ValueError("Expected `features` to be finite, but they contain NaN or inf.")
        return f

    def forward(self, logits: Any, from_logits: bool | None = None, features: Any = None) -> torch.Tensor:
        """Calibrated logits: ``base(logits) / T(x)`` (same shape, dtype and device; the argmax is kept)."""
        self._check_fitted()
        z = self._check_logits(logits)
        f = self._features_for(z, features)
        out = self.base(z, from_logits=from_logits)
        with torch.no_grad():
            t = self._temperature_of(self.scores(z.detach(), f.detach()))
        calibrated = out / t.to(device=out.device, dtype=out.dtype)[:, None]
        top = out.argmax(dim=1)
        moved = (calibrated.argmax(dim=1) != top).nonzero()[:, 0]
        if moved.numel():  # rounding merged the top logits: keep the winner strictly on top
            calibrated[moved, top[moved]] = torch.nextafter(calibrated[moved, top[moved]], torch.tensor(math.inf))
        return self._adapted(calibrated)

    def predict_proba(self, logits: Any, from_logits: bool | None = None, features: Any = None) -> torch.Tensor:
        out = self(logits, from_logits=from_logits, features=features)
        return torch.softmax(out.to(torch.float64 if out.dtype == torch.float64 else torch.float32), dim=1)

    def adapt(self, unlabeled_logits: Any, **kwargs: Any) -> Calibrator:
        raise TypeError(
            "DensityAwareCalibrator.adapt() is not supported: its temperature already follows each sample's distance "
            "to the reference; adapt its base calibrator (calibrator.base.adapt) instead."
        )

    def graph_forward(self, logits: torch.Tensor) -> torch.Tensor:
        raise ValueError(self.export_refusal)

    # ------------------------------------------------------------------ fit
    def fit(  # noqa: D417 - the base class documents the shared arguments
        self,
        logits: Any,
        labels: Any = None,
        *,
        features: Any = None,
        reference_features: Any = None,
        reference_logits: Any = None,
        base_fit: tuple[Any, Any] | None = None,
        from_logits: bool | None = True,
        progress_bar: bool = False,
        **unused: Any,
    ) -> DensityAwareCalibrator:
        """Fit on held-out ``(logits, labels)`` with their head-input ``features``; returns ``self``.

        Args:
            logits, labels, features: the fit set ((N, K), (N,), (N, D)).
            reference_features, reference_logits: the reference the distances are measured to (e.g. other held-out or
                training images); None: the fit set itself, each sample's own match left out.
            base_fit: ``(logits, labels)`` to fit the base calibrator on (default: the fit set); a fitted
                calibrator of the base kind is used as it is.
        """
        if unused:
            raise TypeError(f"DensityAwareCalibrator.fit() got unexpected arguments: {sorted(unused)}.")
        z = self._check_logits(logits).double()
        y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        if y.ndim != 1 or y.shape[0] != z.shape[0]:
            raise ValueError(f"Expected `labels` of shape ({z.shape[0]},), but got {tuple(y.shape)}.")
        if z.shape[0] < self.min_samples:
            raise ValueError(f"Expected at least {self.min_samples} labelled samples to fit DensityAwareCalibrator, but got {z.shape[0]}.")  # fmt: skip
        if bool(((y < 0) | (y >= z.shape[1])).any()):
            raise ValueError(f"Expected `labels` in [0, {z.shape[1] - 1}], but got values outside it.")
        f = self._features_for(z, features)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the base fit's own notes on a small fit set
            if isinstance(base_fit, Calibrator):
                if base_fit.kind != self.base.kind:
                    raise ValueError(f"Expected a fitted {self.base.kind!r} calibrator as `base_fit`, but got {base_fit.kind!r}.")  # fmt: skip
                base_fit._check_fitted()
                self.base.load_state_dict(base_fit.state_dict())
                self.base.fit_info_ = dict(base_fit.fit_info_)
            else:
                bz, by = (z, y) if base_fit is None else base_fit
                self.base.fit(bz, by, from_logits=from_logits, progress_bar=False)
        leave_one_out = reference_features is None
        if leave_one_out:
            if reference_logits is not None:
                raise ValueError("Expected `reference_logits` only with `reference_features`.")
            ref_f, ref_z = f, z
        else:
            ref_f, ref_z = torch.as_tensor(reference_features), self._check_logits(reference_logits)
            if ref_f.ndim != 2 or ref_f.shape[1] != f.shape[1] or ref_z.shape != (ref_f.shape[0], z.shape[1]):
                raise ValueError(
                    f"Expected `reference_features` (M, {f.shape[1]}) and `reference_logits` (M, {z.shape[1]}), but got "
                    f"{tuple(ref_f.shape)} and {tuple(ref_z.shape)}."
                )
        if ref_f.shape[0] <= self.k:
            raise ValueError(f"Expected more than k = {self.k} reference samples, but got {ref_f.shape[0]}.")
        # the fit-set scores against the full reference, then the stored sub-sample
        self.reference_features = _normalised(ref_f).to(torch.float16)
        self.reference_logits = _normalised(ref_z).to(torch.float16)
        self.score_scale = torch.ones(len(_LAYERS), dtype=torch.float64)
        s = self.scores(z, f, exclude_self=leave_one_out)
        self.score_scale = s.mean(dim=0).clamp_min(1e-12)
        s = s / self.score_scale
        keep = min(self.max_reference, ref_f.shape[0])
        if keep < ref_f.shape[0]:
            idx = (
                torch.randperm(ref_f.shape[0], generator=torch.Generator().manual_seed(self.seed))[:keep].sort().values
            )
            self.reference_features, self.reference_logits = self.reference_features[idx], self.reference_logits[idx]
        with torch.no_grad():
            base_out = self.base(z, from_logits=from_logits).double()
        nll_before = float(nn.functional.cross_entropy(base_out, y))
        a0 = torch.full((len(_LAYERS) + 1,), -4.0, dtype=torch.float64)
        a0[0] = math.log(math.e - 1)  # T = 1 + small distance terms: start at the base calibrator

        def objective(a: torch.Tensor) -> torch.Tensor:
            w = nn.functional.softplus(a)
            return nn.functional.cross_entropy(base_out / (w[0] + s @ w[1:] + 1e-3)[:, None], y)

        a = minimize(objective, a0, max_iter=200, desc="DAC").x
        with torch.no_grad():
            self.raw_weights.copy_(a)
            t = self._temperature_of(s)
            nll_after = float(nn.functional.cross_entropy(base_out / t[:, None], y))
        m, d, c = int(self.reference_features.shape[0]), int(f.shape[1]), int(z.shape[1])
        self._hub_mixin_config = {
            **(self._hub_mixin_config or {}),
            "num_reference": m,
            "feature_dim": d,
            "num_classes": c,
        }
        w = self.weights().tolist()
        self.fit_info_ = {
            "task": "multiclass",
            "objective": "nll",
            "input": "logits",
            "num_samples": int(z.shape[0]),
            "num_classes": c,
            "reference": DAC_REFERENCE,
            "base": self.base.kind,
            "base_fit": self.base.fit_info_,
            "num_reference": m,
            "reference_is_fit_set": leave_one_out,
            "k": self.k,
            "weights": {"bias": w[0], **dict(zip(_LAYERS, w[1:]))},
            "nll_base": nll_before,
            "nll_after": nll_after,
            "temperature_range": [float(t.min()), float(t.max())],
        }
        return self

    # ------------------------------------------------------------------ serving
    def attach(self, model: Any) -> Any:
        """``Calibrator.attach``, plus a forward pre-hook on the model's classification head that hands its input
        (the features) to the calibrated forward."""
        from hf_calibration._core.features import FeatureCapture
        from hf_calibration.calibrators.attach import _module_of

        capture = FeatureCapture(_module_of(model))
        out = super().attach(model)
        self.__dict__["_capture"] = capture.attach()
        return out

    def detach(self) -> nn.Module:
        capture = self.__dict__.get("_capture")
        model = super().detach()
        if capture is not None:
            capture.remove()
        self.__dict__["_capture"] = None
        return model

    def _card_description(self) -> str:
        w = (self.fit_info_ or {}).get("weights", {})
        return (
            f"Density-aware calibration on top of {self.base.kind}: the {self.base.kind} logits are divided by a "
            f"per-sample temperature T(x) = {w.get('bias', float('nan')):.3f} + {w.get('features', float('nan')):.3f} "
            f"s_features(x) + {w.get('logits', float('nan')):.3f} s_logits(x), where s is the (normalised) distance to the "
            f"{self.k}-th nearest of {int(self.reference_features.shape[0])} stored reference samples."
        )

    @classmethod
    def _from_pretrained(cls, *, config: dict | None = None, **kwargs: Any):  # `config` named: the mixin passes it then
        model = super()._from_pretrained(config=config, **kwargs)
        model.base.fit_info_ = dict(model.fit_info_.get("base_fit") or {})
        model.base.eval()
        return model
