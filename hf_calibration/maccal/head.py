"""MaC-Cal's masked two-layer bottleneck head and the mask-aware SGD that trains it.

The head is ``Linear(d, h) → ReLU → Linear(h, K)`` (MaC-Cal §4.2, "classifier restructure").
During stage-2 training its two weight matrices are used as ``W ⊙ M`` with a Bernoulli keep-mask
``M`` (retention ρ) redrawn every epoch (MaC-Cal Eqs. 8–9), so masked weights take no part in the
forward pass and get a zero gradient (Eq. 11, "gradient restriction"). At inference no mask is
used: the full weights, deterministic. Biases are never masked.

Plain SGD would still move masked weights through weight decay and through the momentum buffer
filled under earlier masks, so :class:`MaskedSGD` freezes them completely: a masked entry gets no
gradient, no decay and no momentum update, and its momentum buffer is kept as it was until a later
mask keeps it again. :class:`FlatHeadTrainer` runs the same rule without autograd, on one flat
parameter vector (the stage's fast path).

How a model carries the head (its config, saving and loading) is in :mod:`~hf_calibration.maccal.persistence`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from hf_calibration._core.checks import check_float, check_int

__all__ = ["MaskedBottleneckHead", "MaskedSGD", "FlatHeadTrainer"]


class MaskedBottleneckHead(nn.Module):
    """``Linear(in_features, hidden) → ReLU → Linear(hidden, num_labels)`` with optional weight masks.

    While masks are drawn (:meth:`draw_masks`) and the module is in training mode, the forward pass
    uses ``fc.weight ⊙ mask`` (times ``1/ρ`` when ``rescale=True``); otherwise it is an ordinary
    MLP. The masks are not parameters or buffers: they are never saved.
    """

    _is_classifier_head = True  # lets features.find_classifier_head hook the bottleneck's input

    def __init__(self, in_features: int, hidden: int, num_labels: int):
        super().__init__()
        self.in_features = check_int(in_features, "in_features", minimum=1)
        self.hidden = check_int(hidden, "hidden", minimum=1)
        self.out_features = self.num_labels = check_int(num_labels, "num_labels", minimum=2)
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, num_labels)
        self.masks: tuple[torch.Tensor, torch.Tensor] | None = None
        self._factors: tuple[torch.Tensor, torch.Tensor] | None = None
        self.mask_scale = 1.0

    @property
    def masked_weights(self) -> tuple[nn.Parameter, nn.Parameter]:
        return self.fc1.weight, self.fc2.weight

    def draw_masks(self, retention: float, generator: torch.Generator | None = None, rescale: bool = False):
        """Draw fresh Bernoulli keep-masks, ``M ~ Bernoulli(retention)`` per weight entry (MaC-Cal Eq. 8)."""
        retention = check_float(retention, "retention", minimum=0.0, maximum=1.0, min_inclusive=False)
        masks = []
        for weight in self.masked_weights:
            keep = torch.rand(weight.shape, generator=generator, dtype=torch.float32) < retention
            masks.append(keep.to(device=weight.device, dtype=weight.dtype))
        self.masks = tuple(masks)
        self.mask_scale = 1.0 / retention if rescale else 1.0
        # what multiplies the weights in the forward pass: mask · scale, folded once per draw
        self._factors = self.masks if not rescale else tuple(m * self.mask_scale for m in self.masks)
        return self.masks

    @torch.no_grad()
    def init_from_linear(self, linear: nn.Linear) -> None:
        """Start as exactly ``linear``: ``fc1 = [W; −W; …]``, ``fc2 = [I, −I, 0]``, since ``relu(u) − relu(−u) = u``.

        Needs ``hidden >= 2 · num_labels``; the hidden units past the first ``2K`` keep their random ``fc1`` rows and
        start with zero output weights, so they take no part until training moves them.
        """
        k = self.num_labels
        if linear.out_features != k or linear.in_features != self.in_features:
            raise ValueError(
                f"Expected a Linear({self.in_features}, {k}) head to start from, but got "
                f"Linear({linear.in_features}, {linear.out_features})."
            )
        if self.hidden < 2 * k:
            raise ValueError(
                f"Expected `hidden` >= 2 · num_labels = {2 * k} to start from the linear head, but got {self.hidden}."
            )
        weight = linear.weight.detach().to(self.fc1.weight)
        bias = (linear.bias.detach() if linear.bias is not None else torch.zeros(k)).to(self.fc1.bias)
        self.fc1.weight[:k], self.fc1.weight[k : 2 * k] = weight, -weight
        self.fc1.bias[:k], self.fc1.bias[k : 2 * k] = bias, -bias
        eye = torch.eye(k, dtype=self.fc2.weight.dtype, device=self.fc2.weight.device)
        self.fc2.weight.zero_()
        self.fc2.weight[:, :k], self.fc2.weight[:, k : 2 * k] = eye, -eye
        self.fc2.bias.zero_()

    def clear_masks(self) -> None:
        self.masks, self._factors, self.mask_scale = None, None, 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.masks is None or not self.training:
            return self.fc2(self.act(self.fc1(x)))
        f1, f2 = self._factors
        h = self.act(F.linear(x, self.fc1.weight * f1, self.fc1.bias))
        return F.linear(h, self.fc2.weight * f2, self.fc2.bias)

    def spec(self, path: str) -> dict[str, Any]:
        return {"path": path, "in_features": self.in_features, "hidden": self.hidden, "num_labels": self.num_labels}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, hidden={self.hidden}, num_labels={self.num_labels}"


class MaskedSGD(torch.optim.Optimizer):
    """SGD (momentum, L2 weight decay as in ``torch.optim.SGD``) that freezes masked entries.

    ``masks`` maps a parameter to a 0/1 tensor of its shape; call :meth:`set_masks` when masks are
    redrawn. For a masked entry the step is skipped entirely (no gradient, no weight decay, momentum
    buffer left untouched); unmasked entries and unmasked parameters follow ``torch.optim.SGD``
    exactly: ``d = g + wd·w``, ``b ← μ·b + d`` (``b = d`` on the first step), ``w ← w − lr·b``.

    With keep-mask ``M`` (all ones for an unmasked parameter) one step is, per parameter group, ::

        d = g + wd·w;   b ← (μ·M + 1 − M) ⊙ b + M ⊙ d;   w ← w − lr · M ⊙ b

    four multi-tensor kernels per group, the factors ``M`` and ``μ·M + 1 − M`` computed once per mask
    draw. The momentum buffer starts at zero, which gives ``b = d`` (where kept) on the first step.
    :meth:`update` takes the gradients explicitly, for callers that compute them without autograd.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        check_float(lr, "lr", minimum=0.0, min_inclusive=False)
        check_float(momentum, "momentum", minimum=0.0, maximum=1.0, max_inclusive=False)
        check_float(weight_decay, "weight_decay", minimum=0.0)
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
        self._keep: dict[int, torch.Tensor] = {}  # id(param) -> 0/1 mask in the parameter's dtype
        self._plans: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def set_masks(self, masks: dict[nn.Parameter, torch.Tensor] | None) -> None:
        self._keep = {id(p): (m != 0).to(p.dtype) for p, m in (masks or {}).items()}
        self._plans = {}

    def _plan(self, params: list[torch.Tensor], mu: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(M, μ·M + 1 − M)`` per parameter (``M`` = ones where unmasked), cached until the next :meth:`set_masks`."""
        key = (mu, *map(id, params))
        plan = self._plans.get(key)
        if plan is None:
            keeps = [self._keep[id(p)] if id(p) in self._keep else torch.ones_like(p) for p in params]
            plan = self._plans[key] = (keeps, [k * mu + (1 - k) for k in keeps])
        return plan

    @torch.no_grad()
    def step(self, closure=None):
        """One step from ``p.grad``; parameters without a gradient are skipped, as in ``torch.optim.SGD``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.update([[p.grad for p in group["params"]] for group in self.param_groups])
        return loss

    @torch.no_grad()
    def update(self, grads: list[list[torch.Tensor | None]]) -> None:
        """One step from explicit gradients: ``grads[i][j]`` for ``param_groups[i]["params"][j]`` (None: skip it)."""
        for group, group_grads in zip(self.param_groups, grads):
            params = group["params"]
            if any(g is None for g in group_grads):
                params = [p for p, g in zip(params, group_grads) if g is not None]
                group_grads = [g for g in group_grads if g is not None]
                if not params:
                    continue
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            keeps, mu_keeps = self._plan(params, mu)
            d = torch._foreach_add(group_grads, params, alpha=wd) if wd != 0 else group_grads
            if mu != 0:
                bufs = []
                for p in params:
                    state = self.state[p]
                    if state.get("momentum_buffer") is None:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    bufs.append(state["momentum_buffer"])
                torch._foreach_mul_(bufs, mu_keeps)  # μ·b where kept, b where masked
                torch._foreach_addcmul_(bufs, d, keeps)  # + d where kept (no gradient, no decay where masked)
                d = bufs
            torch._foreach_addcmul_(params, d, keeps, value=-lr)  # w ← w − lr · M ⊙ b


class FlatHeadTrainer:
    """Stage-2 training of a :class:`MaskedBottleneckHead` without autograd, on one flat parameter vector.

    The head's four tensors are copied into one vector ``θ = [W₁, W₂, b₁, b₂]`` and trained there
    (written back by :meth:`write_back`); the forward and backward passes of the two-layer MLP are
    written by hand (four matrix products), and the update is :class:`MaskedSGD`'s rule on the whole
    vector at once, with per-entry factors computed once per mask draw::

        d = g + λ ⊙ θ;   b ← (μ·M + 1 − M) ⊙ b + M ⊙ d;   θ ← θ − lr · M ⊙ b

    with ``M`` the keep-mask (ones on the biases) and ``λ`` the weight decay on the weight entries,
    0 on the biases. A small head's step is overhead-bound (~40 tiny kernels through the autograd
    engine and a per-tensor optimizer); this runs 17 (13 elementwise, 5 matrix products with the two
    forward ``addmm``), the same maths up to float rounding. Use it under ``torch.no_grad()``.
    """

    def __init__(self, head: MaskedBottleneckHead, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        if not isinstance(head, MaskedBottleneckHead):
            raise TypeError(f"Expected argument `head` to be a MaskedBottleneckHead, but got {type(head).__name__}.")
        self.lr = check_float(lr, "lr", minimum=0.0, min_inclusive=False)
        self.momentum = check_float(momentum, "momentum", minimum=0.0, maximum=1.0, max_inclusive=False)
        weight_decay = check_float(weight_decay, "weight_decay", minimum=0.0)
        self.head = head
        self.params = (head.fc1.weight, head.fc2.weight, head.fc1.bias, head.fc2.bias)
        self.theta = torch.cat([q.detach().reshape(-1) for q in self.params])
        self.grad = torch.zeros_like(self.theta)
        self.buf = torch.zeros_like(self.theta) if self.momentum != 0 else None  # b = d on the first step
        self.n_weights = self.params[0].numel() + self.params[1].numel()
        self.decay = torch.zeros_like(self.theta)
        self.decay[: self.n_weights] = weight_decay
        self.use_decay = weight_decay != 0
        self.theta_views, self.grad_views = self._views(self.theta), self._views(self.grad)
        # views built once (building them costs more than the small kernels that use them)
        self.theta_weights, self.grad_weights = self.theta[: self.n_weights], self.grad[: self.n_weights]
        self.masked = torch.empty_like(self.theta_weights)  # W ⊙ F, refilled by every forward pass
        self._plain_t = tuple(w.t() for w in self.theta_views[:2])
        self._masked_views = self._views(self.masked, 2)
        self._masked_t = tuple(w.t() for w in self._masked_views)
        self._b1, self._b2 = self.theta_views[2:]
        self.set_masks(None)

    def _views(self, flat: torch.Tensor, count: int = 4) -> list[torch.Tensor]:
        out, start = [], 0
        for q in self.params[:count]:
            out.append(flat[start : start + q.numel()].view(q.shape))
            start += q.numel()
        return out

    def set_masks(self, masks: tuple[torch.Tensor, torch.Tensor] | None, scale: float = 1.0) -> None:
        """Keep-masks ``(M₁, M₂)`` of the two weights (None: nothing masked); ``scale`` multiplies the kept weights (1/ρ)."""
        if masks is None:
            self.keep = self.mu_keep = self.factor = None
            self._grad_factors = {}
            return
        keep = torch.ones_like(self.theta)
        for view, m in zip(self._views(keep, 2), masks):
            view.copy_(m != 0)
        self.keep = keep
        self.mu_keep = keep * self.momentum + (1 - keep)  # μ where kept (exactly), 1 where masked
        self.factor = keep[: self.n_weights] * scale  # W_e = W ⊙ F in the forward pass
        self._grad_factors = {}  # grad_scale -> (F, 1 on the biases) · grad_scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Masked training forward pass (= ``head(x)`` in training mode with the same masks): ``(logits, saved)``."""
        if self.factor is None:
            (w1t, w2t), w2 = self._plain_t, self.theta_views[1]
        else:
            torch.mul(self.theta_weights, self.factor, out=self.masked)
            (w1t, w2t), w2 = self._masked_t, self._masked_views[1]
        h = torch.addmm(self._b1, x, w1t).relu_()
        return torch.addmm(self._b2, h, w2t), (x, h, w2)

    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        """The unmasked head's logits (what inference uses), with the current weights."""
        w1t, w2t = self._plain_t
        return torch.addmm(self._b2, torch.addmm(self._b1, x, w1t).relu_(), w2t)

    def backward(self, saved: tuple, grad_logits: torch.Tensor, grad_scale: float = 1.0) -> torch.Tensor:
        """Fill :attr:`grad` with ``∂L/∂θ`` for ``∂L/∂logits = grad_scale · grad_logits``.

        ``∂L/∂W = (∂L/∂W_e) ⊙ F``: zero where masked (MaC-Cal Eq. 11). ``grad_scale`` (e.g. ``1/n`` of a
        mean loss) is folded into the one multiplication by ``F``, cached per value.
        """
        x, h, w2 = saved
        g1, g2, gb1, gb2 = self.grad_views
        torch.mm(grad_logits.t(), h, out=g2)
        torch.sum(grad_logits, 0, out=gb2)
        gh = torch.ops.aten.threshold_backward(grad_logits.mm(w2), h, 0)  # ReLU' = [h > 0]
        torch.mm(gh.t(), x, out=g1)
        torch.sum(gh, 0, out=gb1)
        if self.factor is not None or grad_scale != 1.0:
            factors = self._grad_factors.get(grad_scale)
            if factors is None:
                factors = torch.full_like(self.grad, grad_scale)
                if self.factor is not None:
                    factors[: self.n_weights] *= self.factor
                self._grad_factors[grad_scale] = factors
            self.grad.mul_(factors)
        return self.grad

    def step(self) -> None:
        """One :class:`MaskedSGD` step on θ from :attr:`grad`."""
        d = torch.addcmul(self.grad, self.theta, self.decay) if self.use_decay else self.grad
        if self.buf is not None:
            if self.keep is None:
                d = self.buf.mul_(self.momentum).add_(d)
            else:
                d = self.buf.mul_(self.mu_keep).addcmul_(d, self.keep)
        if self.keep is None:
            self.theta.add_(d, alpha=-self.lr)
        else:
            self.theta.addcmul_(d, self.keep, value=-self.lr)

    @torch.no_grad()
    def write_back(self) -> None:
        """Copy θ back into the head's parameters."""
        for q, v in zip(self.params, self.theta_views):
            q.copy_(v)
