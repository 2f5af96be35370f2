"""FeDLaS: feature-modulated bidirectional label smoothing (Bahavan et al.), with its NCI statistics and BCG gate.

Per-sample smoothing weight (paper Eq. 7)::

    r_i = base · 2·sigmoid(β · ψ_i · γ_i)

* NCI (Eq. 10-12): ``γ_i = (‖sg[f_i]‖₁ - μ) / (σ + 1e-3)`` with ``f_i`` the classifier's input and
  μ, σ exponential moving averages of the batch mean and standard deviation of ``‖f_i‖₁``
  (``μ ← θ·μ_batch + (1-θ)·μ``), updated in training mode only.
* BCG (Eq. 8-9): ``ψ_i = sign(p1 - p0)``, ``(p0, p1) = softmax(G(sg[z_i]))``,
  ``G = Linear(K, K//2) → LeakyReLU(0.01) → Linear(K//2, 2)``; straight-through: the forward
  pass is the sign, the backward pass the identity, so the gate learns through ψ alone. By default the gate
  *ascends* the loss (``gate_update="ascent"``), where the official code descends it: see `FeDLaSLoss`.
* FeDLaS-LS (Eq. 4): ``(1 - r_i)·CE_i + r_i·mean_k(-log p_ik)``, base = α.
  FeDLaS-MbLS: ``(1 - r_i)·CE_i + r_i·mean_k relu(max_j z_ij - z_ik - m)``, base = λ.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from hf_calibration._core.checks import check_choice, check_float, check_int
from hf_calibration.losses._base import CalibrationLoss, _stats_dtype
from hf_calibration.losses._fedlas_fused import FeDLaSFunction
from hf_calibration.losses.cross_entropy import nll_per_sample
from hf_calibration.losses.label_smoothing import label_smoothing_per_sample
from hf_calibration.losses.margin import margin_penalty_per_sample

logger = logging.getLogger(__name__)

NCI_EPS = 1e-3  # σ + 1e-3 in the denominator of γ, as in the official code

_DEFAULTS = {  # variant → (base, β): paper §5, FeDLaS-LS α = 0.05, β = 4; FeDLaS-MbLS λ = 0.1, β = 0.5
    "ls": (0.05, 4.0),
    "mbls": (0.1, 0.5),
}


class StraightThroughSign(torch.autograd.Function):
    """Forward ``+1 if x > 0 else -1`` (paper Eq. 9's sgn, so ψ is never 0); backward the identity."""

    @staticmethod
    def forward(ctx, x):
        out = torch.where(x > 0, 1.0, -1.0)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


class _ReverseGradient(torch.autograd.Function):
    """Forward the identity, backward the negated gradient (what turns the gate's descent into ascent)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return -grad_output


def straight_through_sign(x: torch.Tensor) -> torch.Tensor:
    return StraightThroughSign.apply(x)


class BidirectionalCalibrationGate(nn.Module):
    """BCG gate ψ: ``sign(p1 - p0)`` of a small MLP over detached logits (paper Eq. 9).

    ``seed`` draws the initial weights from a generator of their own (``nn.Linear``'s initialisation);
    ``None`` draws them from torch's global RNG, as ``nn.Linear`` does.
    """

    def __init__(self, num_classes: int, seed: int | None = None):
        super().__init__()
        hidden = max(num_classes // 2, 1)
        self.fc_in = nn.Linear(num_classes, hidden)
        self.fc_out = nn.Linear(hidden, 2)
        if seed is not None:
            self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Re-draw both layers as ``nn.Linear.reset_parameters`` does (Kaiming-uniform weights, uniform biases in
        ±1/√fan_in), from a CPU generator seeded with ``seed``: the same weights on every device and process."""
        generator = torch.Generator().manual_seed(seed)
        for layer in (self.fc_in, self.fc_out):
            weight = torch.empty(layer.weight.shape, dtype=layer.weight.dtype)
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
            bound = 1 / math.sqrt(layer.in_features)
            bias = torch.empty(layer.bias.shape, dtype=layer.bias.dtype).uniform_(-bound, bound, generator=generator)
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)

    def direction(self, logits: torch.Tensor) -> torch.Tensor:
        """``p1 - p0`` of ``softmax(G(sg[z]))``, in [-1, 1] (differentiable w.r.t. the gate, never w.r.t. the logits).

        Computed as ``tanh((o1 - o0) / 2)``, the same function as the difference of the two softmax
        probabilities, in fewer operations.
        """
        x = logits.detach()
        if x.dtype != self.fc_in.weight.dtype:
            x = x.to(self.fc_in.weight.dtype)
        out = self.fc_out(F.leaky_relu(self.fc_in(x), negative_slope=0.01))
        diff = out[:, 1] - out[:, 0]
        if diff.dtype != torch.float64:
            diff = diff.float()
        return torch.tanh(diff * 0.5)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return straight_through_sign(self.direction(logits))


def l1_norms(features: torch.Tensor) -> torch.Tensor:
    """``‖sg[f_i]‖₁`` per sample, in float32 at least (features of any trailing shape are flattened)."""
    f = features.detach() if features.requires_grad else features
    if f.ndim > 2:
        f = f.flatten(1)
    dtype = torch.float64 if f.dtype == torch.float64 else torch.float32
    return torch.linalg.vector_norm(f, ord=1, dim=1, dtype=dtype)


def batch_moments(norms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[Σ n_i, Σ n_i², count]`` over kept samples, in float64: the sufficient statistics reduced across processes."""
    dtype = _stats_dtype(norms.device)
    x = torch.where(mask, norms, 0.0).to(dtype)
    return torch.stack([x, x * x, mask]).sum(dim=1)  # stack promotes the boolean mask to x's dtype


def all_reduce_moments(moments: torch.Tensor) -> torch.Tensor:
    """Sum the moments over processes when torch.distributed runs with more than one process (no-op otherwise)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        moments = moments.clone()
        dist.all_reduce(moments, op=dist.ReduceOp.SUM)
    return moments


def ema_update(
    mean: torch.Tensor, std: torch.Tensor, moments: torch.Tensor, theta: float, thresholds: torch.Tensor | None = None
) -> None:
    """In place: ``μ ← θ·μ_batch + (1-θ)·μ`` and ``σ ← θ·σ_batch + (1-θ)·σ`` (paper Eqs. 11-12).

    σ_batch is the unbiased (Bessel-corrected) standard deviation, like ``torch.std`` in the official
    code. No host synchronisation: a batch with no kept sample leaves both buffers unchanged, a batch
    with one kept sample moves μ only (its σ is undefined).
    """
    total, total_sq, count = moments.unbind()
    batch_mean = total / count
    batch_std = (torch.addcmul(total_sq, total, batch_mean, value=-1) / (count - 1)).clamp_min(0).sqrt()
    old = torch.stack([mean, std]).to(moments.dtype)
    # counts (0 | 1 | >=2) → (keep both | move μ only | move both): compare with [0.5, 1.5]
    if thresholds is None:
        thresholds = torch.tensor([0.5, 1.5], device=moments.device)
    new = torch.where(count > thresholds, old.lerp(torch.stack([batch_mean, batch_std]), theta), old)
    torch._foreach_copy_((mean, std), new.unbind())


def norm_confidence_indicator(norms: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """NCI ``γ_i = (‖f_i‖₁ - μ) / (σ + 1e-3)`` (paper Eq. 10)."""
    return (norms - mean) / (std + NCI_EPS)


def _keep_finite(norms: torch.Tensor, finite: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Non-finite norms replaced by μ, so their γ is 0: r = base, the plain LS / MbLS weight."""
    return torch.where(finite, norms, mean.to(norms.dtype))


class FeDLaSLoss(CalibrationLoss):
    """FeDLaS-LS / FeDLaS-MbLS: label smoothing whose per-sample weight follows the feature norm (NCI) and the BCG gate.

    Needs the classifier's input ``features`` (``hf_calibration.CalibrationTrainer`` captures it; or pass
    ``features=`` yourself). Its gate parameters must be trained by the model's optimizer, and its state
    (gate weights, ``nci_mean``, ``nci_std``) saved with checkpoints.

    Order of operations in training mode, as in the official code: the batch statistics are first
    folded into the EMA, then γ is computed against the updated μ, σ (Eq. 10 uses μ^k, σ^k of
    Eqs. 11-12, which already include batch k). In eval mode the stored statistics are used as they
    are. Samples whose label is ``ignore_index`` take no part in the statistics nor in the loss.
    Under ``torch.distributed`` with more than one process, ``(Σ‖f‖₁, Σ‖f‖₁², count)`` is
    all-reduced before the update so every rank holds identical buffers.

    **The gate's update (a departure from the official code).** The official code trains the gate with the model's
    optimizer on the same loss, so the gate *descends* it. For every sample the model fits,
    ``∂L/∂r_i = mean_k(-log p_ik) - CE_i > 0`` (for MbLS, ``R_i - CE_i``, the same sign on fitted samples): lowering
    the loss means lowering the smoothing, and a descending gate learns ``ψ_i = -sign(γ_i)``, which makes
    ``r_i = 2·base·σ(-β|γ_i|) < base`` on every fitted sample. It is a smoothing-off switch, and nothing in it sees
    over-confidence, which the paper's Eq. 8 says the positive mode exists to mitigate. Measured on CIFAR-10 where
    cross-entropy fits its training set and is over-confident (``benchmarks/training_cifar.py``, seed 0, a small
    ResNet, 8,000 images; validation / test ECE): LS 10.48 / 10.60 %; the official gate with its gradients left
    unclipped, as the official code does, learns towards ψ = -sign(γ) (ψ·sign(γ) -0.16 to -0.19 over the last six
    epochs), cuts the smoothing to 0.83-0.87·α on average and ends at 11.41 / 12.88 %, between LS and cross-entropy;
    clipped together with the model's (``CalibrationTrainer``'s ``max_grad_norm``), the same gate never left its
    initial mode (ψ = +1 for 100 % of the samples in all 12 epochs): 9.82 / 11.09 %. So by default the gate climbs
    the loss instead (``gate_update="ascent"``: the straight-through gradient is negated): on every sample it picks
    the mode whose smoothing the fit resists most, which is more smoothing (``r_i > base``) on samples the model
    fits and less on those whose cross-entropy exceeds the smoothing term (a sample the model gets badly wrong).
    Same run: ψ·sign(γ) rises to +0.11 to +0.20, r ≈ 1.10-1.18·α, 9.27 / 9.91 % (these seed-0 runs:
    ``training_cifar.py --diagnose-fedlas``). Over three seeds (the benchmark, test ECE): FeDLaS-LS 9.84 ± 0.27 %
    against LS 10.54 ± 0.13 % (the descending gate: 12.06 ± 0.85 %), FeDLaS-MbLS 9.95 ± 0.58 % against MbLS
    10.16 ± 0.61 % (10.16 ± 0.84 %), lower on 3 of 3 seeds each. Most of that is the larger average smoothing: plain
    LS at FeDLaS-LS's mean weight (α = 0.0575) gives 10.09 ± 0.44 %, 0.25 points above FeDLaS-LS (lower on 2 of 3
    seeds). Where LS already pushes a model into
    under-confidence (augmented data, a model that does not fit its training set) more smoothing is the wrong
    direction: there FeDLaS-LS 3.22 % against LS 2.49 %, FeDLaS-MbLS 2.03 % against MbLS 1.69 %;
    ``gate_update="descent"`` is the official code's gate.

    With β = 0, r_i = base: FeDLaS-LS is exactly ``LabelSmoothingLoss(base)``; FeDLaS-MbLS is the
    convex combination ``(1 - λ)·CE + λ·R`` of the paper (official code), which differs from
    ``MbLSLoss`` (``CE + λ·R``) by the factor (1 - λ) on CE.

    ``forward`` computes the loss, the gate and its straight-through sign as one autograd node with
    hand-derived gradients (`FeDLaSFunction`): a few dozen tensor operations per step instead of about a
    hundred, which matters where the training step is bound by the host's dispatch rate (a GPU with a
    small model). Its value is bit for bit that of ``per_sample_loss`` (the plain-autograd form, kept as
    the reference and used when ``gate`` is replaced by a module of another class) reduced by the base
    class; the gradients agree to rounding.

    Non-finite features (an fp16 overflow in the backbone) leave the statistics alone: a row whose ``‖f‖₁`` is
    inf or NaN takes no part in the EMA update and gets γ = 0 (r = base, the plain LS / MbLS weight), so the
    other rows' loss and the buffers stay finite. Such rows are counted in ``nonfinite_feature_rows`` and
    reported by one warning (both need ``validate_args``, whose one host synchronisation they share).

    Args:
        num_classes: K, the gate's input size. ``None`` leaves the gate to be built by `set_num_classes`, which
            ``CalibrationTrainer`` calls with ``model.config.num_labels``.
        variant: ``"ls"`` (FeDLaS-LS) or ``"mbls"`` (FeDLaS-MbLS).
        base: α for LS (default 0.05) or λ for MbLS (default 0.1).
        beta: sensitivity β >= 0 (default 4.0 for LS, 0.5 for MbLS; paper: 1.0 for MbLS on CIFAR-100).
        margin: MbLS margin m (default 6.0, the paper's CIFAR value; unused by LS).
        theta: EMA weight θ of the current batch, in (0, 1] (0.95 CIFAR-10, 0.5 CIFAR-100 / Tiny-ImageNet).
        nci_init_mean, nci_init_std: initial μ, σ (official code: 20 and 100).
        gate_update: ``"ascent"`` (default: the gate climbs the loss, see above) or ``"descent"`` (the official code:
            the gate descends the loss with the model).
        seed: draws the gate's initial weights from a generator of their own. ``None`` (default) draws them from
            torch's global RNG, and ``CalibrationTrainer`` re-draws them from ``TrainingArguments.seed`` before
            training (unless the state was loaded or trained since), so one seed gives one run on every process.

    Attributes:
        last_weights, last_psi, last_nci: detached ``r``, ``ψ``, ``γ`` of the last training forward (None before).
        gate_from_global_rng: True while the gate holds the draw from torch's global RNG made at construction
            (no ``seed``, not re-drawn, loaded or trained since).
        nonfinite_feature_rows: how many kept rows had a non-finite feature norm so far.
        sync_statistics: all-reduce the batch moments across processes (default True). The MaC-Cal stage
            turns it off on its copy of the loss: there every process runs the stage on the whole data set.
    """

    requires_features = True
    sync_statistics = True

    def __init__(
        self,
        num_classes: int | None = None,
        variant: str = "ls",
        base: float | None = None,
        beta: float | None = None,
        margin: float = 6.0,
        theta: float = 0.95,
        nci_init_mean: float = 20.0,
        nci_init_std: float = 100.0,
        gate_update: str = "ascent",
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.variant = check_choice(variant, "variant", _DEFAULTS)
        default_base, default_beta = _DEFAULTS[variant]
        self.base = check_float(
            default_base if base is None else base, "base", minimum=0.0, maximum=1.0 if variant == "ls" else None
        )
        self.beta = check_float(default_beta if beta is None else beta, "beta", minimum=0.0)
        self.margin = check_float(margin, "margin", minimum=0.0)
        self.theta = check_float(theta, "theta", minimum=0.0, maximum=1.0, min_inclusive=False)
        nci_init_mean = check_float(nci_init_mean, "nci_init_mean")
        nci_init_std = check_float(nci_init_std, "nci_init_std", minimum=0.0)
        self.gate_update = check_choice(gate_update, "gate_update", ("ascent", "descent"))
        self.seed = None if seed is None else check_int(seed, "seed", minimum=0)
        self.register_buffer("nci_mean", torch.tensor(nci_init_mean, dtype=torch.float32))
        self.register_buffer("nci_std", torch.tensor(nci_init_std, dtype=torch.float32))
        # sample counts above which the EMA moves μ and σ (see ema_update); a buffer so it lives on the device
        self.register_buffer("_count_thresholds", torch.tensor([0.5, 1.5]), persistent=False)
        self.num_classes: int | None = None
        self.gate: BidirectionalCalibrationGate | None = None
        self.gate_from_global_rng = False
        if num_classes is not None:
            self.set_num_classes(num_classes)
        self.nonfinite_feature_rows = 0
        self.last_weights: torch.Tensor | None = None
        self.last_nci: torch.Tensor | None = None
        self._last_positive: torch.Tensor | None = None  # ψ > 0; last_psi is built from it on demand

    def set_num_classes(self, num_classes: int) -> None:
        """Build the gate for K classes (``seed`` or torch's global RNG); a no-op when it is built for K already."""
        num_classes = check_int(num_classes, "num_classes", minimum=2)
        if self.num_classes is not None:
            if num_classes != self.num_classes:
                raise ValueError(
                    f"Expected argument `num_classes` to be the loss's num_classes = {self.num_classes}, "
                    f"but got {num_classes}."
                )
            return
        self.num_classes = num_classes
        self.gate = BidirectionalCalibrationGate(num_classes, self.seed).to(self.nci_mean.device, self.nci_mean.dtype)
        self.gate_from_global_rng = self.seed is None

    def reset_gate(self, seed: int) -> None:
        """Re-draw the gate's weights from ``seed`` (see `BidirectionalCalibrationGate.reset_parameters`)."""
        self._gate().reset_parameters(check_int(seed, "seed", minimum=0))
        self.gate_from_global_rng = False

    def _gate(self) -> BidirectionalCalibrationGate:
        if self.gate is None:
            raise ValueError(
                "FeDLaSLoss has no gate yet: pass `num_classes` (e.g. FeDLaSLoss(num_classes=10)), or train with "
                "`hf_calibration.CalibrationTrainer`, which takes it from `model.config.num_labels`."
            )
        return self.gate

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self.gate_from_global_rng = False  # a loaded gate is kept as it is

    @property
    def last_psi(self) -> torch.Tensor | None:
        """ψ ∈ {-1, +1} of the last training forward (None before)."""
        if self._last_positive is None:
            return None
        dtype = torch.float64 if self._gate().fc_in.weight.dtype == torch.float64 else torch.float32
        return torch.where(self._last_positive, 1.0, -1.0).to(dtype)

    def forward(self, logits, labels, features=None, num_items_in_batch=None):
        """The loss of Eq. 4 in one fused autograd node (`FeDLaSFunction`); same value as the unfused
        ``per_sample_loss`` reduced by the base class, with the gradients of the straight-through gate."""
        if features is None:
            raise ValueError(
                "FeDLaSLoss needs the classifier's input features: train with `hf_calibration.CalibrationTrainer` "
                "(it captures them with a hook on the classification head), or call the loss with `features=`."
            )
        gate = self._gate()
        if type(gate) is not BidirectionalCalibrationGate:  # a replaced gate: the generic autograd path
            return super().forward(logits, labels, features=features, num_items_in_batch=num_items_in_batch)
        batch = self._format(logits, labels, num_items_in_batch)
        features = self._format_features(features, batch.logits.shape[0])
        self._check_logits(batch.logits)
        norms = l1_norms(features)
        finite = torch.isfinite(norms)
        if self._validate(batch, extra=~finite.all() if self.validate_args else None):
            self._count_nonfinite(finite, batch.mask)
        gamma = self._nci(norms, finite, batch.mask)
        loss, weights, positive = FeDLaSFunction.apply(
            batch.logits, gate.fc_in.weight, gate.fc_in.bias, gate.fc_out.weight, gate.fc_out.bias, gamma,
            batch.labels, batch.mask, batch.denom, self.variant, self.base, self.beta, self.margin,
            -1.0 if self.gate_update == "ascent" else 1.0,
        )  # fmt: skip
        if self.training:
            self.gate_from_global_rng = False
            self.last_weights, self._last_positive, self.last_nci = weights, positive, gamma
        return loss

    def _check_logits(self, logits: torch.Tensor) -> None:
        if logits.shape[1] != self.num_classes:
            raise ValueError(
                f"Expected `logits` to have num_classes = {self.num_classes} columns, but got {logits.shape[1]}."
            )
        if self.nci_mean.device != logits.device:
            logger.warning(
                "Moving FeDLaSLoss to %s, the device of the logits; move it with the model to avoid this.",
                logits.device,
            )
            self.to(logits.device)

    def _count_nonfinite(self, finite: torch.Tensor, mask: torch.Tensor) -> None:
        """Count the kept rows whose feature norm is not finite; warn the first time (host side, rare path)."""
        rows = int((~finite & mask).sum())
        if rows == 0:
            return
        if self.nonfinite_feature_rows == 0:
            logger.warning(
                "FeDLaSLoss got %d row(s) with non-finite features (inf/NaN, e.g. an fp16 overflow in the backbone): "
                "they are left out of the NCI statistics and get γ = 0. `nonfinite_feature_rows` counts them; "
                "this warning is shown once.",
                rows,
            )
        self.nonfinite_feature_rows += rows

    def _nci(self, norms: torch.Tensor, finite: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """γ (Eq. 10), after folding this batch's finite rows into the EMA statistics when training (Eqs. 11-12)."""
        if self.training:
            with torch.no_grad():
                moments = batch_moments(norms, mask & finite)
                if self.sync_statistics:
                    moments = all_reduce_moments(moments)
                ema_update(self.nci_mean, self.nci_std, moments, self.theta, self._count_thresholds)
        # no gradient: built from detached inputs
        return norm_confidence_indicator(_keep_finite(norms, finite, self.nci_mean), self.nci_mean, self.nci_std)

    def smoothing_weights(self, logits: torch.Tensor, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``r_i = base · 2σ(β·ψ_i·γ_i)`` (Eq. 7) with autograd through the gate; updates the NCI statistics first when training."""
        gate = self._gate()
        self._check_logits(logits)
        norms = l1_norms(features)
        finite = torch.isfinite(norms)
        if self.validate_args and not bool(finite.all()):
            self._count_nonfinite(finite, mask)
        gamma = self._nci(norms, finite, mask)
        psi = gate(logits)
        if self.gate_update == "ascent":
            psi = _ReverseGradient.apply(psi)
        # 2·base·σ(x) as σ(x)·(2·base): exact at β = 0 (σ(0) = 1/2 and doubling is exact in binary)
        weights = torch.sigmoid(psi * gamma * self.beta) * (2 * self.base)
        if weights.dtype != logits.dtype:
            weights = weights.to(logits.dtype)
        if self.training:
            self.gate_from_global_rng = False
            self.last_weights, self._last_positive, self.last_nci = weights.detach(), psi.detach() > 0, gamma
        return weights

    def per_sample_loss(self, logits, labels, mask, features):
        """Unfused reference of what `forward` computes in one node (plain autograd through the gate)."""
        weights = self.smoothing_weights(logits, features, mask)
        log_probs = F.log_softmax(logits, dim=-1)
        if self.variant == "ls":
            return label_smoothing_per_sample(log_probs, labels, weights)
        return (1 - weights) * nll_per_sample(log_probs, labels) + weights * margin_penalty_per_sample(
            logits, self.margin
        )

    def _hparams(self):
        hp = {"num_classes": self.num_classes, "variant": self.variant, "base": self.base, "beta": self.beta}
        if self.variant == "mbls":
            hp["margin"] = self.margin
        hp["theta"] = self.theta
        hp["gate_update"] = self.gate_update
        return hp


class FeDLaSLSLoss(FeDLaSLoss):
    """``FeDLaSLoss(variant="ls")`` as a class of its own (``LOSS_MAPPING["fedlas_ls"]``)."""

    def __init__(self, num_classes: int | None = None, **kwargs):
        if "variant" in kwargs:
            raise TypeError("FeDLaSLSLoss fixes `variant='ls'`; use FeDLaSLoss to choose it.")
        super().__init__(num_classes, variant="ls", **kwargs)


class FeDLaSMbLSLoss(FeDLaSLoss):
    """``FeDLaSLoss(variant="mbls")`` as a class of its own (``LOSS_MAPPING["fedlas_mbls"]``)."""

    def __init__(self, num_classes: int | None = None, **kwargs):
        if "variant" in kwargs:
            raise TypeError("FeDLaSMbLSLoss fixes `variant='mbls'`; use FeDLaSLoss to choose it.")
        super().__init__(num_classes, variant="mbls", **kwargs)
